"""The only place rocmfix changes files on disk, and the one way it reads files it did not
just write.

Every change is a whole-file atomic replace: a temporary file in the same directory, fsync,
a last look at the file being replaced (it must still hold the bytes the run planned from),
``os.replace``, then fsync of the directory. A replace gives the target a new inode, so a file
hard-linked from a uv or conda package cache is never written through. New files and folders
get modes from the folder they are made in, whatever the umask: readable by whoever can read
that folder, writable by the owner.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import pwd
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

TEMP_TAG = ".rocmfix-"
TEMP_SUFFIX = ".tmp"
# The largest file rocmfix reads whole: a target module, a RECORD, a backup.
READ_LIMIT = 64 << 20


class NotRegularError(Exception):
    """A path rocmfix would read is a link, a folder, a FIFO or a device, or is too large."""


class ChangedError(OSError):
    """A file changed between planning and its replacement: another program wrote it."""


# ---------------------------------------------------------------------------- test hooks

# Production code that only tests use: a JSON object that makes the N-th write point of a
# run kill the process with SIGKILL (``kill_at``: a power cut, the OOM killer), stop it with
# SIGSTOP until a SIGCONT (``pause_at``: a run in progress, seen by others), fail with
# EIO from then on (``fail_from``: a dying disk, so the rollback fails too), or append a line
# to the file about to be replaced (``edit_at``: another program editing it mid-run). The
# name says what it is; the CLI warns on stderr whenever it is set.
TEST_HOOKS_ENV = "ROCMFIX_UNSAFE_TEST_HOOKS"
_write_points = 0


def test_hooks() -> dict[str, int]:
    try:
        raw = json.loads(os.environ.get(TEST_HOOKS_ENV) or "{}")
    except ValueError:
        return {}
    if not isinstance(raw, dict):
        return {}
    return {k: v for k, v in raw.items() if isinstance(v, int) and not isinstance(v, bool)}


def write_point(path: Path) -> None:
    """Mark the moment before a change to ``path``; the fault tests act here."""
    global _write_points
    _write_points += 1
    hooks = test_hooks()
    if not hooks:
        return
    if hooks.get("kill_at") == _write_points:
        os.kill(os.getpid(), signal.SIGKILL)
    if hooks.get("pause_at") == _write_points:
        # Stopped with the lock held until the test sends SIGCONT: a run in progress.
        os.kill(os.getpid(), signal.SIGSTOP)
    if hooks.get("edit_at") == _write_points and path.is_file():
        with path.open("ab") as handle:
            handle.write(b"# edited while rocmfix ran\n")
    if 0 < hooks.get("fail_from", 0) <= _write_points:
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))


# ---------------------------------------------------------------------------- reading


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record_hash(data: bytes) -> str:
    """The digest as a wheel's RECORD writes it: urlsafe base64 without padding."""
    digest = hashlib.sha256(data).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def read_regular(path: Path, limit: int = READ_LIMIT, *, follow: bool = False) -> bytes | None:
    """The bytes of the regular file at ``path``; None if nothing is there.

    Never follows a link (unless ``follow``: a user's own config file may be one, but what it
    leads to must still be a regular file), never blocks on a FIFO, never reads a device or
    more than ``limit`` bytes: everything rocmfix did not just write is untrusted input.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularError(f"{path} is a symbolic link") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularError(f"{path} is not a regular file")
        chunks = []
        size = 0
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if size > limit:
                raise NotRegularError(f"{path} is larger than {limit >> 20} MiB")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def digest_of(path: Path) -> str | None:
    """The sha256 of the regular file at ``path``, None if absent (links are refused)."""
    data = read_regular(path)
    return None if data is None else sha256(data)


def inside(path: Path, root: Path) -> bool:
    """Whether ``path``'s folder, with every link in it resolved, is under ``root``'s: a
    path that leaves through a linked folder is not."""
    try:
        return path.parent.resolve(strict=False).is_relative_to(root.resolve(strict=False))
    except (OSError, RuntimeError):
        return False


# ---------------------------------------------------------------------------- writing

# ``expect`` of atomic_write and remove: the sha256 the file must hold right before it is
# replaced, None for "must not exist"; UNCHECKED skips the look.
UNCHECKED: Any = object()


def temp_glob(path: Path) -> str:
    return f".{path.name}{TEMP_TAG}*{TEMP_SUFFIX}"


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _check(path: Path, expect: Any) -> None:
    if expect is UNCHECKED:
        return
    try:
        now = digest_of(path)
    except NotRegularError as exc:
        raise ChangedError(errno.EEXIST, str(exc), str(path)) from None
    if now != expect:
        raise ChangedError(errno.EEXIST, "changed by another program while rocmfix ran", str(path))


def file_mode(folder: Path) -> int:
    """A new file's mode in ``folder``: the owner writes; whoever can read the folder reads."""
    try:
        folder_mode = stat.S_IMODE(folder.stat().st_mode)
    except OSError:
        return 0o644
    return 0o600 | (folder_mode & 0o044)


