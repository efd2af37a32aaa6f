"""Hostile input: a tampered manifest, links where files should be, a target that no longer
parses, runs racing each other. Each gets one clear error line and a non-zero exit, and
nothing outside the target files and rocmfix's own state is touched."""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import PYTHONPATH, InstalledEnv, files_under

pytestmark = pytest.mark.network
PATCH = "mineru-tokenizer"


@pytest.fixture
def env(mineru_env: Callable[[str], InstalledEnv]) -> InstalledEnv:
    return mineru_env("0.1.13")


@pytest.fixture
def canary(env: InstalledEnv) -> Path:
    """A file beside the environment that nothing may ever touch."""
    path = env.root.parent / "outside" / "canary.txt"
    path.parent.mkdir()
    path.write_text("nobody writes here\n")
    return path


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr
    return lines[0]


def _everything_but_state(env: InstalledEnv) -> dict[str, bytes]:
    return {k: v for k, v in files_under(env.root).items() if not k.startswith("share/")}


def _manifest(env: InstalledEnv) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((env.state / "manifest.json").read_text())
    return doc


def _write_manifest(env: InstalledEnv, doc: Any) -> None:
    (env.state / "manifest.json").write_text(json.dumps(doc))


# ---------------------------------------------------------------------------- the manifest


def _outside_pending(doc: dict[str, Any]) -> None:
    doc["pending"] = {
        "op": "apply",
        "pid": 1,
        "started_at": "",
        "files": [
            {
                "kind": "file",
                "distribution": "mineru-vl-utils",
                "path": "../../../../outside/canary.txt",
                "before": "0" * 64,
                "after": None,
            }
        ],
    }


def _unknown_pending_kind(doc: dict[str, Any]) -> None:
    _outside_pending(doc)
    doc["pending"]["files"][0].update(kind="shell", path="x.py")


def _entry(doc: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = doc["entries"][PATCH]
    return entry


TAMPERING: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "pending file outside the environment": (_outside_pending, "points outside the environment"),
    "pending file of an unknown kind": (_unknown_pending_kind, "pending run record is malformed"),
    "digest that is not a digest": (
        lambda d: _entry(d).__setitem__("patched_sha256", "../../etc/shadow"),
        "is not a sha256 digest",
    ),
    "entries that are not an object": (
        lambda d: d.__setitem__("entries", ["x"]),
        "has malformed entries",
    ),
    "a list instead of an object": (lambda d: [d], "is not a JSON object"),
    "schema of another rocmfix": (lambda d: d.__setitem__("schema", "2"), "has schema '2'"),
}


@pytest.mark.parametrize("case", list(TAMPERING))
def test_tampered_manifest_is_refused(env: InstalledEnv, canary: Path, case: str) -> None:
    edit, message = TAMPERING[case]
    assert env.cli("apply").returncode == 0
    doc = _manifest(env)
    replaced = edit(doc)
    _write_manifest(env, replaced if replaced is not None else doc)
    before = files_under(env.root)
    # status warns and still shows the environment; --check fails (README, issue 32).
    shown = env.cli("status")
    assert shown.returncode == 0, shown.stderr
    assert message in " ".join(shown.stdout.split())
    assert env.cli("status", "--check").returncode == 1
    for command in ("apply", "revert"):
        result = env.cli(command)
        assert result.returncode == 1, (command, result.stderr)
        assert message in _one_error_line(result.stderr), command
    assert files_under(env.root) == before, "a refused run writes nothing, state included"
    assert canary.read_text() == "nobody writes here\n"


def test_wrong_patched_digest_reads_as_changed(env: InstalledEnv) -> None:
    """A manifest whose digest does not match the file: rocmfix does not trust it."""
    assert env.cli("apply").returncode == 0
    patched = env.target.read_bytes()
    doc = _manifest(env)
    _entry(doc)["patched_sha256"] = "e" * 64
    _write_manifest(env, doc)
    assert env.status(PATCH)["verdict"] == "changed"
    refused = env.cli("revert")
    assert refused.returncode == 1
    assert "use --force" in _one_error_line(refused.stderr)
    assert env.target.read_bytes() == patched


