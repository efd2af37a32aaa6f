"""Real released files from PyPI, fetched at test time and cached under the user cache dir.

No upstream code lives in this repository (vllm and mineru-vl-utils are Apache-2.0,
DocLayout-YOLO is AGPL-3.0): tests download the released wheels and work on those. vllm
wheels are ~400 MB, so for them only the zip directory and the members a test needs are
read, with HTTP range requests, the way pip's lazy wheel does.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

from packaging.version import Version

INDEX = "https://pypi.org/simple"
_INDEX_TTL_S = 24 * 3600
_BLOCK = 1 << 18


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    path = Path(os.environ.get("ROCMFIX_TEST_CACHE", Path(base) / "rocmfix-tests"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _get(url: str, headers: dict[str, str] | None = None, tries: int = 4) -> bytes:
    for attempt in range(tries):
        try:
            request = urllib.request.Request(url, headers=headers or {})
            with urllib.request.urlopen(request, timeout=120) as response:
                data: bytes = response.read()
                return data
        except OSError:
            if attempt == tries - 1:
                raise
            time.sleep(2**attempt)
    raise AssertionError("unreachable")


def _write_atomic(path: Path, data: bytes) -> None:
    # A unique temporary name per write: threads of one process fill the same entries.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def index(project: str) -> dict[str, Any]:
    """The PEP 691 JSON index page of ``project`` (cached for a day)."""
    path = cache_dir() / "index" / f"{project}.json"
    if path.is_file() and time.time() - path.stat().st_mtime < _INDEX_TTL_S:
        loaded: dict[str, Any] = json.loads(path.read_text())
        return loaded
    data = _get(f"{INDEX}/{project}/", {"Accept": "application/vnd.pypi.simple.v1+json"})
    _write_atomic(path, data)
    parsed: dict[str, Any] = json.loads(data)
    return parsed


def _wheel_version(filename: str) -> str:
    return filename.split("-")[1]


def _wheel(project: str, version: str) -> dict[str, Any]:
    wanted = Version(version)
    candidates = [
        f
        for f in index(project)["files"]
        if f["filename"].endswith(".whl")
        and Version(_wheel_version(f["filename"])) == wanted
        and ("x86_64" in f["filename"] or "none-any" in f["filename"])
    ]
    if not candidates:
        raise LookupError(f"no x86_64 or pure wheel of {project} {version} on PyPI")
    # A compiled wheel for this interpreter first (onnxruntime has one per CPython).
    tag = f"-cp{sys.version_info[0]}{sys.version_info[1]}-"
    return sorted(
        candidates, key=lambda f: (tag not in f["filename"], "manylinux" not in f["filename"])
    )[0]


# The newest release of each project the suite was last checked against. The tests and the
# compatibility matrix take releases up to these, so a new upstream release cannot turn CI
# red on its own; `python bench/newer_releases.py` lists what came out since (CI prints it),
# and bumping a line here is how a new release joins the suite.
PINNED = {
    "vllm": "0.33.0",
    "transformers": "5.24.0",
    "mineru-vl-utils": "2.0.7",
    "doclayout-yolo": "0.0.4",
    "mineru": "4.0.12",
    "sglang": "0.5.23",
    "lmdeploy": "0.18.0",
}


def releases(project: str, *, wheels_only: bool = True, pinned: bool = True) -> list[str]:
    """Every non-yanked release with a usable wheel, oldest first; up to PINNED unless told
    otherwise."""
    found = _all_releases(project, wheels_only)
    if pinned and project in PINNED:
        found = [v for v in found if Version(v) <= Version(PINNED[project])]
    return found


def newer(project: str) -> list[str]:
    """Releases published after the pinned one."""
    return [v for v in _all_releases(project, True) if Version(v) > Version(PINNED[project])]


def _all_releases(project: str, wheels_only: bool) -> list[str]:
    seen: set[str] = set()
    for f in index(project)["files"]:
        if f.get("yanked") or (wheels_only and not f["filename"].endswith(".whl")):
            continue
        if "x86_64" in f["filename"] or "none-any" in f["filename"]:
            seen.add(_wheel_version(f["filename"]))
    return sorted(seen, key=Version)


def wheel(project: str, version: str) -> Path:
    """A whole wheel, downloaded once and checked against the index's sha256."""
    info = _wheel(project, version)
    path = cache_dir() / "wheels" / info["filename"]
    if not path.is_file():
        data = _get(info["url"])
        expected = info.get("hashes", {}).get("sha256")
        if expected and hashlib.sha256(data).hexdigest() != expected:
            raise RuntimeError(f"{info['filename']}: sha256 mismatch")
        _write_atomic(path, data)
    return path


