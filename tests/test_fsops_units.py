"""The file operations (rocmfix/fsops.py) and the state store, one function at a time,
in-process and in milliseconds: what the CLI tests prove end to end, pinned down where each
promise lives, so that a deliberate break of any line (docs/mutation.md) fails a test here
first. The transaction built on them is in tests/test_transaction.py.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rocmfix import fsops

from conftest import file_mode

pytestmark = pytest.mark.usefixtures("no_hooks")


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
    assert file_mode(target) == 0o640
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
    assert file_mode(place / "f") == expected
    assert fsops.file_mode(tmp_path / "missing") == 0o644


def test_make_dirs_reports_what_it_made_with_the_parents_bits(
    tmp_path: Path, umask: Callable[[int], None]
) -> None:
    umask(0o077)
    os.chmod(tmp_path, 0o751)
    made = fsops.make_dirs(tmp_path / "a" / "b" / "c")
    assert made == [tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"]
    assert file_mode(tmp_path / "a") == 0o751 & 0o755
    assert file_mode(tmp_path / "a" / "b" / "c") == 0o751 & 0o755
    assert fsops.make_dirs(tmp_path / "a" / "b") == []
    os.chmod(tmp_path / "a", 0o700)
    assert fsops.make_dirs(tmp_path / "a" / "x") == [tmp_path / "a" / "x"]
    assert file_mode(tmp_path / "a" / "x") == 0o700


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

    monkeypatch.setattr("rocmfix.fsops.os.open", overflow)
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

    monkeypatch.setattr("rocmfix.fsops.tempfile.mkstemp", refuse)
    found = fsops.unwritable_reason(tmp_path)
    assert found is not None and found.startswith(reason)


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

    monkeypatch.setattr("rocmfix.fsops.tempfile.mkstemp", refuse)
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

    monkeypatch.setattr("rocmfix.fsops.os.chmod", refuse)
    assert fsops.make_dirs(tmp_path / "x" / "y") == [tmp_path / "x", tmp_path / "x" / "y"]


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