def test_wrong_drop_digest_reads_as_changed(
    doclayout_env: Callable[[str], InstalledEnv],
) -> None:
    env = doclayout_env("0.0.4")
    assert env.cli("apply", "--only", "doclayout-yolo").returncode == 0
    doc = _manifest(env)
    doc["entries"]["doclayout-dilated-conv"]["drops"][0]["sha256"] = "d" * 64
    _write_manifest(env, doc)
    before = files_under(env.site)
    status = env.status("doclayout-dilated-conv")
    assert status["verdict"] == "changed"
    assert "changed by someone else" in str(status["reason"])
    refused = env.cli("revert")
    assert refused.returncode == 1
    assert "use --force" in _one_error_line(refused.stderr)
    assert files_under(env.site) == before


def test_corrupt_backup_is_refused(env: InstalledEnv) -> None:
    assert env.cli("apply").returncode == 0
    patched = env.target.read_bytes()
    backup = env.state / "backups" / _entry(_manifest(env))["original_sha256"]
    backup.write_bytes(b"import os\nos.system('echo owned')\n")
    refused = env.cli("revert")
    assert refused.returncode == 1
    assert "is corrupt" in _one_error_line(refused.stderr)
    assert env.target.read_bytes() == patched


def test_manifest_linked_to_a_file_elsewhere(env: InstalledEnv, canary: Path) -> None:
    assert env.cli("apply").returncode == 0
    manifest = env.state / "manifest.json"
    manifest.unlink()
    manifest.symlink_to(canary)
    shown = env.cli("status")
    assert shown.returncode == 0, shown.stderr
    assert "manifest.json is a symbolic link" in " ".join(shown.stdout.split())
    assert env.cli("status", "--check").returncode == 1
    for command in ("apply", "revert"):
        result = env.cli(command)
        assert result.returncode == 1, (command, result.stderr)
        assert "manifest.json is a symbolic link" in _one_error_line(result.stderr)
    assert canary.read_text() == "nobody writes here\n"
    assert manifest.is_symlink()


# ---------------------------------------------------------------------------- the files


def test_symlinked_target_is_left_alone(env: InstalledEnv, canary: Path) -> None:
    real = canary.parent / "client.py"
    real.write_bytes(env.original)
    env.target.unlink()
    env.target.symlink_to(real)
    before = files_under(env.root)
    status = env.status(PATCH)
    assert status["verdict"] == "unsupported"
    assert "symbolic link" in str(status["reason"])
    result = env.cli("apply")
    assert result.returncode == 1
    line = _one_error_line(result.stderr)
    assert "symbolic link" in line and "nothing was changed" in line
    forced = env.cli("apply", "--force")
    assert forced.returncode == 1, "not even --force writes through a link"
    assert files_under(env.root) == before
    assert real.read_bytes() == env.original
    assert env.target.is_symlink()
    assert not env.state.exists()


def test_symlink_where_a_dropped_file_goes(
    doclayout_env: Callable[[str], InstalledEnv], tmp_path: Path
) -> None:
    env = doclayout_env("0.0.4")
    elsewhere = tmp_path / "elsewhere.py"
    elsewhere.write_text("# not rocmfix's\n")
    drop = env.target.parent / "g2l_crm_triton.py"
    drop.symlink_to(elsewhere)
    before = files_under(env.root)
    refused = env.cli("apply", "--only", "doclayout-yolo")
    assert refused.returncode == 1
    assert "is a symbolic link; rocmfix will not write there" in _one_error_line(refused.stderr)
    assert files_under(env.root) == before

    # Not even --force writes through a link or over one: the link is the user's.
    forced = env.cli("apply", "--only", "doclayout-yolo", "--force")
    assert forced.returncode == 1
    assert "symbolic link" in _one_error_line(forced.stderr)
    assert files_under(env.root) == before
    assert drop.is_symlink() and elsewhere.read_text() == "# not rocmfix's\n"