class _RangeReader(io.RawIOBase):
    """A read-only, seekable view of a remote file, fetched in aligned blocks."""

    def __init__(self, url: str, size: int) -> None:
        self.url, self.size, self.pos = url, size, 0
        self.blocks: dict[int, bytes] = {}

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def _block(self, number: int) -> bytes:
        if number not in self.blocks:
            start = number * _BLOCK
            end = min(start + _BLOCK, self.size) - 1
            self.blocks[number] = _get(self.url, {"Range": f"bytes={start}-{end}"})
        return self.blocks[number]

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self.size - self.pos)
        if want <= 0:
            return 0
        out = bytearray()
        while len(out) < want:
            number, offset = divmod(self.pos + len(out), _BLOCK)
            out += self._block(number)[offset : offset + want - len(out)]
        buffer[:want] = out
        self.pos += want
        return want


def wheel_members(project: str, version: str, members: list[str]) -> dict[str, bytes | None]:
    """Members of a released wheel (``None`` where the wheel has no such member), plus the
    dist-info files, read remotely and cached one file at a time."""
    info = _wheel(project, version)
    root = cache_dir() / "members" / info["filename"]
    listing = root / ".listing.json"
    names: list[str] | None = json.loads(listing.read_text()) if listing.is_file() else None
    out: dict[str, bytes | None] = {}
    missing = [m for m in members if not (root / m).is_file() and (names is None or m in names)]
    if names is None or missing:
        size = info.get("size") or int(
            urllib.request.urlopen(urllib.request.Request(info["url"], method="HEAD")).headers[
                "Content-Length"
            ]
        )
        reader = io.BufferedReader(_RangeReader(info["url"], size), buffer_size=_BLOCK)
        with zipfile.ZipFile(reader) as archive:
            names = archive.namelist()
            _write_atomic(listing, json.dumps(names).encode())
            for member in missing:
                if member in names:
                    _write_atomic(root / member, archive.read(member))
    assert names is not None
    for member in members:
        out[member] = (root / member).read_bytes() if member in names else None
    return out


def distinct(
    project: str, versions: list[str], members: list[str]
) -> list[tuple[list[str], dict[str, bytes | None]]]:
    """``versions`` grouped by the bytes of ``members`` (a member a wheel lacks counts as
    such): each group's releases oldest first and the files they share. A check that reads
    nothing of a release but these files gives every release of a group the same answer, so
    a loop over every release runs it once per distinct content, not once per label."""
    groups: dict[tuple[bytes | None, ...], tuple[list[str], dict[str, bytes | None]]] = {}
    for version in sorted(versions, key=Version):
        files = wheel_members(project, version, members)
        key = tuple(files[m] for m in members)
        groups.setdefault(key, ([], files))[0].append(version)
    return list(groups.values())


def dist_info_members(project: str, version: str) -> list[str]:
    wheel_members(project, version, [])
    info = _wheel(project, version)
    names = json.loads((cache_dir() / "members" / info["filename"] / ".listing.json").read_text())
    return [
        n
        for n in names
        if n.count("/") == 1
        and n.split("/")[0].endswith(".dist-info")
        and n.split("/")[1] in ("METADATA", "RECORD", "WHEEL")
    ]


def make_venv(path: Path) -> Path:
    """A bare virtual environment (no pip inside: the test runner's pip installs into it)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path / "bin" / "python"


def site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return Path(out)


def _pip(python: Path, wheels: tuple[Path, ...]) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--no-compile",
            *map(str, wheels),
        ],
        check=True,
    )


# Each set of wheels pip installed in this process, by umask: the venv it went into and the
# files the install added there. Removed when the process that imported this module exits.
_installed: dict[tuple[int, tuple[Path, ...]], tuple[Path, list[str]]] = {}
_installed_lock = threading.Lock()
_INSTALLED_ROOT = Path(tempfile.mkdtemp(prefix="rocmfix-pip-"))
_OWNER = os.getpid()


@atexit.register
def _remove_installed() -> None:
    if os.getpid() == _OWNER:
        shutil.rmtree(_INSTALLED_ROOT, ignore_errors=True)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _pip_once(wheels: tuple[Path, ...]) -> tuple[Path, list[str]]:
    """Where pip installed ``wheels`` (under this umask) in this process, and what it added."""
    with _installed_lock:
        key = (_umask(), wheels)
        if key not in _installed:
            python = make_venv(Path(tempfile.mkdtemp(dir=_INSTALLED_ROOT)) / "venv")
            before = _files(python.parent.parent)
            _pip(python, wheels)
            _installed[key] = python, sorted(_files(python.parent.parent) - before)
        return _installed[key]


def _shebang(python: Path) -> bytes | None:
    """The first line pip writes into a console script for ``python`` where that is a plain
    ``#!`` line (distlib's rule: no space, at most 127 bytes)."""
    line = b"#!" + os.fsencode(python) + b"\n"
    return line if python.is_absolute() and b" " not in line and len(line) <= 127 else None


