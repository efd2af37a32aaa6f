"""The transaction (rocmfix/write/transaction.py), one function at a time, in-process and in
milliseconds: the order of writes, the journal, rollback on a failed write, and recovery
from the journal of an interrupted run; what the CLI tests prove end to end, pinned down
where each promise lives (docs/mutation.md).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rocmfix import fsops
from rocmfix.environment import Distribution, Environment, PythonInfo, TargetFile
from rocmfix.errors import ManifestError, RefusedError, WriteError
from rocmfix.manifest import DroppedFile, Manifest, Pending, PendingFile
from rocmfix.registry import all_patches
from rocmfix.results import ChangeKind, FileChange
from rocmfix.state import StateDir
from rocmfix.write import transaction
from rocmfix.write.plan import Plan

from conftest import file_mode, manifest_entry

pytestmark = pytest.mark.usefixtures("no_hooks")
PATCHES = all_patches()


# -------------------------------------------------------------------- executing a plan


def _change(root: Path, rel: str, before: bytes | None, after: bytes | None,
            kind: ChangeKind = ChangeKind.TARGET) -> FileChange:  # fmt: skip
    return FileChange(kind, "pkg", rel, root / rel, rel, before, after)


@pytest.fixture
def site(tmp_path: Path) -> tuple[Path, StateDir, list[FileChange]]:
    root = tmp_path / "lib" / "site"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_bytes(b"a0")
    (root / "pkg" / "b.py").write_bytes(b"b0")
    (root / "pkg" / "gone.py").write_bytes(b"g0")
    changes = [
        _change(root, "pkg/a.py", b"a0", b"a1"),
        _change(root, "pkg/new.py", None, b"n1", kind=ChangeKind.DROP),
        _change(root, "pkg/b.py", b"b0", b"b1"),
        _change(root, "pkg/gone.py", b"g0", None, kind=ChangeKind.DROP),
    ]
    return root, StateDir(tmp_path / "share" / "rocmfix", prefix=tmp_path), changes


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "pkg").iterdir()) if p.is_file()}


def test_order_puts_drops_around_targets_and_record_last(tmp_path: Path) -> None:
    target = _change(tmp_path, "t.py", b"0", b"1")
    drop = _change(tmp_path, "d.py", None, b"1", kind=ChangeKind.DROP)
    undrop = _change(tmp_path, "u.py", b"1", None, kind=ChangeKind.DROP)
    record = _change(tmp_path, "RECORD", b"0", b"1", kind=ChangeKind.RECORD)
    changes = [record, target, undrop, drop]
    assert transaction._order(changes, reverting=False) == [drop, target, undrop, record]
    assert transaction._order(changes, reverting=True) == [target, undrop, drop, record]


def test_order_on_revert_takes_targets_before_drops_whatever_the_input(tmp_path: Path) -> None:
    drop = _change(tmp_path, "d.py", b"1", None, kind=ChangeKind.DROP)
    target = _change(tmp_path, "t.py", b"1", b"0")
    assert transaction._order([drop, target], reverting=True) == [target, drop]
    new = _change(tmp_path, "n.py", None, b"1", kind=ChangeKind.DROP)
    assert transaction._order([target, new], reverting=False) == [new, target]


def test_execute_writes_everything_and_keeps_the_backups_it_needs(
    site: tuple[Path, StateDir, list[FileChange]],
) -> None:
    root, state, changes = site
    plan = Plan((), tuple(changes), {"p": manifest_entry()})
    transaction.execute(state, Manifest(), plan, "apply")
    assert _files(root) == {"a.py": b"a1", "b.py": b"b1", "new.py": b"n1"}
    manifest = state.load()
    assert manifest.pending is None and set(manifest.entries) == {"p"}
    # Only the backup an entry still needs survives the run.
    assert state.read_backup(fsops.sha256(b"a0")) == b"a0"
    assert sorted(p.name for p in state.backups.iterdir()) == [fsops.sha256(b"a0")]


def test_revert_writes_in_revert_order(
    site: tuple[Path, StateDir, list[FileChange]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _root, state, changes = site
    written: list[str] = []
    real = transaction.write

    def spy(path: Path, *args: Any, **kwargs: Any) -> None:
        written.append(path.name)
        real(path, *args, **kwargs)

    monkeypatch.setattr(transaction, "write", spy)
    transaction.execute(state, Manifest(), Plan((), tuple(changes), {}), "revert")
    assert written == [c.path.name for c in transaction._order(changes, reverting=True)]
    assert written != [c.path.name for c in transaction._order(changes, reverting=False)]


def test_a_failed_write_rolls_back_everything_written(
    site: tuple[Path, StateDir, list[FileChange]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, state, changes = site
    before = _files(root)
    real = fsops.atomic_write

    def failing(path: Path, data: bytes, **kwargs: Any) -> None:
        if path.name == "b.py" and data == b"b1":
            raise OSError(errno.EIO, "Input/output error")
        real(path, data, **kwargs)

    monkeypatch.setattr(fsops, "atomic_write", failing)
    with pytest.raises(WriteError, match="every file is as it was") as caught:
        transaction.execute(state, Manifest(), Plan((), tuple(changes), {}), "apply")
    assert "failed (Input/output error); every file" in caught.value.message
    assert _files(root) == before
    assert state.load().pending is None  # the journal is cleared once all is back


def test_a_failed_rollback_keeps_the_journal_and_the_backups(
    site: tuple[Path, StateDir, list[FileChange]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, state, changes = site
    real = fsops.atomic_write
    written: list[Path] = []

    def dying(path: Path, data: bytes, **kwargs: Any) -> None:
        if path.parent == root / "pkg":
            if written:  # after one file of the package, the disk fails for good
                raise OSError(errno.EIO, "Input/output error")
            written.append(path)
        real(path, data, **kwargs)

    def no_removal(path: Path, **_kwargs: Any) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(fsops, "atomic_write", dying)
    monkeypatch.setattr(fsops, "remove", no_removal)  # undoing the new file fails too
    with pytest.raises(WriteError, match="could not restore") as caught:
        transaction.execute(state, Manifest(), Plan((), tuple(changes), {}), "apply")
    assert "journal and backups stay" in caught.value.message
    pending = state.load().pending
    assert pending is not None and pending.op == "apply"
    assert [f.path for f in pending.files] == [c.rel for c in transaction._order(changes, False)]
    for data in (b"a0", b"b0", b"g0"):
        assert state.read_backup(fsops.sha256(data)) == data
    assert (root / "pkg" / written[0].name).exists()  # the one written is still there


def test_a_journal_that_cannot_be_cleared_after_a_rollback_says_so(
    site: tuple[Path, StateDir, list[FileChange]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, state, changes = site
    real_write, real_save = fsops.atomic_write, state.save
    saves = {"n": 0}

    def failing(path: Path, data: bytes, **kwargs: Any) -> None:
        if path.name == "b.py" and data == b"b1":
            raise OSError(errno.EIO, "Input/output error")
        real_write(path, data, **kwargs)

    def second_save_fails(*args: Any, **kwargs: Any) -> None:
        saves["n"] += 1
        if saves["n"] > 1:
            raise OSError(errno.EIO, "Input/output error")
        real_save(*args, **kwargs)

    monkeypatch.setattr(fsops, "atomic_write", failing)
    monkeypatch.setattr(state, "save", second_save_fails)
    with pytest.raises(WriteError, match="journal could not be cleared") as caught:
        transaction.execute(state, Manifest(), Plan((), tuple(changes), {}), "apply")
    assert "failed (Input/output error)" in caught.value.message
    assert _files(root)["a.py"] == b"a0"


def test_a_file_changed_mid_run_is_named_and_rolled_back(
    site: tuple[Path, StateDir, list[FileChange]],
) -> None:
    root, state, changes = site
    (root / "pkg" / "b.py").write_bytes(b"edited")
    with pytest.raises(WriteError, match="another program changed it"):
        transaction.execute(state, Manifest(), Plan((), tuple(changes), {}), "apply")
    assert _files(root) == {"a.py": b"a0", "b.py": b"edited", "gone.py": b"g0"}


def test_state_that_cannot_be_written_changes_nothing(
    site: tuple[Path, StateDir, list[FileChange]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, state, changes = site
    before = _files(root)

    def no_space(*_args: Any, **_kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(state, "save", no_space)
    with pytest.raises(WriteError, match=r"nothing was changed: .*No space left"):
        transaction.execute(state, Manifest(), Plan((), tuple(changes), {}), "apply")
    assert _files(root) == before


def test_an_unwritable_folder_refuses_the_run_before_anything_is_written(
    site: tuple[Path, StateDir, list[FileChange]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, state, changes = site
    before = _files(root)
    pkg = root / "pkg"
    real = fsops.unwritable_reason
    monkeypatch.setattr(
        fsops, "unwritable_reason",
        lambda d: "is on a read-only file system" if d == pkg else real(d),
    )  # fmt: skip
    with pytest.raises(RefusedError, match=r"nothing was changed: .*read-only"):
        transaction.execute(state, Manifest(), Plan((), tuple(changes), {}), "apply")
    assert _files(root) == before and not state.backups.exists()


def test_write_gives_a_new_file_the_mode_of_the_file_beside_it(
    tmp_path: Path, umask: Callable[[int], None]
) -> None:
    umask(0o077)
    beside = tmp_path / "target.py"
    beside.write_bytes(b"t")
    os.chmod(beside, 0o664)
    transaction.write(tmp_path / "drop.py", b"d", None, like=beside)
    assert file_mode(tmp_path / "drop.py") == 0o664
    os.chmod(tmp_path / "drop.py", 0o640)
    transaction.write(tmp_path / "drop.py", b"e", b"d", like=beside)
    assert file_mode(tmp_path / "drop.py") == 0o640  # an existing file keeps its own
    transaction.write(tmp_path / "drop.py", None, b"e")
    assert not (tmp_path / "drop.py").exists()


def test_write_drops_bytecode_of_python_files_only(tmp_path: Path) -> None:
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    (cache / "RECORD.cpython-311.pyc").write_bytes(b"")
    (cache / "mod.cpython-311.pyc").write_bytes(b"")
    (cache / "notes.cpython-311.pyc").write_bytes(b"")
    transaction.write(tmp_path / "RECORD", b"r", None)
    transaction.write(tmp_path / "notes.txt", b"n", None)
    assert (cache / "RECORD.cpython-311.pyc").exists()
    assert (cache / "notes.cpython-311.pyc").exists()
    transaction.write(tmp_path / "mod.py", b"m", None)
    assert not (cache / "mod.cpython-311.pyc").exists()


def test_journal_kinds_and_digests(tmp_path: Path) -> None:
    changes = [
        _change(tmp_path, "RECORD", b"r0", b"r1", kind=ChangeKind.RECORD),
        _change(tmp_path, "pkg/a.py", b"a0", None),
        _change(tmp_path, "pkg/d.py", None, b"d1", kind=ChangeKind.DROP),
    ]
    journal = transaction._journal("apply", changes)
    assert [f.kind for f in journal.files] == ["record", "file", "file"]
    assert journal.files[1].before == fsops.sha256(b"a0") and journal.files[1].after is None
    assert journal.files[2].before is None and journal.op == "apply"


def test_kept_backups_are_the_originals_and_what_forced_drops_replaced() -> None:
    entry = manifest_entry()
    assert transaction.kept_backups([entry]) == {entry.original_sha256}
    assert transaction.kept_backups([]) == set()


def test_kept_backups_holds_a_digest_both_kinds_need() -> None:
    entry = replace(
        manifest_entry(),
        drops=(DroppedFile("pkg/d.py", "d", replaced=manifest_entry().original_sha256),),
    )
    assert transaction.kept_backups([entry]) == {entry.original_sha256}
    other = replace(manifest_entry(), drops=(DroppedFile("pkg/d.py", "d", replaced="r"),))
    assert transaction.kept_backups([other]) == {other.original_sha256, "r"}


# --------------------------------------------------------- recovering from the journal


DIST = "doclayout-yolo"
TARGET = "doclayout_yolo/nn/modules/g2l_crm.py"
DROP = "doclayout_yolo/nn/modules/g2l_crm_triton.py"


@pytest.fixture
def journal_env(tmp_path: Path) -> tuple[Environment, StateDir, Path]:
    root = tmp_path / "lib" / "site"
    (root / TARGET).parent.mkdir(parents=True)
    (root / TARGET).write_bytes(b"patched")
    (root / DROP).write_bytes(b"kernel")
    info = root / "doclayout_yolo-0.0.4.dist-info"
    info.mkdir()
    (info / "RECORD").write_bytes(b"r1")
    dist = Distribution(
        name=DIST,
        version="0.0.4",
        dist_info=info,
        location=root,
        editable=False,
        editable_url=None,
        installer="pip",
        record=info / "RECORD",
        files={TARGET: TargetFile(TARGET, root / TARGET, root, None)},
    )
    env = Environment(
        python=PythonInfo("python", "3.11", tmp_path, root),
        distributions={DIST: dist},
        installed={},
        versions={},
        torch=None,
        in_process=False,
    )
    state = env.state
    assert state.root == tmp_path / "share" / "rocmfix"
    state.backup(b"original")
    state.backup(b"r0")
    return env, state, root


def _pending(*files: PendingFile) -> Manifest:
    return Manifest(pending=Pending("apply", 1, "then", files))


def _file(path: str, before: bytes | None, after: bytes | None, kind: str = "file") -> PendingFile:
    digest = fsops.sha256
    return PendingFile(kind, DIST, path, digest(before) if before is not None else None,
                       digest(after) if after is not None else None)  # fmt: skip


def test_recover_puts_every_file_back_and_clears_the_journal(
    journal_env: tuple[Environment, StateDir, Path],
) -> None:
    env, state, root = journal_env
    # Read back from disk as the next run reads it: its strings are the JSON decoder's, not
    # the interned literals of this file.
    state.save(
        _pending(
            _file(DROP, None, b"kernel"),
            _file(TARGET, b"original", b"patched"),
            _file("doclayout_yolo-0.0.4.dist-info/RECORD", b"r0", b"r1", kind="record"),
        ),
        "test",
    )
    manifest = state.load()
    recovered, notes = transaction.recover(env, manifest, PATCHES)
    assert (root / TARGET).read_bytes() == b"original"
    assert not (root / DROP).exists()
    assert (root / "doclayout_yolo-0.0.4.dist-info" / "RECORD").read_bytes() == b"r0"
    assert recovered.pending is None and state.load().pending is None
    assert notes[0].startswith("rolled back an interrupted apply")
    assert sum(n.startswith("restored ") for n in notes) == 3
    assert transaction.recover(env, recovered, PATCHES) == (recovered, ())


def _edit(reference: bytes, below: bool) -> bytes:
    """Bytes whose digest sorts below (or above) ``reference``'s: an ordering of digests is
    never a test of their equality, whichever side the edit lands on."""
    n = 0
    while (fsops.sha256(b"edited %d" % n) < fsops.sha256(reference)) != below:
        n += 1
    return b"edited %d" % n


@pytest.mark.parametrize("below", [True, False], ids=["digest-below", "digest-above"])
def test_recover_leaves_what_someone_else_changed_and_skips_what_is_back(
    journal_env: tuple[Environment, StateDir, Path], below: bool
) -> None:
    env, _state, root = journal_env
    edited = _edit(b"patched", below)
    (root / TARGET).write_bytes(edited)
    record = root / "doclayout_yolo-0.0.4.dist-info" / "RECORD"
    manifest = _pending(
        _file("doclayout_yolo-0.0.4.dist-info/RECORD", b"r0", b"r1", kind="record"),
        _file(DROP, b"kernel", b"other"),  # already back: nothing to do
        _file(TARGET, b"original", b"patched"),  # changed since: left alone
    )
    _recovered, notes = transaction.recover(env, manifest, PATCHES)
    assert (root / TARGET).read_bytes() == edited
    assert (root / DROP).read_bytes() == b"kernel"
    changed = [n for n in notes if "changed since the interrupted run" in n]
    assert len(changed) == 1 and TARGET in changed[0]
    # Recovery goes on past both: the RECORD (handled last) is restored.
    assert record.read_bytes() == b"r0"
    assert [n for n in notes if n.startswith("restored")] == [f"restored {record}"]


def test_recover_notes_a_distribution_that_is_gone(
    journal_env: tuple[Environment, StateDir, Path],
) -> None:
    env, _state, root = journal_env
    elsewhere = PendingFile("file", "vllm", "vllm/model_executor/models/qwen2_vl.py", "a", "b")
    manifest = _pending(_file(TARGET, b"original", b"patched"), elsewhere)
    _recovered, notes = transaction.recover(env, manifest, PATCHES)
    assert any("vllm is gone" in n for n in notes)
    assert (root / TARGET).read_bytes() == b"original"  # and the rest is still rolled back


def test_a_failed_recovery_keeps_the_journal(
    journal_env: tuple[Environment, StateDir, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    env, state, _root = journal_env
    manifest = _pending(_file(TARGET, b"original", b"patched"))
    state.save(manifest, "test")

    def dying(*_args: Any, **_kwargs: Any) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(fsops, "atomic_write", dying)
    with pytest.raises(WriteError, match="journal and backups stay"):
        transaction.recover(env, manifest, PATCHES)
    assert state.load().pending is not None


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (_file("pip/__init__.py", b"x", None), "which no patch declares"),
        (_file(TARGET, None, b"patched"), "would delete the target"),
        (_file("pip-24.0.dist-info/RECORD", b"x", b"y", kind="record"), "that is not"),
        (_file("doclayout_yolo-0.0.4.dist-info/RECORD", None, b"y", kind="record"),
         "would delete"),
    ],
    ids=["undeclared", "delete-target", "other-record", "delete-record"],
)  # fmt: skip
def test_a_tampered_journal_is_refused(
    journal_env: tuple[Environment, StateDir, Path], item: PendingFile, message: str
) -> None:
    env, _state, root = journal_env
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    with pytest.raises(ManifestError, match=message):
        transaction.check_pending(env, _pending(item).pending, PATCHES)
    with pytest.raises(ManifestError, match=message):
        transaction.recover(env, _pending(item), PATCHES)
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    other = replace(env, distributions={})
    transaction.check_pending(other, _pending(item).pending, PATCHES)  # nothing of it here


def test_a_journal_path_through_a_linked_folder_is_refused(
    journal_env: tuple[Environment, StateDir, Path], tmp_path: Path
) -> None:
    env, _state, root = journal_env
    outside = tmp_path / "outside"
    outside.mkdir()
    modules = root / "doclayout_yolo/nn/modules"
    for child in modules.iterdir():
        child.unlink()
    modules.rmdir()
    modules.symlink_to(outside)
    with pytest.raises(ManifestError, match="leads out of the environment"):
        transaction.check_pending(env, _pending(_file(DROP, None, b"k")).pending, PATCHES)
    transaction.check_pending(env, None, PATCHES)


def test_a_journal_naming_another_packages_file_or_record_is_refused(
    journal_env: tuple[Environment, StateDir, Path],
) -> None:
    env, _state, _root = journal_env
    for item, message in (
        (_file("vllm/model_executor/models/qwen2_vl.py", b"x", b"y"), "which no patch declares"),
        # Sorts before the real RECORD's path: refused by equality, not by order.
        (_file("a-0.dist-info/RECORD", b"x", b"y", kind="record"), "that is not"),
    ):
        with pytest.raises(ManifestError, match=message):
            transaction.check_pending(env, _pending(item).pending, PATCHES)
    # A path DocLayout-YOLO's patch declares, in a journal entry of another distribution.
    item = replace(_file(TARGET, b"x", b"y"), distribution="vllm")
    with pytest.raises(ManifestError, match="which no patch declares"):
        transaction._pending_path(env.distributions[DIST], item, PATCHES)


def test_recovery_refuses_a_path_that_is_no_longer_a_file(
    journal_env: tuple[Environment, StateDir, Path],
) -> None:
    env, _state, root = journal_env
    (root / DROP).unlink()
    (root / DROP).mkdir()
    with pytest.raises(ManifestError, match=r"cannot roll back: .*not a regular file"):
        transaction.recover(env, _pending(_file(DROP, None, b"kernel")), PATCHES)