def atomic_write(
    path: Path,
    data: bytes | BinaryIO,
    *,
    like: os.stat_result | None = None,
    expect: Any = UNCHECKED,
) -> None:
    """Replace ``path`` with ``data`` (bytes, or an open file to copy from); mode and owner
    come from ``like`` (the old file), else from the folder. ``expect``: what the file must
    hold at the moment of the replace. A link at ``path`` is replaced, never written through."""
    write_point(path)
    fd, tmp_name = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}{TEMP_TAG}", suffix=TEMP_SUFFIX
    )
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            if isinstance(data, bytes):
                handle.write(data)
            else:
                shutil.copyfileobj(data, handle, 1 << 20)
            handle.flush()
            os.fsync(handle.fileno())
        if like is not None:
            os.chmod(tmp, stat.S_IMODE(like.st_mode))
            if (like.st_uid, like.st_gid) != (os.getuid(), os.getgid()):
                # Only root can give a file away; anyone else leaves it owned by themselves,
                # which is what writing the file in place would have done too.
                with contextlib.suppress(PermissionError):
                    os.chown(tmp, like.st_uid, like.st_gid)
        else:
            os.chmod(tmp, file_mode(path.parent))
            give_to_folder_owner(tmp)
        copy_xattrs(path, tmp)
        write_point(path)
        _check(path, expect)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def _xattrs(path: Path) -> dict[str, bytes]:
    try:
        names = os.listxattr(path, follow_symlinks=False)
        return {n: os.getxattr(path, n, follow_symlinks=False) for n in names}
    except OSError:
        # Absent, or a file system without extended attributes: nothing to carry.
        return {}


def copy_xattrs(source: Path, dest: Path) -> None:
    """Give ``dest`` the extended attributes of the regular file ``source`` it replaces, ACLs
    (``system.posix_acl_access``) included: a replace makes a new inode, and a user whose
    write access came from an ACL would lose it for good. One that cannot be carried fails
    the write (the run rolls back) rather than vanish."""
    try:
        if not stat.S_ISREG(source.lstat().st_mode):
            return
    except OSError:
        return
    have = _xattrs(dest)
    for name, value in _xattrs(source).items():
        if have.get(name) == value:
            continue
        try:
            os.setxattr(dest, name, value, follow_symlinks=False)
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot carry over its extended attribute {name}", str(source)
            ) from None


def give_to_folder_owner(path: Path) -> None:
    """Run as root in someone else's environment (``sudo rocmfix``), hand a file or folder
    rocmfix creates to the owner of the folder it is in, so that user can revert without
    root. A no-op for anyone else, who can only create files they own."""
    if os.geteuid() != 0:
        return
    with contextlib.suppress(OSError):
        folder = os.stat(path.parent)
        os.chown(path, folder.st_uid, folder.st_gid, follow_symlinks=False)


def dir_mode(parent_mode: int) -> int:
    """A new folder's mode from its parent's: the owner's rwx; the parent's read and search
    bits; and, in a folder shared with a group (setgid, group-writable: ``chmod 2775``), the
    group's write bit and setgid too, so every member of the group can revert what another
    applied. Nobody else ever writes."""
    mode = 0o700 | (parent_mode & 0o055)
    if parent_mode & stat.S_ISGID:
        mode |= stat.S_ISGID | (parent_mode & 0o020)
    return mode


def make_dirs(path: Path) -> list[Path]:
    """``mkdir -p``; each folder made is given its parent's owner and, whatever the umask,
    its mode from its parent's (:func:`dir_mode`). Returns the folders it made, outermost
    first."""
    missing = []
    while not path.exists() and not path.is_symlink():
        missing.append(path)
        path = path.parent
    made = []
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        with contextlib.suppress(OSError):
            os.chmod(folder, dir_mode(stat.S_IMODE(folder.parent.stat().st_mode)))
        give_to_folder_owner(folder)
        made.append(folder)
    return made


