"""Bad input and faults: each gets one clear line, a non-zero exit and no lost byte."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

import faults
from conftest import (
    PYTHONPATH,
    InstalledEnv,
    files_under,
    patch_p1,
    run_cli,
    run_cli_readonly,
)

pytestmark = pytest.mark.network
PATCH = "mineru-tokenizer"
VERSION = "0.1.13"


@pytest.fixture
def env(mineru_env: Callable[[str], InstalledEnv]) -> InstalledEnv:
    return mineru_env(VERSION)


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr
    return lines[0]


def test_readonly_site_packages(env: InstalledEnv) -> None:
    before = files_under(env.root)
    result = run_cli_readonly([env.target.parent], "apply", "--python", str(env.python))
    assert result.returncode == 1, result.stderr
    line = _one_error_line(result.stderr)
    expected = "read-only file system" if os.geteuid() == 0 else "not writable"
    assert expected in line
    assert "nothing was changed" in line
    assert files_under(env.root) == before, "nothing may be half-written"


def test_edit_after_apply_blocks_revert_until_forced(env: InstalledEnv) -> None:
    assert env.cli("apply").returncode == 0
    edited = env.target.read_bytes() + b"# someone else's edit\n"
    env.target.write_bytes(edited)
    assert env.status(PATCH)["verdict"] == "changed"

    refused = env.cli("revert")
    assert refused.returncode == 1
    assert "changed by someone else" in _one_error_line(refused.stderr)
    assert env.target.read_bytes() == edited

    forced = env.cli("revert", "--force")
    assert forced.returncode == 0, forced.stderr
    assert env.target.read_bytes() == env.original
    assert not env.state.exists()


def test_apply_refuses_a_file_modified_since_install(env: InstalledEnv) -> None:
    env.target.write_bytes(env.original.replace(b"import asyncio", b"import asyncio  # local"))
    status = env.status(PATCH)
    assert status["verdict"] == "changed"
    assert status["pristine"] == "modified"
    refused = env.cli("apply")
    assert refused.returncode == 1
    assert "use --force" in _one_error_line(refused.stderr)
    forced = env.cli("apply", "--force")
    assert forced.returncode == 0, forced.stderr
    assert env.status(PATCH)["verdict"] == "applied"
    assert env.cli("revert").returncode == 0
    assert b"# local" in env.target.read_bytes(), "revert restores what was there before"


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


def test_second_run_fails_cleanly_while_the_lock_is_held(env: InstalledEnv) -> None:
    env.state.mkdir(parents=True)
    # A pid that is running: one that is not gets its own message (test_hostile_files).
    pid = os.getpid()
    with (env.state / "lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.write(str(pid))
        handle.flush()
        result = env.cli("apply")
        assert env.status(PATCH)["verdict"] == "applicable"
    assert result.returncode == 1
    assert f"another rocmfix run (pid {pid})" in _one_error_line(result.stderr)
    assert env.target.read_bytes() == env.original


def test_two_applies_racing(env: InstalledEnv) -> None:
    command = [sys.executable, "-m", "rocmfix", "apply", "--python", str(env.python)]
    run_env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    procs = [
        subprocess.Popen(command, env=run_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(3)
    ]
    outcomes = [(p.wait(timeout=120), p.stderr.read().decode()) for p in procs if p.stderr]
    assert {code for code, _ in outcomes} <= {0, 1}, outcomes
    assert any(code == 0 for code, _ in outcomes)
    for code, stderr in outcomes:
        if code == 1:
            assert "another rocmfix run" in stderr
    patched = env.target.read_bytes()
    assert patched.count(b"except AttributeError:") == 1
    assert env.status(PATCH)["verdict"] == "applied"


def test_usage_errors_exit_2(env: InstalledEnv, tmp_path: Path) -> None:
    unknown = env.cli("apply", "--scheme", "nope")
    assert unknown.returncode == 2
    assert "unknown scheme 'nope'" in _one_error_line(unknown.stderr)
    missing = run_cli("status", "--python", str(tmp_path / "no" / "python"))
    assert missing.returncode == 2
    assert "no such file" in _one_error_line(missing.stderr)
    patch = env.cli("status", "--only", "no-such-patch")
    assert patch.returncode == 2
    assert "unknown patch" in _one_error_line(patch.stderr)
    option = run_cli("apply", "--no-such-option")
    assert option.returncode == 2
    assert env.target.read_bytes() == env.original


def test_broken_interpreter_is_a_clear_error(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho broken >&2\nexit 7\n")
    fake.chmod(0o755)
    result = run_cli("status", "--python", str(fake))
    assert result.returncode == 1
    line = _one_error_line(result.stderr)
    assert "does not look like a Python interpreter" in line and "(exit 7): broken" in line


def _tamper(env: InstalledEnv, edit: Callable[[dict[str, object]], None]) -> None:
    path = env.state / "manifest.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda d: d["entries"]["mineru-tokenizer"].__setitem__("file", "../../../etc/passwd"),
            "points outside the environment",
        ),
        (
            lambda d: d["entries"]["mineru-tokenizer"].__setitem__(
                "drops", [{"path": "/etc/cron.d/x", "sha256": "0" * 64}]
            ),
            "points outside the environment",
        ),
        (
            lambda d: d["entries"]["mineru-tokenizer"].__setitem__(
                "file", "mineru_vl_utils/__init__.py"
            ),
            "but that patch targets",
        ),
        (
            lambda d: d["entries"]["mineru-tokenizer"].__setitem__("original_sha256", "f" * 64),
            "backup",
        ),
        (lambda d: d.__setitem__("schema", 99), "schema 99"),
    ],
)
def test_tampered_manifest_is_refused(
    env: InstalledEnv, edit: Callable[[dict[str, object]], None], message: str
) -> None:
    assert env.cli("apply").returncode == 0
    patched = env.target.read_bytes()
    _tamper(env, edit)
    outside = env.root.parent / "etc"
    if message != "backup":  # status does not read backups; revert must refuse
        # status warns and goes on (README); --check fails.
        shown = env.cli("status")
        assert shown.returncode == 0, shown.stderr
        assert message in " ".join((shown.stdout + shown.stderr).split())
        assert env.cli("status", "--check").returncode == 1
    result = env.cli("revert")
    assert result.returncode == 1, result.stderr
    assert message in _one_error_line(result.stderr)
    assert env.target.read_bytes() == patched
    assert not outside.exists()


def test_truncated_manifest_is_refused(env: InstalledEnv) -> None:
    assert env.cli("apply").returncode == 0
    path = env.state / "manifest.json"
    path.write_bytes(path.read_bytes()[:50])
    shown = env.cli("status")
    assert shown.returncode == 0, shown.stderr
    assert "is not valid JSON" in " ".join(shown.stdout.split())
    assert env.cli("status", "--check").returncode == 1
    for command in ("apply", "revert"):
        result = env.cli(command)
        assert result.returncode == 1
        assert "is not valid JSON" in _one_error_line(result.stderr)


def test_dry_run_writes_nothing_and_patch_reproduces_apply(
    env: InstalledEnv, tmp_path: Path
) -> None:
    before = files_under(env.root)
    dry = env.cli("apply", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert files_under(env.root) == before
    assert dry.stdout.startswith("--- a/mineru_vl_utils/vlm_client/vllm_async_engine_client.py")
    assert "would be applied" in dry.stderr
    assert "would be" not in dry.stdout, "summaries go to stderr, the diff alone to stdout"

    copy = tmp_path / "copy"
    shutil.copytree(env.site, copy)
    assert patch_p1(dry.stdout_bytes, copy) == 0
    assert env.cli("apply").returncode == 0
    assert (copy / env.target.relative_to(env.site)).read_bytes() == env.target.read_bytes()


def test_check_exit_codes(env: InstalledEnv) -> None:
    assert env.cli("apply", "--dry-run", "--check").returncode == 1
    assert env.cli("status", "--check").returncode == 1
    assert env.cli("apply").returncode == 0
    settled = env.cli("apply", "--dry-run", "--check")
    assert settled.returncode == 0
    assert settled.stdout == ""
    assert env.cli("status", "--check").returncode == 0


def test_internal_error_points_to_a_log(env: InstalledEnv, tmp_path: Path) -> None:
    program = textwrap.dedent(
        """
        import rocmfix.write
        def boom(*args, **kwargs):
            raise RuntimeError("boom")
        rocmfix.write.status = boom
        from rocmfix.cli import main
        main()
        """
    )
    cache = tmp_path / "cache"
    done = subprocess.run(
        [sys.executable, "-c", program, "status", "--python", str(env.python)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": PYTHONPATH, "XDG_CACHE_HOME": str(cache)},
        check=False,
    )
    assert done.returncode == 3
    assert "internal error: RuntimeError: boom" in done.stderr
    logs = list((cache / "rocmfix" / "logs").glob("rocmfix-*.log"))
    assert len(logs) == 1
    assert str(logs[0]) in done.stderr.replace("\n", "")
    assert "Traceback" in logs[0].read_text()


def test_nothing_to_revert_is_a_friendly_no_op(env: InstalledEnv) -> None:
    result = env.cli("revert")
    assert result.returncode == 0
    assert "Nothing to revert" in result.stderr


def test_no_arguments_shows_status_and_next_step() -> None:
    result = run_cli()
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Environment ") and "not installed" in result.stdout
    # Nothing to patch here: the one next step is pointing rocmfix at MinerU's interpreter.
    assert "hint:" in result.stderr and "--python PATH" in result.stderr