@pytest.mark.parametrize("record", ["pristine", "modified"])
def test_target_that_no_longer_parses(env: InstalledEnv, record: str) -> None:
    # Cut inside the call's parentheses: the rest of the file is lost, as after a full disk.
    broken = env.original[: env.original.index(b"get_lora_tokenizer(") + 19]
    env.target.write_bytes(broken)
    if record == "pristine":
        # As if the package itself shipped a file this Python cannot parse.
        info = next(env.site.glob("mineru_vl_utils-*.dist-info")) / "RECORD"
        lines = info.read_bytes().splitlines(keepends=True)
        digest = base64.urlsafe_b64encode(hashlib.sha256(broken).digest()).rstrip(b"=")
        key = env.target.relative_to(env.site).as_posix().encode() + b","
        info.write_bytes(
            b"".join(
                key + b"sha256=" + digest + b",%d\r\n" % len(broken) if ln.startswith(key) else ln
                for ln in lines
            )
        )
    before = files_under(env.root)
    status = env.status(PATCH)
    assert status["verdict"] == "unsupported"
    assert "does not parse" in str(status["reason"])
    for args in (("apply",), ("apply", "--force")):
        result = env.cli(*args)
        assert result.returncode == 1, result.stderr
        assert "does not parse" in _one_error_line(result.stderr)
    assert files_under(env.root) == before
    assert env.cli("revert").returncode == 0


# ---------------------------------------------------------------------------- races


def _spawn(env: InstalledEnv, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "rocmfix", *args, "--python", str(env.python)],
        env={**os.environ, "PYTHONPATH": PYTHONPATH, "COLUMNS": "200"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd="/",
    )


def test_apply_and_revert_racing(env: InstalledEnv) -> None:
    """apply, revert and status started together, again and again: every run either does
    its work or fails at once on the lock, status always answers, and afterwards the bytes
    are exactly pristine or exactly applied, as status says."""
    pristine = files_under(env.site)
    assert env.cli("apply").returncode == 0
    applied = files_under(env.site)
    for round_ in range(6):
        procs = [
            _spawn(env, *args)
            for args in (("apply",), ("revert",), ("status", "--json"), ("apply",), ("revert",))
        ]
        results = [(p.communicate(timeout=120)[1], p.returncode) for p in procs]
        for index, (err, code) in enumerate(results):
            text = err.decode()
            assert code in (0, 1), (round_, index, code, text)
            if code == 1:
                assert "another rocmfix run" in text, text
        assert results[2][1] == 0, "status never fails because of a concurrent run"
        # Of the four runs that write, at least one got the lock and did its work.
        assert any(results[i][1] == 0 for i in (0, 1, 3, 4)), round_
        now = files_under(env.site)
        doc = env.cli("status", "--json").json()
        verdict = {p["id"]: p["verdict"] for p in doc["patches"]}[PATCH]
        assert doc["pending"] is None
        if now == pristine:
            assert verdict == "applicable", round_
            assert not env.state.exists() or not (env.state / "manifest.json").exists()
        else:
            assert now == applied, round_
            assert verdict == "applied", round_
    assert env.cli("revert").returncode == 0
    assert files_under(env.site) == pristine
    assert not env.state.exists()


def test_finished_run_leaves_a_running_ones_backups_alone(env: InstalledEnv) -> None:
    """A run that holds the lock has written its backups but not yet its journal (the state
    holds backups and no manifest). A revert with nothing to do must not tidy that state
    away under it: no backup deleted, no lock file unlinked."""
    backups = env.state / "backups"
    backups.mkdir(parents=True)
    backup = backups / hashlib.sha256(env.original).hexdigest()
    backup.write_bytes(env.original)
    lock = env.state / "lock"
    with lock.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        inode = os.fstat(handle.fileno()).st_ino
        result = env.cli("revert")
        assert result.returncode in (0, 1), result.stderr
        assert backup.read_bytes() == env.original, "the running apply's backup is gone"
        assert lock.exists() and lock.stat().st_ino == inode, "the held lock was unlinked"
    assert env.cli("revert").returncode == 0
    assert not env.state.exists(), "once nobody holds the lock, revert tidies up"
