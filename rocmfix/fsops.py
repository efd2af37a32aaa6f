"""The only place rocmfix changes files on disk.

Every change is a whole-file atomic replace: a temporary file in the same directory,
fsync, ``os.replace``, then fsync of the directory. A replace gives the target a new inode,
so a file hard-linked from a uv or conda package cache is never written through.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import os
import signal
import stat
import tempfile
from pathlib import Path

TEMP_TAG = ".rocmfix-"
TEMP_SUFFIX = ".tmp"

# Fault injection for the crash tests: the N-th write point of a run kills the process
# with SIGKILL, the way a power cut or an OOM kill would. Unset in normal use.
_KILL_AT_ENV = "ROCMFIX_TEST_KILL_AT"
_write_points = 0


def write_point() -> None:
    """Mark the moment before a change to disk; the crash tests stop the run here."""
    global _write_points
    _write_points += 1
    target = os.environ.get(_KILL_AT_ENV)
    if target is not None and target.isdigit() and int(target) == _write_points:
        os.kill(os.getpid(), signal.SIGKILL)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record_hash(data: bytes) -> str:
    """The digest as a wheel's RECORD writes it: urlsafe base64 without padding."""
    digest = hashlib.sha256(data).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def temp_glob(path: Path) -> str:
    return f".{path.name}{TEMP_TAG}*{TEMP_SUFFIX}"


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: Path, data: bytes, *, like: os.stat_result | None = None) -> None:
    """Replace ``path`` with ``data``; mode and owner come from ``like`` (the old file)."""
    write_point()
    fd, tmp_name = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}{TEMP_TAG}", suffix=TEMP_SUFFIX
    )
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
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
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
            give_to_folder_owner(tmp)
        write_point()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def give_to_folder_owner(path: Path) -> None:
    """Run as root in someone else's environment (``sudo rocmfix``), hand a file or folder
    rocmfix creates to the owner of the folder it is in, so that user can revert without
    root. A no-op for anyone else, who can only create files they own."""
    if os.geteuid() != 0:
        return
    with contextlib.suppress(OSError):
        folder = os.stat(path.parent)
        os.chown(path, folder.st_uid, folder.st_gid, follow_symlinks=False)


def make_dirs(path: Path) -> None:
    """``mkdir -p``; each folder made is given to its parent folder's owner."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        give_to_folder_owner(folder)


def remove(path: Path) -> None:
    write_point()
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    _fsync_dir(path.parent)


def invalidate_pycache(path: Path) -> None:
    """Drop the bytecode of ``path`` so hash-checked or unchecked .pyc files cannot go stale."""
    cache = path.parent / "__pycache__"
    if not cache.is_dir():
        return
    for pyc in cache.glob(f"{path.stem}.*.pyc"):
        with contextlib.suppress(FileNotFoundError):
            pyc.unlink()


def remove_temp_files(path: Path) -> list[Path]:
    """Remove temporary files an interrupted write of ``path`` left behind."""
    removed = []
    if path.parent.is_dir():
        for leftover in path.parent.glob(temp_glob(path)):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
                removed.append(leftover)
    return removed


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
            return "is on a read-only file system"
        if exc.errno in (errno.EACCES, errno.EPERM):
            try:
                owner = directory.owner()
            except (KeyError, OSError):
                owner = str(directory.stat().st_uid)
            return f"is not writable by this user (owned by {owner})"
        return exc.strerror or str(exc)
    os.close(fd)
    os.unlink(name)
    return None
