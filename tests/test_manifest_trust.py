"""rocmfix's own state read as untrusted input: the manifest, the journal of an interrupted
run and the backups, tampered, truncated, linked elsewhere or of an odd file type. Each gets
one clear error line and a non-zero exit (status warns and goes on), and nothing outside the
target files and rocmfix's own state is touched.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import (
    InstalledEnv,
    files_under,
    one_error_line,
)

pytestmark = pytest.mark.network
PATCH = "mineru-tokenizer"
DOCLAYOUT = "doclayout-dilated-conv"


def _manifest(env: InstalledEnv) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((env.state / "manifest.json").read_text())
    return doc


def _write_manifest(env: InstalledEnv, doc: Any) -> None:
    (env.state / "manifest.json").write_text(json.dumps(doc))


def _entry(doc: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = doc["entries"][PATCH]
    return entry


# ------------------------------------------------------------------------ the manifest


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
def test_tampered_manifest_is_refused_by_revert(
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
    assert message in one_error_line(result.stderr)
    assert env.target.read_bytes() == patched
    assert not outside.exists()


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
def test_tampered_manifest_is_refused_by_every_command(
    env: InstalledEnv, canary: Path, case: str
) -> None:
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
        assert message in one_error_line(result.stderr), command
    # apply and revert take the lock before they read the record (issue 43: a second run
    # fails at once), so the lock file names the last run's pid; nothing else may move.
    after = files_under(env.root)
    lock = next(k for k in after if k.endswith("share/rocmfix/lock"))
    assert after[lock].decode().isdigit()
    before.pop(lock, None)
    after.pop(lock)
    assert after == before, "a refused run writes nothing, state included"
    assert canary.read_text() == "nobody writes here\n"


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
        assert "is not valid JSON" in one_error_line(result.stderr)


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
    one_error_line(result.stderr)


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
        assert "manifest.json is a symbolic link" in one_error_line(result.stderr)
    assert canary.read_text() == "nobody writes here\n"
    assert manifest.is_symlink()


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
    assert "use --force" in one_error_line(refused.stderr)
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
    assert "use --force" in one_error_line(refused.stderr)
    assert files_under(env.site) == before


# ------------------------------------------------------------------------- the journal


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
        assert "no patch declares" in one_error_line(refused.stderr)
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
    assert "leads out of the environment" in one_error_line(refused.stderr)
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
    assert "would delete" in one_error_line(refused.stderr)
    assert record.read_bytes() == before


# ------------------------------------------------------------------------- the backups


def test_corrupt_backup_is_refused(env: InstalledEnv) -> None:
    assert env.cli("apply").returncode == 0
    patched = env.target.read_bytes()
    backup = env.state / "backups" / _entry(_manifest(env))["original_sha256"]
    backup.write_bytes(b"import os\nos.system('echo owned')\n")
    refused = env.cli("revert")
    assert refused.returncode == 1
    assert "is corrupt" in one_error_line(refused.stderr)
    assert env.target.read_bytes() == patched


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
