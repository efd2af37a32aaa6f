"""rocmfix's own state is untrusted input too, and a failing disk loses nothing.

Each case is built in a temporary environment with real released files; the bytes of the
whole environment and of a victim folder beside it are compared before and after. The I/O
faults come from ``ROCMFIX_UNSAFE_TEST_HOOKS``: ``fail_from`` makes every write from the N-th
on fail with EIO (so a rollback fails too), ``edit_at`` edits the file about to be replaced.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import PYTHONPATH, InstalledEnv, files_under

pytestmark = pytest.mark.network
HOOKS = "ROCMFIX_UNSAFE_TEST_HOOKS"
PATCH = "mineru-tokenizer"
DOCLAYOUT = "doclayout-dilated-conv"


def _hooks(**values: int) -> dict[str, str]:
    return {HOOKS: json.dumps(values)}


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.fixture
def env(mineru_env: Callable[[str], InstalledEnv]) -> InstalledEnv:
    return mineru_env("0.1.13")


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A folder outside every environment that nothing may ever touch."""
    folder = tmp_path / "victim"
    folder.mkdir()
    (folder / "precious.txt").write_text("nobody writes here\n")
    (folder / "notes.md").write_text("nor here\n")
    return folder


def _manifest(env: InstalledEnv) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((env.state / "manifest.json").read_text())
    return doc


# ------------------------------------------------------------------------ failing disks


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
    assert "journal and backups stay" in _one_error_line(failed.stderr)
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
    assert "another program changed it" in _one_error_line(result.stderr)
    assert env.target.read_bytes() == env.original + b"# edited while rocmfix ran\n"
    assert not env.state.exists()
    assert env.status(PATCH)["verdict"] == "changed"


def test_state_that_cannot_be_written_is_one_line(env: InstalledEnv) -> None:
    before = files_under(env.root)
    result = env.cli("apply", env=_hooks(fail_from=1))
    assert result.returncode == 1
    assert "nothing was changed" in _one_error_line(result.stderr)
    assert files_under(env.root) == before


# ------------------------------------------------------------------------ the journal


def _journal(env: InstalledEnv, files: list[dict[str, Any]]) -> None:
    """A journal of an 'interrupted' run, as a tamperer would write it."""
    assert env.cli("apply").returncode == 0
    doc = _manifest(env)
    doc["pending"] = {"op": "apply", "pid": 1, "started_at": "", "files": files}
    (env.state / "manifest.json").write_text(json.dumps(doc))


def test_a_journal_naming_another_file_is_refused(env: InstalledEnv) -> None:
    pip_file = "mineru_vl_utils/__init__.py"
    before = (env.site / pip_file).read_bytes()
    _journal(
        env,
        [{"kind": "file", "distribution": "mineru-vl-utils", "path": pip_file,
          "before": None, "after": "0" * 64}],
    )  # fmt: skip
    status = env.cli("status", "--json")
    assert status.returncode == 0
    assert "no patch declares" in status.json()["state_problem"]
    assert env.cli("status", "--check").returncode == 1
    for command in ("revert", "apply"):
        refused = env.cli(command)
        assert refused.returncode == 1
        assert "no patch declares" in _one_error_line(refused.stderr)
    assert (env.site / pip_file).read_bytes() == before


def test_a_journal_through_a_linked_folder_is_refused(
    doclayout_env: Callable[[str], InstalledEnv], victim: Path
) -> None:
    env = doclayout_env("0.0.4")
    modules = env.target.parent
    assert env.cli("apply", "--only", DOCLAYOUT).returncode == 0
    doc = _manifest(env)
    backup = env.state / "backups" / ("a" * 64)
    backup.write_bytes(b"planted\n")
    # The drop's folder becomes a link to the victim's folder.
    kernels = modules / "g2l_crm_triton.py"
    digest = json.loads((env.state / "manifest.json").read_text())
    moved = modules.parent / "modules-real"
    modules.rename(moved)
    modules.symlink_to(victim)
    doc["pending"] = {
        "op": "apply", "pid": 1, "started_at": "",
        "files": [{"kind": "file", "distribution": "doclayout-yolo",
                   "path": "doclayout_yolo/nn/modules/g2l_crm_triton.py",
                   "before": "a" * 64, "after": None}],
    }  # fmt: skip
    (env.state / "manifest.json").write_text(json.dumps(doc))
    victim_before = files_under(victim)
    refused = env.cli("revert")
    assert refused.returncode == 1
    assert "leads out of the environment" in _one_error_line(refused.stderr)
    assert files_under(victim) == victim_before
    assert not (victim / kernels.name).exists() and digest


def test_a_journal_deleting_a_record_is_refused(env: InstalledEnv) -> None:
    record = next(env.site.glob("mineru_vl_utils-*.dist-info")) / "RECORD"
    before = record.read_bytes()
    rel = record.relative_to(env.site).as_posix()
    _journal(
        env,
        [{"kind": "record", "distribution": "mineru-vl-utils", "path": rel,
          "before": None, "after": "0" * 64}],
    )  # fmt: skip
    refused = env.cli("revert")
    assert refused.returncode == 1
    assert "would delete" in _one_error_line(refused.stderr)
    assert record.read_bytes() == before


# ------------------------------------------------------------------------ links and odd files


def test_a_linked_lock_is_never_opened(env: InstalledEnv, victim: Path) -> None:
    assert env.cli("apply").returncode == 0
    lock = env.state / "lock"
    lock.unlink(missing_ok=True)
    lock.symlink_to(victim / "precious.txt")
    before = files_under(victim)
    refused = env.cli("revert")
    assert refused.returncode == 1
    assert "symbolic link" in _one_error_line(refused.stderr)
    # An apply with nothing to do never needs the lock; one with work refuses the same way.
    assert env.cli("apply").returncode == 0
    env.target.write_bytes(env.original)
    forced = env.cli("apply", "--force")
    assert forced.returncode == 1 and "symbolic link" in _one_error_line(forced.stderr)
    assert files_under(victim) == before