class UnsafeFolderError(Exception):
    """A folder the user named for rocmfix's output that others could plant links in."""


def _check_ancestors(folder: Path) -> None:
    """Each existing folder from the root down to ``folder``, and each link on the way, must
    belong to this user or root, and a folder others can write must have its sticky bit (as
    /tmp does): elsewhere another user could swap a folder on the path for a link of theirs
    between the check and the writes (what ssh's StrictModes checks of a home folder)."""
    me = os.geteuid()
    current = Path(folder.anchor)
    for part in folder.parts[1:]:
        current = current / part
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            return  # made by make_dirs, as this user
        except OSError as exc:
            raise UnsafeFolderError(f"cannot use {current}: {exc.strerror or exc}") from None
        if info.st_uid not in (0, me):
            kind = "a link" if stat.S_ISLNK(info.st_mode) else "a folder"
            try:
                owner = pwd.getpwuid(info.st_uid).pw_name
            except KeyError:
                owner = f"uid {info.st_uid}"
            raise UnsafeFolderError(f"{current} on the path is {kind} of {owner}")
        if stat.S_ISLNK(info.st_mode):
            current = Path(os.path.realpath(current))
            _check_ancestors(current)
            continue
        if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
            raise UnsafeFolderError(
                f"{current} on the path is writable by other users (mode "
                f"{info.st_mode & 0o777:o}) and not sticky"
            )


