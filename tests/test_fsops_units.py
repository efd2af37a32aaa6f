"""The file operations and the transaction, one function at a time, in-process and in
milliseconds: what the CLI tests prove end to end, pinned down where each promise lives, so
that a deliberate break of any line (docs/mutation.md) fails a test here first.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rocmfix import fsops
from rocmfix.environment import Distribution, Environment, PythonInfo, TargetFile
from rocmfix.errors import ManifestError, RefusedError, WriteError
from rocmfix.manifest import DroppedFile, Manifest, ManifestEntry, Pending, PendingFile
from rocmfix.registry import all_patches
from rocmfix.results import FileChange
from rocmfix.state import StateDir
from rocmfix.write import transaction
from rocmfix.write.plan import Plan

PATCHES = all_patches()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask() -> Iterator[Callable[[int], None]]:
    old = os.umask(0o022)
    os.umask(old)

    def set_mask(mask: int) -> None:
        os.umask(mask)

    yield set_mask
    os.umask(old)


@pytest.fixture(autouse=True)
def _no_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(fsops.TEST_HOOKS_ENV, raising=False)
    monkeypatch.setattr(fsops, "_write_points", 0)


# ---------------------------------------------------------------------------- reading


def test_read_regular_reads_files_and_refuses_everything_else(tmp_path: Path) -> None:
    assert fsops.read_regular(tmp_path / "missing") is None
    data = os.urandom((1 << 20) + 17)  # more than one read chunk
    (tmp_path / "big").write_bytes(data)
    assert fsops.read_regular(tmp_path / "big") == data
    (tmp_path / "empty").write_bytes(b"")
    assert fsops.read_regular(tmp_path / "empty") == b""
    (tmp_path / "link").symlink_to(tmp_path / "big")
    with pytest.raises(fsops.NotRegularError, match="symbolic link"):
        fsops.read_regular(tmp_path / "link")
    with pytest.raises(fsops.NotRegularError, match="not a regular file"):
        fsops.read_regular(tmp_path)
    os.mkfifo(tmp_path / "fifo")  # nobody writes: a blocking open would hang here
    with pytest.raises(fsops.NotRegularError, match="not a regular file"):
        fsops.read_regular(tmp_path / "fifo")


def test_read_limit_is_inclusive(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 10)
    assert fsops.read_regular(tmp_path / "f", limit=10) == b"x" * 10
    with pytest.raises(fsops.NotRegularError, match="larger than"):
        fsops.read_regular(tmp_path / "f", limit=9)
    assert fsops.READ_LIMIT == 64 << 20


def test_digests(tmp_path: Path) -> None:
    assert fsops.digest_of(tmp_path / "none") is None
    (tmp_path / "f").write_bytes(b"abc")
    assert fsops.digest_of(tmp_path / "f") == fsops.sha256(b"abc")
    assert fsops.sha256(b"abc").startswith("ba7816bf")
    # A wheel RECORD's form: urlsafe base64, no padding.
    assert fsops.record_hash(b"") == "47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"


def test_inside_resolves_links_in_the_folders(tmp_path: Path) -> None:
    root, out = tmp_path / "env", tmp_path / "elsewhere"
    (root / "pkg").mkdir(parents=True)
    out.mkdir()
    assert fsops.inside(root / "pkg" / "f.py", root)
    assert fsops.inside(root / "f.py", root)
    assert not fsops.inside(out / "f.py", root)
    (root / "escape").symlink_to(out)
    assert not fsops.inside(root / "escape" / "f.py", root)


# ---------------------------------------------------------------------------- writing


def test_atomic_write_replaces_with_a_new_inode_and_the_old_mode(
    tmp_path: Path, umask: Callable[[int], None]
) -> None:
    umask(0o077)
    target = tmp_path / "f.py"
    target.write_bytes(b"old")
    os.chmod(target, 0o640)
    twin = tmp_path / "cache-copy"
    os.link(target, twin)  # a uv/conda cache hard link must not be written through
    fsops.atomic_write(target, b"new", like=target.stat(), expect=fsops.sha256(b"old"))
    assert target.read_bytes() == b"new" and twin.read_bytes() == b"old"
    assert _mode(target) == 0o640
    assert list(tmp_path.glob(fsops.temp_glob(target))) == []


def test_atomic_write_checks_what_it_replaces(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"theirs")
    with pytest.raises(fsops.ChangedError) as caught:
        fsops.atomic_write(target, b"ours", expect=fsops.sha256(b"planned"))
    assert caught.value.errno == errno.EEXIST and "another program" in str(caught.value)
    assert target.read_bytes() == b"theirs"
    with pytest.raises(fsops.ChangedError):
        fsops.atomic_write(target, b"ours", expect=None)  # must not exist
    assert list(tmp_path.iterdir()) == [target]  # no temporary file left
    fsops.atomic_write(tmp_path / "new", b"n", expect=None)
    assert (tmp_path / "new").read_bytes() == b"n"
    fsops.atomic_write(target, b"forced")  # UNCHECKED
    assert target.read_bytes() == b"forced"
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(fsops.ChangedError, match="symbolic link"):
        fsops.atomic_write(link, b"x", expect=fsops.sha256(b"forced"))
    assert link.is_symlink()


@pytest.mark.parametrize(("folder", "expected"), [(0o755, 0o644), (0o700, 0o600), (0o751, 0o640)])
def test_new_files_take_their_mode_from_the_folder(
    tmp_path: Path, umask: Callable[[int], None], folder: int, expected: int
) -> None:
    umask(0o077)
    place = tmp_path / "d"
    place.mkdir()
    os.chmod(place, folder)
    assert fsops.file_mode(place) == expected
    fsops.atomic_write(place / "f", b"x")
    assert _mode(place / "f") == expected
    assert fsops.file_mode(tmp_path / "missing") == 0o644


def test_make_dirs_reports_what_it_made_with_the_parents_bits(
    tmp_path: Path, umask: Callable[[int], None]
) -> None:
    umask(0o077)
    os.chmod(tmp_path, 0o751)
    made = fsops.make_dirs(tmp_path / "a" / "b" / "c")
    assert made == [tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"]
    assert _mode(tmp_path / "a") == 0o751 & 0o755
    assert _mode(tmp_path / "a" / "b" / "c") == 0o751 & 0o755
    assert fsops.make_dirs(tmp_path / "a" / "b") == []
    os.chmod(tmp_path / "a", 0o700)
    assert fsops.make_dirs(tmp_path / "a" / "x") == [tmp_path / "a" / "x"]
    assert _mode(tmp_path / "a" / "x") == 0o700


def test_remove_checks_and_tolerates_absence(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"a")
    with pytest.raises(fsops.ChangedError):
        fsops.remove(target, expect=fsops.sha256(b"b"))
    assert target.exists()
    fsops.remove(target, expect=fsops.sha256(b"a"))
    assert not target.exists()
    fsops.remove(target)
    fsops.remove(target, expect=None)


def test_invalidate_pycache_drops_only_that_modules_bytecode(tmp_path: Path) -> None:
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    for name in ("mod.cpython-311.pyc", "mod.cpython-38.opt-1.pyc", "other.cpython-311.pyc"):
        (cache / name).write_bytes(b"")
    fsops.invalidate_pycache(tmp_path / "mod.py")
    assert sorted(p.name for p in cache.iterdir()) == ["other.cpython-311.pyc"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "x.cpython-311.pyc").write_bytes(b"")
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__pycache__").symlink_to(elsewhere)
    fsops.invalidate_pycache(pkg / "x.py")
    assert (elsewhere / "x.cpython-311.pyc").exists()


def test_remove_temp_files_takes_only_its_own_regular_files(tmp_path: Path) -> None:
    ours = [tmp_path / ".f.py.rocmfix-abc.tmp", tmp_path / ".rocmfix-probe.tmp"]
    for path in ours:
        path.write_bytes(b"")
    keep = [tmp_path / "f.py", tmp_path / ".f.py.other.tmp", tmp_path / ".g.rocmfix-x.bak"]
    for path in keep:
        path.write_bytes(b"")
    (tmp_path / ".h.rocmfix-link.tmp").symlink_to(tmp_path / "f.py")
    (tmp_path / ".d.rocmfix-dir.tmp").mkdir()
    assert sorted(fsops.remove_temp_files(tmp_path)) == sorted(ours)
    assert all(p.exists() for p in keep)
    assert (tmp_path / ".h.rocmfix-link.tmp").is_symlink()
    assert (tmp_path / ".d.rocmfix-dir.tmp").is_dir()
    assert fsops.remove_temp_files(tmp_path / "f.py") == []


def test_unwritable_reason(tmp_path: Path) -> None:
    assert fsops.unwritable_reason(tmp_path) is None
    assert list(tmp_path.iterdir()) == []
    assert fsops.unwritable_reason(tmp_path / "missing") == "does not exist"


def test_test_hooks_fail_and_edit_at_their_write_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"a\n")
    monkeypatch.setenv(fsops.TEST_HOOKS_ENV, json.dumps({"edit_at": 1, "fail_from": 3}))
    fsops.write_point(target)  # 1: another program appends a line
    assert target.read_bytes() == b"a\n# edited while rocmfix ran\n"
    fsops.write_point(target)  # 2: nothing
    for _ in range(2):  # 3 and every point after it: EIO
        with pytest.raises(OSError) as caught:
            fsops.write_point(target)
        assert caught.value.errno == errno.EIO
    for raw in ("not json", "[1]", '{"fail_from": true, "kill_at": "1"}'):
        monkeypatch.setenv(fsops.TEST_HOOKS_ENV, raw)
        assert fsops.test_hooks() == {}


# ---------------------------------------------------------------------------- the transaction


def _change(root: Path, rel: str, before: bytes | None, after: bytes | None,
            kind: str = "target") -> FileChange:  # fmt: skip
    return FileChange(kind, "pkg", rel, root / rel, rel, before, after)


def _entry() -> ManifestEntry:
    return ManifestEntry(
        patch="p",
        distribution="pkg",
        version="1",
        file="pkg/a.py",
        scheme=None,
        original_sha256=fsops.sha256(b"a0"),
        patched_sha256=fsops.sha256(b"a1"),
        drops=(),
        record_updated=False,
        applied_at="then",
    )


@pytest.fixture
def site(tmp_path: Path) -> tuple[Path, StateDir, list[FileChange]]:
    root = tmp_path / "lib" / "site"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_bytes(b"a0")
    (root / "pkg" / "b.py").write_bytes(b"b0")
    (root / "pkg" / "gone.py").write_bytes(b"g0")
    changes = [
        _change(root, "pkg/a.py", b"a0", b"a1"),
        _change(root, "pkg/new.py", None, b"n1", kind="drop"),
        _change(root, "pkg/b.py", b"b0", b"b1"),
        _change(root, "pkg/gone.py", b"g0", None, kind="drop"),
    ]
    return root, StateDir(tmp_path / "share" / "rocmfix", prefix=tmp_path), changes


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "pkg").iterdir()) if p.is_file()}


def test_order_puts_drops_around_targets_and_record_last(tmp_path: Path) -> None:
    target = _change(tmp_path, "t.py", b"0", b"1")
    drop = _change(tmp_path, "d.py", None, b"1", kind="drop")
    undrop = _change(tmp_path, "u.py", b"1", None, kind="drop")
    record = _change(tmp_path, "RECORD", b"0", b"1", kind="record")
    changes = [record, target, undrop, drop]
    assert transaction._order(changes, reverting=False) == [drop, target, undrop, record]
    assert transaction._order(changes, reverting=True) == [target, undrop, drop, record]


def test_execute_writes_everything_and_keeps_the_backups_it_needs(
    site: tuple[Path, StateDir, list[FileChange]],
) -> None:
    root, state, changes = site
    plan = Plan((), tuple(changes), {"p": _entry()})
    transaction.execute(state, Manifest(), plan, "apply")
    assert _files(root) == {"a.py": b"a1", "b.py": b"b1", "new.py": b"n1"}
    manifest = state.load()
    assert manifest.pending is None and set(manifest.entries) == {"p"}
    # Only the backup an entry still needs survives the run.
    assert state.read_backup(fsops.sha256(b"a0")) == b"a0"
    assert sorted(p.name for p in state.backups.iterdir()) == [fsops.sha256(b"a0")]


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


def test_write_gives_a_new_file_the_mode_of_the_file_beside_it(
    tmp_path: Path, umask: Callable[[int], None]
) -> None:
    umask(0o077)
    beside = tmp_path / "target.py"
    beside.write_bytes(b"t")
    os.chmod(beside, 0o664)
    transaction.write(tmp_path / "drop.py", b"d", None, like=beside)
    assert _mode(tmp_path / "drop.py") == 0o664
    os.chmod(tmp_path / "drop.py", 0o640)
    transaction.write(tmp_path / "drop.py", b"e", b"d", like=beside)
    assert _mode(tmp_path / "drop.py") == 0o640  # an existing file keeps its own
    transaction.write(tmp_path / "drop.py", None, b"e")
    assert not (tmp_path / "drop.py").exists()


def test_kept_backups_are_the_originals_and_what_forced_drops_replaced() -> None:
    entry = _entry()
    assert transaction.kept_backups([entry]) == {entry.original_sha256}
    assert transaction.kept_backups([]) == set()


# ---------------------------------------------------------------------------- edges


def test_hooks_act_only_at_their_own_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"a\n")
    monkeypatch.setenv(fsops.TEST_HOOKS_ENV, json.dumps({"edit_at": 2}))
    fsops.write_point(target)  # 1: not yet, and no fail_from means no failure at all
    assert target.read_bytes() == b"a\n"
    fsops.write_point(target)  # 2
    fsops.write_point(target)  # 3: once only
    assert target.read_bytes() == b"a\n# edited while rocmfix ran\n"
    monkeypatch.setenv(fsops.TEST_HOOKS_ENV, json.dumps({"fail_from": -1}))
    fsops.write_point(target)  # a point before the first is no point at all
    monkeypatch.setattr(fsops, "_write_points", 0)
    monkeypatch.setenv(fsops.TEST_HOOKS_ENV, json.dumps({"fail_from": 1}))
    with pytest.raises(OSError):
        fsops.write_point(target)  # the very first point fails


def test_other_open_errors_pass_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(NotADirectoryError):  # errno below ELOOP's
        fsops.read_regular(tmp_path / "file" / "child")

    def overflow(*_args: Any, **_kwargs: Any) -> int:
        raise OSError(errno.EOVERFLOW, "Value too large")  # errno above ELOOP's

    monkeypatch.setattr(fsops.os, "open", overflow)
    with pytest.raises(OSError, match="Value too large") as caught:
        fsops.read_regular(tmp_path / "file")
    assert not isinstance(caught.value, fsops.NotRegularError)


def test_the_size_refusal_names_the_limit(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * ((3 << 20) + 1))
    with pytest.raises(fsops.NotRegularError, match=r"larger than 3 MiB"):
        fsops.read_regular(tmp_path / "f", limit=3 << 20)


def test_remove_temp_files_never_enters_a_linked_folder(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / ".f.rocmfix-x.tmp"
    victim.write_bytes(b"someone else's")
    (tmp_path / "link").symlink_to(elsewhere)
    assert fsops.remove_temp_files(tmp_path / "link") == []
    assert victim.exists()


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (errno.EROFS, "is on a read-only file system"),
        (errno.EACCES, "is not writable by this user (owned by "),
        (errno.EDQUOT, "Disk quota exceeded"),
    ],
)
def test_unwritable_reasons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, reason: str
) -> None:
    def refuse(*_args: Any, **_kwargs: Any) -> tuple[int, str]:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fsops.tempfile, "mkstemp", refuse)
    found = fsops.unwritable_reason(tmp_path)
    assert found is not None and found.startswith(reason)


def test_journal_kinds_and_digests(tmp_path: Path) -> None:
    changes = [
        _change(tmp_path, "RECORD", b"r0", b"r1", kind="record"),
        _change(tmp_path, "pkg/a.py", b"a0", None),
        _change(tmp_path, "pkg/d.py", None, b"d1", kind="drop"),
    ]
    journal = transaction._journal("apply", changes)
    assert [f.kind for f in journal.files] == ["record", "file", "file"]
    assert journal.files[1].before == fsops.sha256(b"a0") and journal.files[1].after is None
    assert journal.files[2].before is None and journal.op == "apply"


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


def test_kept_backups_holds_a_digest_both_kinds_need() -> None:
    entry = replace(
        _entry(), drops=(DroppedFile("pkg/d.py", "d", replaced=_entry().original_sha256),)
    )
    assert transaction.kept_backups([entry]) == {entry.original_sha256}
    other = replace(_entry(), drops=(DroppedFile("pkg/d.py", "d", replaced="r"),))
    assert transaction.kept_backups([other]) == {other.original_sha256, "r"}


# ---------------------------------------------------------------------------- the journal


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


def test_inside_takes_folders_not_made_yet_and_refuses_link_loops(tmp_path: Path) -> None:
    root = tmp_path / "env"
    root.mkdir()
    assert fsops.inside(root / "not-yet" / "f.py", root)
    (root / "loop").symlink_to(root / "loop")
    assert not fsops.inside(root / "loop" / "x" / "f.py", root)


def _someone_else() -> int:
    return 4242 if os.geteuid() == 0 else os.getuid()


def test_a_replaced_file_keeps_its_owner_and_a_new_one_takes_the_folders(tmp_path: Path) -> None:
    owner = _someone_else()  # as root, another user; as anyone else, that user themself
    target = tmp_path / "f.py"
    target.write_bytes(b"old")
    with contextlib.suppress(PermissionError):
        os.chown(target, owner, owner)
    fsops.atomic_write(target, b"new", like=target.stat())
    assert target.stat().st_uid == owner
    folder = tmp_path / "theirs"
    folder.mkdir()
    with contextlib.suppress(PermissionError):
        os.chown(folder, owner, owner)
    fsops.atomic_write(folder / "drop.py", b"d")
    made = fsops.make_dirs(folder / "sub")
    assert (folder / "drop.py").stat().st_uid == owner and made[0].stat().st_uid == owner


def test_unwritable_names_an_owner_without_a_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "d"
    folder.mkdir()
    if os.geteuid() == 0:
        os.chown(folder, 54321, 54321)  # no account has this uid

    def refuse(*_args: Any, **_kwargs: Any) -> tuple[int, str]:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(fsops.tempfile, "mkstemp", refuse)
    reason = fsops.unwritable_reason(folder)
    assert reason is not None and reason.endswith(")")
    if os.geteuid() == 0:
        assert reason == "is not writable by this user (owned by 54321)"


def test_make_dirs_goes_on_past_a_folder_another_process_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Path.mkdir

    def racing(self: Path, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        if self.name == "a":  # made by someone else a moment before us
            raise FileExistsError(errno.EEXIST, "File exists", str(self))

    monkeypatch.setattr(Path, "mkdir", racing)
    made = fsops.make_dirs(tmp_path / "a" / "b" / "c")
    assert made == [tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"]


def test_make_dirs_survives_a_folder_it_cannot_chmod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*_args: Any, **_kwargs: Any) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(fsops.os, "chmod", refuse)
    assert fsops.make_dirs(tmp_path / "x" / "y") == [tmp_path / "x", tmp_path / "x" / "y"]


def test_order_on_revert_takes_targets_before_drops_whatever_the_input(tmp_path: Path) -> None:
    drop = _change(tmp_path, "d.py", b"1", None, kind="drop")
    target = _change(tmp_path, "t.py", b"1", b"0")
    assert transaction._order([drop, target], reverting=True) == [target, drop]
    new = _change(tmp_path, "n.py", None, b"1", kind="drop")
    assert transaction._order([target, new], reverting=False) == [new, target]


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


# ---------------------------------------------------------------------------- the lock helper


def test_held_lock_follows_a_lock_file_its_holder_removed(tmp_path: Path) -> None:
    """A run that opened the lock file just before its holder removed it (the state's tidy)
    ends up holding the file that is at the path, not the removed one."""
    lock = tmp_path / "lock"
    holder = fsops.open_lock(lock)
    fcntl.flock(holder, fcntl.LOCK_EX)
    seen: dict[str, int] = {}

    def second() -> None:
        with fsops.held_lock(lock, wait_s=10.0) as fd:
            # A removed file has no link left (its inode number may be reused at once).
            seen["links"] = os.fstat(fd).st_nlink
            seen["held"] = os.fstat(fd).st_ino
            seen["at_path"] = lock.stat().st_ino

    thread = threading.Thread(target=second)
    thread.start()
    time.sleep(0.5)
    lock.unlink()
    os.close(holder)
    thread.join(10)
    assert not thread.is_alive()
    assert seen["links"] == 1
    assert seen["held"] == seen["at_path"]


def test_held_lock_is_busy_while_another_holds_it(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    with fsops.held_lock(lock):
        other = os.open(lock, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
        with pytest.raises(BlockingIOError), fsops.held_lock(lock):
            pass
    assert lock.is_file(), "the helper never removes the lock file itself"


def test_held_lock_refuses_a_link(tmp_path: Path) -> None:
    (tmp_path / "lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(fsops.NotRegularError), fsops.held_lock(tmp_path / "lock"):
        pass
    assert not (tmp_path / "elsewhere").exists()


# ---------------------------------------------------------------------------- the old place


def test_adopt_moves_only_what_is_about_the_targets(tmp_path: Path) -> None:
    """What an older rocmfix kept under the prefix for these targets moves here with its
    backups; another tree's entry, and one that differs from what is here, stay there."""
    legacy = StateDir(tmp_path / "usr" / "share" / "rocmfix", tmp_path / "usr")
    here = StateDir(tmp_path / "local" / "share" / "rocmfix", tmp_path / "local")
    (tmp_path / "usr").mkdir()
    (tmp_path / "local").mkdir()
    mine = replace(_entry(), patch="mine", original_sha256=legacy.backup(b"a0"))
    other = replace(
        _entry(), patch="other", distribution="elsewhere", original_sha256=legacy.backup(b"o0")
    )
    clash = replace(_entry(), patch="clash", original_sha256=legacy.backup(b"c0"))
    legacy.save(Manifest(entries={"mine": mine, "other": other, "clash": clash}), "old")
    newer = replace(clash, applied_at="later")
    here.save(Manifest(entries={"clash": newer}), "new")
    view = here.load_with(legacy, {"pkg"})
    assert set(view.entries) == {"mine", "clash"} and view.entries["clash"] == newer
    assert not (here.backups / mine.original_sha256).exists(), "a view writes nothing"
    moved = here.adopt(legacy, {"pkg"}, "new")
    assert moved == view
    assert here.load() == replace(moved, rocmfix_version="new")
    assert here.read_backup(mine.original_sha256) == b"a0"
    left = legacy.load()
    assert set(left.entries) == {"other", "clash"} and left.entries["clash"] == clash
    assert legacy.read_backup(clash.original_sha256) == b"c0"
    assert not (legacy.backups / mine.original_sha256).exists()
    # Nothing left to move: a second run changes nothing.
    assert here.adopt(legacy, {"pkg"}, "new") == here.load()
    assert legacy.load() == left


def test_adopt_empties_and_removes_the_old_place(tmp_path: Path) -> None:
    legacy = StateDir(tmp_path / "usr" / "share" / "rocmfix", tmp_path / "usr")
    here = StateDir(tmp_path / "local" / "share" / "rocmfix", tmp_path / "local")
    (tmp_path / "usr").mkdir()
    (tmp_path / "local").mkdir()
    legacy._make_root()
    entry = replace(_entry(), original_sha256=legacy.backup(b"a0"))
    legacy.save(Manifest(entries={"p": entry}), "old")
    moved = here.adopt(legacy, {"pkg"}, "new")
    assert set(moved.entries) == {"p"}
    assert not (tmp_path / "usr" / "share").exists()
    assert here.read_backup(entry.original_sha256) == b"a0"