def test_linked_backups_are_never_pruned(env: InstalledEnv, victim: Path) -> None:
    # Nothing applied: a no-op revert must not follow the link and empty the victim.
    state = env.state
    state.mkdir(parents=True)
    (state / "backups").symlink_to(victim)
    before = files_under(victim)
    result = env.cli("revert")
    assert result.returncode in (0, 1)
    assert files_under(victim) == before
    assert env.cli("apply").returncode == 1
    assert files_under(victim) == before


@pytest.mark.parametrize("kind", ["fifo", "zero", "folder", "nested"])
def test_an_odd_manifest_is_one_line(env: InstalledEnv, kind: str) -> None:
    env.state.mkdir(parents=True)
    manifest = env.state / "manifest.json"
    if kind == "fifo":
        os.mkfifo(manifest)
    elif kind == "zero":
        manifest.symlink_to("/dev/zero")
    elif kind == "folder":
        manifest.mkdir()
    else:
        manifest.write_text("[" * 100_000 + "]" * 100_000)
    # status warns and goes on (README); --check fails; apply refuses with one line.
    shown = env.cli("status", timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "rocmfix's state:" in shown.stdout
    assert env.cli("status", "--check", timeout=60).returncode == 1
    result = env.cli("apply", timeout=60)
    assert result.returncode == 1, result.stderr
    _one_error_line(result.stderr)


def test_a_lock_that_is_a_folder_is_one_line(env: InstalledEnv) -> None:
    (env.state / "lock").mkdir(parents=True)
    result = env.cli("apply")
    assert result.returncode == 1
    assert "lock" in _one_error_line(result.stderr)


def test_force_over_a_users_file_at_a_drop_path_is_reverted_to_it(
    doclayout_env: Callable[[str], InstalledEnv],
) -> None:
    env = doclayout_env("0.0.4")
    mine = env.target.parent / "g2l_crm_triton.py"
    mine.write_bytes(b"# my own kernels, not rocmfix's\n")
    refused = env.cli("apply", "--only", DOCLAYOUT)
    assert refused.returncode == 1 and "did not put it there" in refused.stderr
    assert env.cli("apply", "--only", DOCLAYOUT, "--force").returncode == 0
    assert mine.read_bytes() != b"# my own kernels, not rocmfix's\n"
    switched = env.cli("apply", "--only", DOCLAYOUT, "--scheme", "linear")
    assert switched.returncode == 0, switched.stderr
    assert env.cli("revert").returncode == 0
    assert mine.read_bytes() == b"# my own kernels, not rocmfix's\n"
    assert not env.state.exists()


# ------------------------------------------------------------------------ modes, leftovers


def test_modes_follow_the_package_whatever_the_umask(
    doclayout_env: Callable[[str], InstalledEnv],
) -> None:
    env = doclayout_env("0.0.4")
    target_mode = stat.S_IMODE(env.target.stat().st_mode)
    done = subprocess.run(
        ["sh", "-c", 'umask 077 && exec "$@"', "sh", *_cli_argv(env, "apply", "--only", DOCLAYOUT)],
        capture_output=True,
        text=True,
        env=_cli_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    modules = env.target.parent
    for name in ("g2l_crm.py", "g2l_crm_triton.py", "rocmfix_kernel_config.py"):
        assert stat.S_IMODE((modules / name).stat().st_mode) == target_mode, name
    for path in [env.state, *env.state.rglob("*")]:
        # Whoever can read the package can read rocmfix's record of it; not its lock, which
        # whoever can open can hold (tests/test_hostile_files.py).
        if path.name != "lock":
            assert stat.S_IMODE(path.stat().st_mode) & 0o044 == 0o044, path


def _cli_env() -> dict[str, str]:

    return {**os.environ, "PYTHONPATH": PYTHONPATH}


def _cli_argv(env: InstalledEnv, *args: str) -> list[str]:
    import sys

    return [sys.executable, "-m", "rocmfix", *args, "--python", str(env.python)]


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


def test_an_empty_share_folder_the_environment_had_stays(env: InstalledEnv) -> None:
    share = env.root / "share"
    share.mkdir()
    assert env.cli("apply").returncode == 0
    assert env.cli("revert").returncode == 0
    assert share.is_dir() and not any(share.iterdir())


def test_a_run_that_finds_the_lock_held_says_so(env: InstalledEnv) -> None:
    assert env.cli("apply").returncode == 0
    patched = env.target.read_bytes()
    lock = env.state / "lock"
    with lock.open("w") as handle:
        # A pid that is running: one that is not gets its own message (test_hostile_files).
        handle.write(str(os.getpid()))
        handle.flush()
        fcntl.flock(handle, fcntl.LOCK_EX)
        # Another run is mid-way: its half-written files are not someone else's edits.
        env.target.write_bytes(env.original)
        for command in ("apply", "revert"):
            result = env.cli(command)
            assert result.returncode == 1
            assert f"another rocmfix run (pid {os.getpid()})" in _one_error_line(result.stderr)
        env.target.write_bytes(patched)


def test_a_target_with_a_stray_latin1_byte_reads_as_unsupported(env: InstalledEnv) -> None:
    env.target.write_bytes(env.original.replace(b"# ", b"# caf\xe9 ", 1))
    result = env.cli("status", "--json")
    assert result.returncode == 0, result.stderr
    verdicts = {p["id"]: p for p in result.json()["patches"]}
    assert verdicts[PATCH]["verdict"] in ("unsupported", "changed")