def own_folder(path: Path) -> Path:
    """``path`` as a folder only this user writes: an existing one must be a real folder
    (not a link) owned by this user and not writable by group or others; a missing one is
    made (its parents as :func:`make_dirs` makes them, itself 0700). Nothing is followed at
    the last component, and every folder above it must be one no other user can rename
    entries in (see :func:`_check_ancestors`); raises :class:`UnsafeFolderError` with the
    reason."""
    _check_ancestors(Path(os.path.abspath(path)).parent)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        try:
            make_dirs(path.parent)
            os.mkdir(path, 0o700)
        except OSError as exc:
            raise UnsafeFolderError(f"cannot create {path}: {exc.strerror or exc}") from None
        info = os.lstat(path)
    except OSError as exc:
        raise UnsafeFolderError(f"cannot use {path}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeFolderError(f"{path} is a symbolic link; name the folder itself")
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeFolderError(f"{path} exists and is not a folder")
    if info.st_uid != os.geteuid():
        raise UnsafeFolderError(f"{path} belongs to {owner_name(path)}, not to this user")
    if info.st_mode & 0o022:
        raise UnsafeFolderError(
            f"{path} is writable by other users (mode {info.st_mode & 0o777:o})"
        )
    if not os.access(path, os.W_OK | os.X_OK):
        raise UnsafeFolderError(f"{path} is not writable")
    return path


def copy_regular(source: Path, dest: Path) -> None:
    """Copy the regular file ``source`` (never through a link, never a FIFO) to ``dest``,
    written beside it and renamed into place."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(source, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularError(f"{source} is a symbolic link") from None
        raise
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularError(f"{source} is not a regular file")
        atomic_write(dest, handle)


def remove(path: Path, *, expect: Any = UNCHECKED) -> None:
    write_point(path)
    _check(path, expect)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    _fsync_dir(path.parent)


def invalidate_pycache(path: Path) -> None:
    """Drop the bytecode of ``path`` so hash-checked or unchecked .pyc files cannot go stale."""
    cache = path.parent / "__pycache__"
    if not cache.is_dir() or cache.is_symlink():
        return
    for pyc in cache.glob(f"{path.stem}.*.pyc"):
        with contextlib.suppress(FileNotFoundError):
            pyc.unlink()


def remove_temp_files(directory: Path) -> list[Path]:
    """Remove what interrupted runs left in ``directory``: the temporary files of a write
    (``.NAME.rocmfix-*.tmp``) or of a write-access probe (``.rocmfix-*.tmp``). Regular files
    only; nothing is followed through a link."""
    removed: list[Path] = []
    if not directory.is_dir() or directory.is_symlink():
        return removed
    for pattern in (f".*{TEMP_TAG}*{TEMP_SUFFIX}", f"{TEMP_TAG}*{TEMP_SUFFIX}"):
        for leftover in directory.glob(pattern):
            with contextlib.suppress(OSError):
                if stat.S_ISREG(leftover.lstat().st_mode) and leftover not in removed:
                    leftover.unlink()
                    removed.append(leftover)
    return removed


def owner_name(path: Path) -> str:
    """Who owns ``path``: a user name, else the uid; with the group when the folder is
    shared with one (setgid)."""
    try:
        info = path.stat()
    except OSError:
        return "its owner"
    try:
        owner = path.owner()
    except (KeyError, OSError):
        owner = str(info.st_uid)
    if info.st_mode & stat.S_ISGID and stat.S_ISDIR(info.st_mode):
        try:
            group = path.group()
        except (KeyError, OSError):
            group = f"gid {info.st_gid}"
        return f"{owner} (group {group})"
    return owner


# What :func:`unwritable_reason` says of a read-only mount, where the owner cannot write either.
READ_ONLY = "is on a read-only file system"
READ_ONLY_HINT = (
    "no user can write there until the file system is mounted read-write; remount it, or "
    "patch an environment on a writable one"
)


def unwritable_reason(directory: Path) -> str | None:
    """Why files in ``directory`` cannot be replaced, or None if they can.

    ``os.access`` is not enough: root passes it on a read-only mount, so create and remove
    a real temporary file.
    """
    try:
        fd, name = tempfile.mkstemp(dir=directory, prefix=TEMP_TAG, suffix=TEMP_SUFFIX)
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        if exc.errno == errno.EROFS:
            return READ_ONLY
        if exc.errno in (errno.EACCES, errno.EPERM):
            return f"is not writable by this user (owned by {owner_name(directory)})"
        return exc.strerror or str(exc)
    os.close(fd)
    # Another run tidying this folder may have removed it already.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name)
    return None


# ---------------------------------------------------------------------------- locks


def lock_mode(folder: Path) -> int:
    """A lock file's mode: read and written by the owner, and by the group where the folder
    is shared with it. Nobody else may open it: flock needs no write access, so a lock file
    anyone can read is one anyone can hold."""
    try:
        folder_mode = stat.S_IMODE(folder.stat().st_mode)
    except OSError:
        return 0o600
    return 0o600 | (0o060 if folder_mode & 0o020 else 0)


def open_lock(path: Path) -> int:
    """The lock file at ``path`` opened for writing (created if absent): never through a
    link, never a FIFO, a folder or a device. Raises NotRegularError for those."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, lock_mode(path.parent))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularError(f"{path} is a symbolic link") from None
        if exc.errno == errno.EISDIR:
            raise NotRegularError(f"{path} is a folder") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegularError(f"{path} is not a regular file")
    return fd


def take_lock(fd: int, path: Path, wait_s: float = 0.0) -> bool:
    """Lock ``fd`` exclusively, waiting up to ``wait_s``; False if the file is no longer the
    one at ``path`` (a run that finished removed it). Raises BlockingIOError when another
    process still holds it after the wait. A held lock is never unlinked by anyone who
    takes it this way: whoever removes the file holds its lock."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)
    try:
        current = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (current.st_ino, current.st_dev) == (held.st_ino, held.st_dev)


@contextlib.contextmanager
def held_lock(
    path: Path, wait_s: float = 0.0, prepare: Callable[[], None] | None = None
) -> Iterator[int]:
    """The one lock helper (rocmfix's state, the tuned file): an exclusive lock on the file
    at ``path``, through a descriptor open for writing (:func:`open_lock`), waited for up to
    ``wait_s``; yields the descriptor. Raises BlockingIOError while another process holds
    it, NotRegularError for a link, FIFO or folder there.

    Nobody unlinks a lock someone else holds: only its holder removes a lock file (the
    state's tidy, once nothing is left). A run that opened the file just before finds at
    ``path`` another file or none once it has the lock, so it locks what is there now
    (``prepare`` makes its folder again) for as long as ``wait_s``, and at least a second,
    allows: each turn means another run finished meanwhile."""
    deadline = time.monotonic() + max(wait_s, 1.0)
    while True:
        if prepare is not None:
            prepare()
        try:
            fd = open_lock(path)
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                raise
            continue
        try:
            if take_lock(fd, path, max(deadline - time.monotonic(), 0.0) if wait_s else 0.0):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        if time.monotonic() >= deadline:
            raise BlockingIOError(errno.EAGAIN, f"{path} keeps being replaced")
    try:
        yield fd
    finally:
        os.close(fd)


def pid_running(pid: int) -> bool:
    """Whether a process with this pid exists (in this pid namespace)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
