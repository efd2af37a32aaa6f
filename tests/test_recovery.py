"""Runs that did not finish: killed at a write point, interrupted, or on a failing disk. The
next run rolls back from the journal and backups, a rollback that fails keeps them, and the
temporary files of killed runs are removed. The I/O faults come from
``ROCMFIX_UNSAFE_TEST_HOOKS``: ``fail_from`` makes every write from the N-th on fail with
EIO (so a rollback fails too), ``edit_at`` edits the file about to be replaced.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

import faults
from conftest import (
    InstalledEnv,
    files_under,
    one_error_line,
)

pytestmark = pytest.mark.network
HOOKS = "ROCMFIX_UNSAFE_TEST_HOOKS"
PATCH = "mineru-tokenizer"


def _hooks(**values: int) -> dict[str, str]:
    return {HOOKS: json.dumps(values)}


@pytest.mark.parametrize("command", ["apply"])
def test_killed_run_is_recovered_at_every_write_point(env: InstalledEnv, command: str) -> None:
    """The one-file case of tests/test_faults.py (vllm: three targets, a drop, RECORD, killed
    in apply and in revert), for a patch with no scheme and no drop."""
    summary = faults.kill_loop(
        env.cli, site=env.site, state=env.state, command=command, label="mineru-vl-utils"
    )
    print(summary.line())
    assert not summary.problems, summary.problems
    assert summary.points > 3, "the run must have several write points"
    assert summary.recovered == summary.points
    assert summary.bytes_lost == 0


def test_interrupted_run_is_named_by_status(env: InstalledEnv) -> None:
    # Kill right after the journal is written, before the target changes (points 1-2 write
    # the marker of the share folder rocmfix made, 3-4 the backup, 5-6 the journal).
    killed = env.cli("apply", env={"ROCMFIX_UNSAFE_TEST_HOOKS": '{"kill_at": 7}'})
    assert env.target.read_bytes() == env.original
    assert killed.returncode == -9
    status = env.status(PATCH)
    assert status["verdict"] == "interrupted"
    assert "interrupted" in status["reason"]
    finished = env.cli("apply")
    assert finished.returncode == 0, finished.stderr
    assert "rolled back an interrupted apply" in finished.stderr
    assert env.status(PATCH)["verdict"] == "applied"


def test_a_rollback_that_fails_keeps_the_journal_and_backups(
    vllm_env: Callable[..., InstalledEnv],
) -> None:
    env = vllm_env("0.11.0")
    pristine = files_under(env.site)
    # The first write point from which on a failing disk leaves a file the rollback cannot
    # restore: the run must keep its journal and backups.
    for point in range(1, 60):
        failed = env.cli("apply", "--only", "vllm", env=_hooks(fail_from=point))
        assert failed.returncode == 1, failed.stderr
        if "could not restore" in failed.stderr:
            break
        assert env.cli("revert").returncode == 0
        assert files_under(env.site) == pristine
    else:
        raise AssertionError("no write point left a file the rollback could not restore")
    assert "journal and backups stay" in one_error_line(failed.stderr)
    assert (env.state / "manifest.json").exists() and any((env.state / "backups").iterdir())
    statuses = {p["id"]: p["verdict"] for p in env.cli("status", "--json").json()["patches"]}
    assert "interrupted" in statuses.values()
    assert env.cli("status", "--check").returncode == 1
    # The fault is gone: revert finishes the rollback, every byte comes back.
    done = env.cli("revert")
    assert done.returncode == 0, done.stderr
    assert "rolled back" in done.stderr
    assert files_under(env.site) == pristine
    assert not env.state.exists()


def test_a_file_edited_during_the_run_is_not_overwritten(env: InstalledEnv) -> None:
    # Somewhere a write point lands just before the target's replace: the edit made there
    # must survive, and the run roll back.
    for point in range(1, 30):
        result = env.cli("apply", env=_hooks(edit_at=point))
        if result.returncode == 1:
            break
        assert result.returncode == 0, result.stderr
        assert env.cli("revert").returncode == 0
        env.target.write_bytes(env.original)
    else:
        raise AssertionError("no write point was just before the target's replace")
    assert "another program changed it" in one_error_line(result.stderr)
    assert env.target.read_bytes() == env.original + b"# edited while rocmfix ran\n"
    assert not env.state.exists()
    assert env.status(PATCH)["verdict"] == "changed"


def test_state_that_cannot_be_written_is_one_line(env: InstalledEnv) -> None:
    before = files_under(env.root)
    result = env.cli("apply", env=_hooks(fail_from=1))
    assert result.returncode == 1
    assert "nothing was changed" in one_error_line(result.stderr)
    assert files_under(env.root) == before


def test_temporary_files_of_killed_runs_are_removed(env: InstalledEnv) -> None:
    leftovers = [
        env.target.parent / ".rocmfix-abc123.tmp",
        env.target.parent / f".{env.target.name}.rocmfix-def456.tmp",
        env.root / "share" / "rocmfix" / ".rocmfix-ghi789.tmp",
    ]
    for path in leftovers:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    assert env.cli("apply").returncode == 0
    assert env.cli("revert").returncode == 0
    assert [p for p in leftovers if p.exists()] == []