def _record_row(path: str, data: bytes) -> str:
    """A RECORD line as pip writes it (without its line end)."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def _as_pip_writes(python: Path, source: Path, added: list[str]) -> dict[str, bytes] | None:
    """The files pip writes installing what it installed beside ``source`` into the venv of
    ``python``; None where only pip can say (another venv layout, a distribution or file of
    the set already there, a script line pip makes differently)."""
    root, old_root = python.parent.parent, source.parent.parent
    old_line, new_line = _shebang(source), _shebang(python)
    records = [name for name in added if name.endswith(".dist-info/RECORD")]
    dists = {Path(r).parent.name.split("-")[0].lower() for r in records}
    if (
        old_line is None
        or new_line is None
        or not (root / "pyvenv.cfg").is_file()
        or os.path.realpath(python) != os.path.realpath(source)
        or any(os.path.lexists(root / name) for name in added)
        or any(
            info.name.split("-")[0].lower() in dists
            for record in records
            for info in (root / record).parent.parent.glob("*.dist-info")
        )
    ):
        return None
    files = {name: (old_root / name).read_bytes() for name in added}
    for name in (n for n in added if n.startswith("bin/")):
        old = files[name]
        if not old.startswith(old_line):
            return None
        files[name] = new_line + old[len(old_line) :]
        # RECORD names a script relative to its site-packages: ../../../bin/NAME
        rows = {r: os.path.relpath(name, Path(r).parent.parent) for r in records}
        listed = [r for r in records if files[r].count(_record_row(rows[r], old).encode()) == 1]
        if len(listed) != 1:
            return None
        record, path = listed[0], rows[listed[0]]
        files[record] = files[record].replace(
            _record_row(path, old).encode(), _record_row(path, files[name]).encode()
        )
    return files


def pip_install(python: Path, *wheels: Path) -> None:
    """Install wheels as pip does, so dist-info, RECORD and INSTALLER are pip's own.

    pip runs once per set of wheels in a process; installing the same set into another venv
    of this interpreter writes what pip wrote there, each console script's ``#!`` line (and
    its hash in RECORD) made for the new venv, as pip makes it: tests/test_releases.py checks
    that against pip's own install, byte for byte and mode for mode. Where that cannot stand
    for pip (see _as_pip_writes), pip itself installs."""
    source, added = _pip_once(tuple(wheels))
    files = _as_pip_writes(python, source, added)
    if files is None:
        _pip(python, tuple(wheels))
        return
    root = python.parent.parent
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
        shutil.copymode(source.parent.parent / name, root / name)


def partial_install(python: Path, project: str, version: str, members: list[str]) -> Path:
    """Install only ``members`` of a huge wheel, with its real METADATA, WHEEL and RECORD,
    as pip would have laid them out. Returns site-packages."""
    site = site_packages(python)
    meta = dist_info_members(project, version)
    files = wheel_members(project, version, members + meta)
    for name, data in files.items():
        if data is not None:
            (site / name).parent.mkdir(parents=True, exist_ok=True)
            (site / name).write_bytes(data)
    info_dir = site / meta[0].split("/")[0]
    (info_dir / "INSTALLER").write_bytes(b"pip\n")
    # pip lists INSTALLER in RECORD too, so that uninstalling removes it.
    with (info_dir / "RECORD").open("a") as record:
        record.write(_record_row(f"{info_dir.name}/INSTALLER", b"pip\n") + "\n")
    return site


def importable(project: str, version: str) -> Path:
    """A folder holding the release (``pip install --no-deps --target``), to put on sys.path.

    The test environment carries the package's runtime needs, but not the package itself: its
    own requirements would pull in a GUI build of OpenCV and more.
    """
    target = cache_dir() / "importable" / f"{project}-{version}"
    if not (target / ".complete").exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--no-index",
                "--no-compile",
                "--target",
                str(target),
                str(wheel(project, version)),
            ],
            check=True,
        )
        (target / ".complete").write_text("")
    return target


def copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, symlinks=True)
