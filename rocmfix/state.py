"""rocmfix's own record of an environment: the manifest, the backups and the lock.

The state lives in the installation that holds the targets (``<base>/share/rocmfix``: the
prefix of a venv or conda env, the user base for the user site; see
``Environment.state``), so it goes where the environment goes and every user of the
environment sees the same truth. This module alone knows the layout; the model is
:mod:`rocmfix.manifest`. Nothing read from it is trusted: its folders and files must be what
they claim (no links, no FIFOs, no devices, no files larger than a manifest can be), paths
are checked against what the patches declare, digests against the bytes they name.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from . import fsops
from .errors import LockBusyError, ManifestError, RefusedError, WriteError
from .manifest import STATE_HINT, Manifest, dump_manifest, parse_manifest, sha_digest

# A manifest names a few dozen files; anything far larger is not one rocmfix wrote.
_MANIFEST_LIMIT = 4 << 20
# The temporary name ``<prefix>/share`` is built under (see StateDir._make_root).
_SHARE_TEMP = ".share" + fsops.TEMP_TAG


class StateDir:
    """``<prefix>/share/rocmfix``: manifest.json, backups/<sha256>, lock, and ``made-share``
    when rocmfix made ``<prefix>/share`` itself (so only then does it remove it)."""

    def __init__(self, root: Path, prefix: Path | None = None) -> None:
        self.root = root
        self.prefix = prefix if prefix is not None else root.parent.parent
        self.manifest_path = root / "manifest.json"
        self.backups = root / "backups"
        self.lock_path = root / "lock"
        self._made_share = root / "made-share"

    # ------------------------------------------------------------------------ layout

    def check_layout(self) -> None:
        """Refuse state that leads out of the environment or is not what it claims to be."""
        for folder in (self.root.parent, self.root, self.backups):
            if folder.is_symlink():
                raise ManifestError(
                    f"{folder} is a symbolic link: rocmfix keeps its state in real folders "
                    "and follows no link out of the environment",
                    hint=STATE_HINT,
                )
            if folder.exists() and not folder.is_dir():
                raise ManifestError(f"{folder} is not a folder", hint=STATE_HINT)
        if not fsops.inside(self.root / "x", self.prefix):
            raise ManifestError(f"{self.root} is outside the environment {self.prefix}")

    def _make_root(self) -> None:
        """Make the state folder. Where ``share/`` is missing, rocmfix builds it whole under a
        temporary name, ``made-share`` marker inside, and renames it into place: a run killed
        at any point leaves either no ``share/`` or one that says it is rocmfix's (and a
        temporary folder the next run removes), never an empty ``share/`` nobody removes."""
        share = self.root.parent
        if share.exists() or share.is_symlink():
            fsops.make_dirs(self.root)
            return
        fsops.write_point(share)
        tmp = Path(tempfile.mkdtemp(dir=self.prefix, prefix=_SHARE_TEMP, suffix=fsops.TEMP_SUFFIX))
        try:
            for folder in (tmp, tmp / self.root.name):
                if folder != tmp:
                    folder.mkdir()
                os.chmod(folder, fsops.dir_mode(stat.S_IMODE(folder.parent.stat().st_mode)))
                fsops.give_to_folder_owner(folder)
            marker = tmp / self.root.name / self._made_share.name
            marker.touch()
            os.chmod(marker, fsops.file_mode(marker.parent))
            fsops.give_to_folder_owner(marker)
            os.rename(tmp, share)
        except OSError:
            # Another run made share/ meanwhile: use theirs.
            self._remove_share_temp(tmp)
            fsops.make_dirs(self.root)
            return
        fsops.write_point(share)

    def _remove_share_temp(self, tmp: Path) -> None:
        """A temporary share/ of :meth:`_make_root`: only what it makes there is removed."""
        with contextlib.suppress(OSError):
            if tmp.is_symlink() or not tmp.is_dir():
                return
            inner = tmp / self.root.name
            marker = inner / self._made_share.name
            if marker.is_file() and not marker.is_symlink():
                marker.unlink()
            if inner.is_dir() and not inner.is_symlink():
                inner.rmdir()
            tmp.rmdir()

    def left_behind(self) -> bool:
        """Whether a killed run left state to tidy: the folder, or a temporary share/."""
        return self.root.exists() or any(self.prefix.glob(f"{_SHARE_TEMP}*{fsops.TEMP_SUFFIX}"))

    def _read(self, path: Path, limit: int = fsops.READ_LIMIT) -> bytes | None:
        try:
            return fsops.read_regular(path, limit)
        except fsops.NotRegularError as exc:
            raise ManifestError(
                f"rocmfix's state is not what it should be: {exc}", hint=STATE_HINT
            ) from None
        except OSError as exc:
            raise ManifestError(f"cannot read {path}: {exc.strerror or exc}") from None

    def _write(self, path: Path, data: bytes) -> None:
        self._prepare()
        fsops.make_dirs(path.parent)
        fsops.atomic_write(path, data)

    # ------------------------------------------------------------------------ manifest

    def load(self) -> Manifest:
        self.check_layout()
        data = self._read(self.manifest_path, _MANIFEST_LIMIT)
        if data is None:
            return Manifest()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ManifestError(f"rocmfix's manifest {self.manifest_path} is not text") from None
        return parse_manifest(text, self.manifest_path)

    def save(self, manifest: Manifest, rocmfix_version: str) -> None:
        if not manifest.entries and manifest.pending is None:
            self.check_layout()
            fsops.remove(self.manifest_path)
            return
        self._write(self.manifest_path, dump_manifest(manifest, rocmfix_version))

    # ------------------------------------------------------------------------ backups

    def backup(self, data: bytes) -> str:
        """Keep a real copy of ``data`` (never a link into the package) under its digest."""
        digest = fsops.sha256(data)
        path = self.backups / digest
        existing = self._read(path)
        if existing is not None and fsops.sha256(existing) == digest:
            return digest
        self._write(path, data)
        return digest

    def read_backup(self, digest: str) -> bytes:
        path = self.backups / sha_digest(digest, "backup digest")
        data = self._read(path)
        if data is None:
            raise ManifestError(
                f"the backup {path} is missing",
                hint="reinstall the package to get its original files back "
                "(pip install --force-reinstall --no-deps ...)",
            )
        if fsops.sha256(data) != digest:
            raise ManifestError(f"the backup {path} is corrupt (its digest does not match)")
        return data

    def prune_backups(self, keep: set[str]) -> None:
        self.check_layout()
        if not self.backups.is_dir():
            return
        for path in self.backups.iterdir():
            # The folder is rocmfix's alone: anything but a kept backup is an old backup or
            # the temporary file of a write that was interrupted. Never a link's target.
            with contextlib.suppress(OSError):
                if path.name not in keep and stat.S_ISREG(path.lstat().st_mode):
                    path.unlink()
        with contextlib.suppress(OSError):
            self.backups.rmdir()

    # ------------------------------------------------------------------------ tidying

    def tidy(self) -> None:
        """Leave no state behind once nothing is applied and nothing is pending: temporary
        files of interrupted writes, old backups, the lock, the folders rocmfix made. Best
        effort: what a failing disk keeps here, the next run removes."""
        with contextlib.suppress(OSError):
            self._tidy()

    def _tidy(self) -> None:
        try:
            manifest = self.load()
        except ManifestError:
            return
        # Where rocmfix writes its state, and where it probes for write access first.
        for folder in (self.root, self.backups, self.root.parent, self.prefix):
            fsops.remove_temp_files(folder)
        for leftover in self.prefix.glob(f"{_SHARE_TEMP}*{fsops.TEMP_SUFFIX}"):
            self._remove_share_temp(leftover)
        if manifest.entries or manifest.pending is not None:
            return
        self.prune_backups(set())
        made_share = self._made_share.is_file() and not self._made_share.is_symlink()
        for path in (self.lock_path, self._made_share):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                if not path.is_dir() or path.is_symlink():
                    path.unlink()
        with contextlib.suppress(OSError):
            self.root.rmdir()
            if made_share:
                # An empty share/ the environment had before rocmfix came stays.
                self.root.parent.rmdir()

    # ------------------------------------------------------------------------ the lock

    @contextlib.contextmanager
    def locked(self, wait_s: float = 0.0) -> Iterator[None]:
        """Hold the environment's lock; a second run fails (after ``wait_s``) instead of
        interleaving. The folder is made first (and again, if a finishing run removed it
        while this one waited: see :func:`rocmfix.fsops.held_lock`)."""
        held = contextlib.ExitStack()
        try:
            fd = held.enter_context(fsops.held_lock(self.lock_path, wait_s, self._prepare))
        except BlockingIOError:
            raise self.busy_error() from None
        except fsops.NotRegularError as exc:
            raise ManifestError(
                f"{exc}; rocmfix will not lock through it", hint=STATE_HINT
            ) from None
        except OSError as exc:
            raise WriteError(
                f"nothing was changed: rocmfix could not take its lock in {self.root} "
                f"({exc.strerror or exc})"
            ) from None
        with held:
            fsops.give_to_folder_owner(self.lock_path)
            # A lock file an older rocmfix left readable by anyone is closed now
            # (by its owner: another member of a shared group may not chmod it).
            with contextlib.suppress(PermissionError):
                os.fchmod(fd, fsops.lock_mode(self.root))
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode("ascii"), 0)
            yield

    def _prepare(self) -> None:
        """The state folder, made where it is missing, once its layout is checked."""
        self.check_layout()
        self._make_root()

    def _read_lock(self) -> int | None:
        """The lock file opened without creating it (for writing where this user may, else
        for reading); None if it is not there or cannot be opened."""
        flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        for mode in (os.O_RDWR, os.O_RDONLY):
            try:
                fd = os.open(self.lock_path, mode | flags)
            except OSError:
                continue
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return fd
            os.close(fd)
            return None
        return None

    def holder(self) -> int | None:
        """The pid the lock file names (whoever holds it writes it there)."""
        fd = self._read_lock()
        if fd is None:
            return None
        try:
            text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
        return int(text) if text.isdigit() and len(text) < 12 else None

    def busy_error(self) -> LockBusyError:
        pid = self.holder()
        if pid is not None and not fsops.pid_running(pid) and self._held(fcntl.LOCK_EX):
            # Still held now: a holder this pid namespace cannot see. (Not held: the run that
            # named it has just finished, and the plain message below is the true one.)
            again = self.holder()
            if again != pid:
                return self._held_by(again)
            return LockBusyError(
                f"the lock {self.lock_path} is held, but the pid it names ({pid}) is not "
                "running: another process (another user's, or one in another container) "
                "holds the lock file open",
                hint=f"find it with `fuser -v {self.lock_path}`; once it is gone, run the "
                "command again",
            )
        return self._held_by(pid)

    @staticmethod
    def _held_by(pid: int | None) -> LockBusyError:
        who = f"pid {pid}" if pid is not None else "pid unknown"
        return LockBusyError(
            f"another rocmfix run ({who}) is changing this environment",
            hint="wait for it to finish, then run the command again",
        )

    def busy(self) -> bool:
        """Whether another process holds the lock right now (read-only: creates nothing)."""
        return self._held(fcntl.LOCK_SH)

    def _held(self, mode: int) -> bool:
        """Whether the lock cannot be taken in ``mode`` now: ``LOCK_SH`` sees a writer (a run),
        ``LOCK_EX`` anyone, a reader holding it shared too. A lock taken here is let go."""
        fd = self._read_lock()
        if fd is None:
            return False
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def check_writable(self) -> None:
        probe_dir = self.root
        while not probe_dir.exists():
            probe_dir = probe_dir.parent
        reason = fsops.unwritable_reason(probe_dir)
        if reason is not None:
            raise RefusedError(
                f"cannot keep rocmfix's state in {self.root}: {probe_dir} {reason}",
                hint=fsops.READ_ONLY_HINT
                if reason == fsops.READ_ONLY
                else f"run rocmfix as {fsops.owner_name(probe_dir)}, who owns it, or make "
                "the folder writable by the group that shares the environment",
            )
