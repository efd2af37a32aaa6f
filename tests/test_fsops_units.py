"""The file operations and the transaction, one function at a time, in-process and in
milliseconds: what the CLI tests prove end to end, pinned down where each promise lives, so
that a deliberate break of any line (docs/mutation.md) fails a test here first.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rocmfix import fsops
from rocmfix.errors import WriteError
from rocmfix.results import FileChange
from rocmfix.state import Entry, Manifest, StateDir
from rocmfix.write import transaction
from rocmfix.write.plan import Plan


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


def _entry() -> Entry:
    return Entry(
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
    assert "Input/output error" in caught.value.message
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
