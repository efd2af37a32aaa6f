"""Installs that are not a plain ``pip install`` of a wheel, through the real CLI.

Editable checkouts (PEP 660 and the old egg-link), uv's hard-linked installs, a conda-style
prefix, reinstalls over a patch, a read-only state folder, a prefix owned by someone else,
and target files with CRLF line ends, a BOM, a latin-1 coding cookie or tab indentation.
Every file patched is a real released file, fetched from PyPI at test time.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import releases
from conftest import (
    DOCLAYOUT_TARGET,
    MINERU_TARGET,
    PYTHONPATH,
    VLLM_TARGETS,
    InstalledEnv,
    Result,
    files_under,
    run_cli_readonly,
)

pytestmark = pytest.mark.network

VLLM_VERSION = "0.11.0"
VLLM_PATCHES = ("vllm-qwen2-vl", "vllm-qwen2.5-vl", "vllm-qwen3-vl")
VLLM_DROP = "vllm/model_executor/models/qwen2_vl_vision_kernels.py"
# The last setuptools with both PEP 660 editable wheels and `setup.py develop` writing an
# egg-link (80 dropped the egg-link); below 70.1 it builds editable wheels with `wheel`.
SETUPTOOLS = "69.5.1"
WHEEL = "0.43.0"


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr
    return lines[0]


def _by_id(result: Result) -> dict[str, dict[str, object]]:
    assert result.returncode == 0, result.stderr
    return {p["id"]: p for p in result.json()["patches"]}


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        [
            "git",
            "-c",
            "user.name=rocmfix tests",
            "-c",
            "user.email=tests@rocmfix.invalid",
            "-c",
            "init.defaultBranch=main",
            *args,
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


# ---------------------------------------------------------------------------- editable vllm

_PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "vllm"
version = "{version}"

[tool.setuptools.packages.find]
include = ["vllm*"]
"""


@dataclass
class EditableEnv(InstalledEnv):
    checkout: Path

    def tracked(self) -> dict[str, bytes]:
        names = _git(self.checkout, "ls-files", "-z").split("\0")
        return {n: (self.checkout / n).read_bytes() for n in names if n}

    def git_status(self) -> str:
        return _git(self.checkout, "status", "--porcelain", "--untracked-files=all")


def _vllm_checkout(path: Path) -> None:
    """A git checkout holding vllm's real released target files, with a build config and
    package ``__init__`` files of our own (empty: nothing imports them)."""
    for rel, data in releases.wheel_members("vllm", VLLM_VERSION, VLLM_TARGETS).items():
        assert data is not None
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(data)
    for package in ("vllm", "vllm/model_executor", "vllm/model_executor/models"):
        (path / package / "__init__.py").write_text("")
    (path / "pyproject.toml").write_text(_PYPROJECT.format(version=VLLM_VERSION))
    (path / "setup.py").write_text("from setuptools import setup\n\nsetup()\n")
    _git(path, "init", "-q")
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "vllm target files")


@pytest.fixture
def editable_env(tmp_path: Path) -> Callable[[str], EditableEnv]:
    def make(kind: str) -> EditableEnv:
        root = tmp_path / f"editable-{kind}"
        checkout = tmp_path / f"vllm-src-{kind}"
        _vllm_checkout(checkout)
        python = releases.make_venv(root)
        releases.pip_install(
            python, releases.wheel("setuptools", SETUPTOOLS), releases.wheel("wheel", WHEEL)
        )
        if kind == "egg-link":
            command = [str(python), "setup.py", "develop", "--no-deps"]
        else:
            mode = ["--config-settings", "editable_mode=compat"] if kind == "pep660-pth" else []
            command = [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(python),
                "install",
                "--quiet",
                "--no-deps",
                "--no-index",
                "--no-build-isolation",
                *mode,
                "-e",
                str(checkout),
            ]
        subprocess.run(command, cwd=checkout, capture_output=True, check=True)
        site = releases.site_packages(python)
        target = checkout / VLLM_TARGETS[0]
        return EditableEnv(root, python, site, target, target.read_bytes(), checkout)

    return make


@pytest.mark.parametrize("kind", ["pep660-finder", "pep660-pth", "egg-link"])
def test_editable_checkout_round_trip(
    kind: str, editable_env: Callable[[str], EditableEnv]
) -> None:
    env = editable_env(kind)
    layout = {p.name for p in env.site.iterdir()}
    if kind == "egg-link":
        assert "vllm.egg-link" in layout and "easy-install.pth" in layout
    elif kind == "pep660-finder":
        assert any(n.startswith("__editable___vllm") and n.endswith("_finder.py") for n in layout)
    else:
        assert f"__editable__.vllm-{VLLM_VERSION}.pth" in layout
    tracked, git_before, site_before = env.tracked(), env.git_status(), files_under(env.site)

    status = _by_id(env.cli("status", "--json", "--only", "vllm"))
    for patch in VLLM_PATCHES:
        assert status[patch]["verdict"] == "applicable", status[patch]
        assert status[patch]["editable"] is True
        assert status[patch]["pristine"] == "git", "an unmodified tracked file is pristine"
        assert str(status[patch]["path"]).startswith(str(env.checkout))

    applied = env.cli("apply", "--only", "vllm")
    assert applied.returncode == 0, applied.stderr
    for rel in VLLM_TARGETS:
        assert (env.checkout / rel).read_bytes() != tracked[rel], "the checkout is patched"
    assert (env.checkout / VLLM_DROP).is_file(), "the kernels go beside the checked-out file"
    assert files_under(env.site) == site_before, "site-packages holds no vllm file to patch"
    after = _by_id(env.cli("status", "--json", "--only", "vllm"))
    assert {pid: p["verdict"] for pid, p in after.items()} == dict.fromkeys(VLLM_PATCHES, "applied")

    reverted = env.cli("revert")
    assert reverted.returncode == 0, reverted.stderr
    assert env.tracked() == tracked, "revert restores the checkout byte for byte"
    assert env.git_status() == git_before, "and leaves nothing untracked behind"
    assert files_under(env.site) == site_before
    assert not env.state.exists()


def test_editable_uncommitted_edit_is_refused_until_forced(
    editable_env: Callable[[str], EditableEnv],
) -> None:
    env = editable_env("pep660-finder")
    edited = env.original.replace(b"import torch\n", b"import torch  # a local experiment\n", 1)
    assert edited != env.original
    env.target.write_bytes(edited)

    status = _by_id(env.cli("status", "--json", "--only", "vllm-qwen2-vl"))["vllm-qwen2-vl"]
    assert status["verdict"] == "changed", status
    assert status["pristine"] == "git_modified"
    assert "uncommitted changes" in str(status["reason"])
    refused = env.cli("apply", "--only", "vllm-qwen2-vl")
    assert refused.returncode == 1
    assert "use --force" in _one_error_line(refused.stderr)
    assert env.target.read_bytes() == edited
    assert not env.state.exists()

    forced = env.cli("apply", "--force", "--only", "vllm-qwen2-vl")
    assert forced.returncode == 0, forced.stderr
    assert b"# a local experiment" in env.target.read_bytes()
    assert env.cli("revert").returncode == 0
    assert env.target.read_bytes() == edited, "revert gives back the edited bytes it found"
    assert not env.state.exists()


def test_editable_checkout_updated_by_git_is_stale_not_changed(
    editable_env: Callable[[str], EditableEnv],
) -> None:
    """A `git pull` over a patched checkout is a reinstall: apply patches the new file,
    revert keeps it (and does not put the old original back over it)."""
    env = editable_env("pep660-pth")
    assert env.cli("apply", "--only", "vllm-qwen2-vl").returncode == 0
    older = releases.wheel_members("vllm", "0.10.2", [VLLM_TARGETS[0]])[VLLM_TARGETS[0]]
    assert older is not None and older != env.original
    env.target.write_bytes(older)
    _git(env.checkout, "commit", "-q", "-am", "another vllm")

    status = _by_id(env.cli("status", "--json", "--only", "vllm-qwen2-vl"))["vllm-qwen2-vl"]
    assert status["verdict"] == "stale", status
    assert status["pristine"] == "git"
    reapplied = env.cli("apply", "--only", "vllm-qwen2-vl")
    assert reapplied.returncode == 0, reapplied.stderr
    assert "re-applied" in reapplied.stderr
    assert env.cli("revert").returncode == 0
    assert env.target.read_bytes() == older
    assert env.git_status() == _git(env.checkout, "status", "--porcelain")
    assert not (env.checkout / VLLM_DROP).exists()
    assert not env.state.exists()


def test_status_leaves_the_git_index_alone(editable_env: Callable[[str], EditableEnv]) -> None:
    """status only reads: its git check must not refresh (rewrite) the checkout's index."""
    env = editable_env("pep660-finder")
    stat = env.target.stat()
    os.utime(env.target, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    index = env.checkout / ".git" / "index"
    before = (index.read_bytes(), index.stat().st_mtime_ns)
    status = _by_id(env.cli("status", "--json", "--only", "vllm-qwen2-vl"))["vllm-qwen2-vl"]
    assert status["pristine"] == "git"
    assert (index.read_bytes(), index.stat().st_mtime_ns) == before
    assert not (env.checkout / ".git" / "index.lock").exists()


# ---------------------------------------------------------------------------- uv


def _uv(*args: str, env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "-m", "uv", *args],
        env={**os.environ, **env},
        capture_output=True,
        check=True,
    )


def test_uv_hardlinked_install_breaks_only_its_own_link(tmp_path: Path) -> None:
    """uv hard-links installed files from its cache: patching one environment must leave
    the cache and every other environment sharing it untouched, bytes and inodes."""
    uv_env = {
        "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
        "UV_LINK_MODE": "hardlink",
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_NO_CONFIG": "1",
        "UV_OFFLINE": "1",
    }
    wheel = releases.wheel("mineru-vl-utils", "0.1.13")
    envs = []
    for name in ("a", "b"):
        root = tmp_path / name
        _uv("venv", "--quiet", "--python", sys.executable, str(root), env=uv_env)
        python = root / "bin" / "python"
        _uv(
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--python",
            str(python),
            str(wheel),
            env=uv_env,
        )
        site = releases.site_packages(python)
        target = site / MINERU_TARGET
        envs.append(InstalledEnv(root, python, site, target, target.read_bytes()))
    a, b = envs
    info = next(b.site.glob("mineru_vl_utils-*.dist-info"))
    assert (info / "INSTALLER").read_text().strip() == "uv"
    cache_copies = [
        p
        for p in (tmp_path / "uv-cache").rglob("vllm_async_engine_client.py")
        if os.path.samefile(p, b.target)
    ]
    assert len(cache_copies) == 1, "uv hard-linked the installed file from its cache"
    cache_file = cache_copies[0]
    before = b.target.stat()
    assert os.path.samefile(a.target, b.target) and before.st_nlink == 3

    assert a.status("mineru-tokenizer")["pristine"] == "record"
    applied = a.cli("apply")
    assert applied.returncode == 0, applied.stderr
    assert a.target.read_bytes() != a.original
    assert a.target.stat().st_nlink == 1, "the patched file is a file of its own"
    after = b.target.stat()
    assert (after.st_ino, after.st_nlink) == (before.st_ino, before.st_nlink - 1)
    assert b.target.read_bytes() == b.original
    assert cache_file.read_bytes() == b.original
    assert os.path.samefile(cache_file, b.target)
    assert b.status("mineru-tokenizer")["verdict"] == "applicable"

    assert a.cli("revert").returncode == 0
    assert a.target.read_bytes() == a.original
    assert b.target.read_bytes() == b.original == cache_file.read_bytes()
    assert b.target.stat().st_nlink == before.st_nlink - 1
    assert not a.state.exists() and not b.state.exists()


# ---------------------------------------------------------------------------- conda


def conda_like_prefix(prefix: Path) -> Path:
    """An environment laid out the way conda lays one out, around this interpreter.

    No real conda can be used here: conda's channels are not reachable from this machine or
    CI (only PyPI, Debian and npm are), and neither conda nor micromamba nor a conda Python
    is on those. So the layout is simulated, as closely as rocmfix can tell:

    * ``bin/python3.X`` is a copy of the real interpreter binary and ``bin/python`` a link to
      it; there is no ``pyvenv.cfg``, so ``sys.prefix == sys.base_prefix ==`` the prefix and
      site-packages is ``lib/pythonX.Y/site-packages``, as in a conda environment;
    * ``lib/pythonX.Y`` holds the standard library (linked entry by entry from this Python's
      installation) and ``lib/`` links ``libpythonX.Y.so`` (conda ships it there);
    * ``conda-meta/history`` exists (conda's marker of an environment), and ``share/`` holds
      what the python package ships there (its man page).

    Returns the prefix's ``bin/python``.
    """
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (prefix / "bin").mkdir(parents=True)
    shutil.copy2(os.path.realpath(sys.executable), prefix / "bin" / version)
    (prefix / "bin" / "python").symlink_to(version)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    lib = prefix / "lib" / version
    (lib / "site-packages").mkdir(parents=True)
    for entry in stdlib.iterdir():
        if entry.name != "site-packages":
            (lib / entry.name).symlink_to(entry)
    libdir, library = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LDLIBRARY")
    for shared in Path(libdir or "/nonexistent").glob(f"{library or 'none'}*"):
        (prefix / "lib" / shared.name).symlink_to(shared)
    (prefix / "conda-meta").mkdir()
    (prefix / "conda-meta" / "history").write_text(
        f"==> 2026-01-01 00:00:00 <==\n# cmd: {prefix}\n"
    )
    man = prefix / "share" / "man" / "man1"
    man.mkdir(parents=True)
    (man / f"{version}.1").write_text(".TH PYTHON 1\n")
    return prefix / "bin" / "python"


def _conda_install(python: Path, project: str, version: str, pkgs: Path) -> Path:
    """Install a release as conda does: unpacked once into the package cache ``pkgs``, then
    hard-linked into the environment, with INSTALLER "conda" and a conda-meta record."""
    site = releases.site_packages(python)
    prefix = python.parent.parent
    releases.pip_install(python, releases.wheel(project, version))
    build = pkgs / f"{project}-{version}-pyhd8ed1ab_0"
    files = []
    for path in sorted(site.rglob("*")):
        if (
            path.is_file()
            and "__pycache__" not in path.parts
            and project.replace("-", "_") in (path.relative_to(site).parts[0])
        ):
            rel = path.relative_to(prefix)
            cached = build / rel
            cached.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(path, cached)
            os.link(cached, path)
            files.append(str(rel))
    info = next(site.glob(f"{project.replace('-', '_')}-*.dist-info"))
    installer = info / "INSTALLER"
    installer.unlink()  # a link into the cache: give it bytes of its own, as conda would
    installer.write_text("conda\n")
    record = (info / "RECORD").read_text()
    rel = f"{info.name}/INSTALLER"
    record = re.sub(
        rf"^{re.escape(rel)},.*$",
        f"{rel},sha256={_record_hash(b'conda' + bytes([10]))},6",
        record,
        flags=re.MULTILINE,
    )
    (info / "RECORD").unlink()
    (info / "RECORD").write_text(record)
    meta = {"name": project, "version": version, "build": "pyhd8ed1ab_0", "files": files}
    (prefix / "conda-meta" / f"{build.name}.json").write_text(json.dumps(meta))
    return site


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def test_conda_style_prefix(tmp_path: Path) -> None:
    python = conda_like_prefix(tmp_path / "conda" / "envs" / "mineru")
    pkgs = tmp_path / "conda" / "pkgs"
    site = _conda_install(python, "doclayout-yolo", "0.0.4", pkgs)
    prefix = python.parent.parent
    assert not (prefix / "pyvenv.cfg").exists()
    assert site == prefix / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / (
        "site-packages"
    )
    target = site / DOCLAYOUT_TARGET
    cached = next(pkgs.rglob("g2l_crm.py"))
    assert os.path.samefile(target, cached)
    env = InstalledEnv(prefix, python, site, target, target.read_bytes())
    before = files_under(site)

    doc = env.cli("status", "--json").json()
    assert doc["environment"]["prefix"] == str(prefix)
    status = {p["id"]: p for p in doc["patches"]}["doclayout-dilated-conv"]
    assert (status["verdict"], status["pristine"]) == ("applicable", "record")

    applied = env.cli("apply", "--only", "doclayout-yolo")
    assert applied.returncode == 0, applied.stderr
    assert (prefix / "share" / "rocmfix" / "manifest.json").is_file(), "state in the prefix"
    assert cached.read_bytes() == env.original, "the package cache is never written through"
    assert cached.stat().st_nlink == 1 and target.stat().st_nlink == 1
    assert env.cli("revert").returncode == 0
    assert files_under(site) == before
    assert cached.read_bytes() == env.original
    assert not env.state.exists()
    assert (prefix / "share" / "man").is_dir(), "revert removes rocmfix's folder, not share/"


# ---------------------------------------------------------------------------- reinstalls


def _pip(python: Path, *args: str) -> None:
    """pip as the test installs used it (no bytecode: RECORD would list the .pyc files)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), *args, "--no-compile"],
        capture_output=True,
        check=True,
    )


@pytest.mark.parametrize("then", ["apply", "revert"])
def test_force_reinstall_over_a_patch_is_stale(
    then: str, doclayout_env: Callable[[str], InstalledEnv]
) -> None:
    env = doclayout_env("0.0.4")
    drop = env.target.parent / "g2l_crm_triton.py"
    pristine = files_under(env.site)
    assert env.cli("apply", "--only", "doclayout-yolo").returncode == 0
    assert drop.is_file()

    wheel = releases.wheel("doclayout-yolo", "0.0.4")
    _pip(env.python, "install", "--force-reinstall", "--no-deps", "--no-index", str(wheel))
    assert env.target.read_bytes() == env.original
    assert not drop.exists(), "pip removed the dropped file, listed in RECORD"
    status = env.status("doclayout-dilated-conv")
    assert status["verdict"] == "stale", status
    assert "reinstalled over the patch" in str(status["reason"])

    if then == "apply":
        again = env.cli("apply", "--only", "doclayout-yolo")
        assert again.returncode == 0, again.stderr
        assert "re-applied" in again.stderr
        assert env.status("doclayout-dilated-conv")["verdict"] == "applied"
        assert drop.is_file()
    reverted = env.cli("revert")
    assert reverted.returncode == 0, reverted.stderr
    assert files_under(env.site) == pristine, "no dropped file, RECORD line or byte left"
    assert not env.state.exists()


def test_upgrade_over_a_patch(mineru_env: Callable[[str], InstalledEnv]) -> None:
    """pip installs another release over a patched one: stale (needs the patch again) or,
    for a release fixed upstream, not needed; revert forgets the old patch either way."""
    env = mineru_env("0.1.12")
    assert env.cli("apply").returncode == 0
    _pip(
        env.python,
        "install",
        "--no-deps",
        "--no-index",
        str(releases.wheel("mineru-vl-utils", "0.1.13")),
    )
    status = env.status("mineru-tokenizer")
    assert status["verdict"] == "stale"
    assert "(rocmfix patched 0.1.12)" in str(status["reason"])
    assert env.cli("apply").returncode == 0
    assert env.status("mineru-tokenizer")["verdict"] == "applied"

    fixed = releases.wheel("mineru-vl-utils", "0.1.14")
    _pip(env.python, "install", "--no-deps", "--no-index", str(fixed))
    shipped = zipfile.ZipFile(fixed).read(MINERU_TARGET)
    status = env.status("mineru-tokenizer")
    assert status["verdict"] == "not-needed"
    assert "`rocmfix revert` removes what the old patch left behind" in str(status["reason"])
    assert env.cli("revert").returncode == 0
    assert env.target.read_bytes() == shipped
    assert not env.state.exists()


# ---------------------------------------------------------------------------- permissions


def test_readonly_state_folder(mineru_env: Callable[[str], InstalledEnv]) -> None:
    env = mineru_env("0.1.13")
    assert env.cli("apply").returncode == 0
    before = files_under(env.root)
    python = ["--python", str(env.python)]

    status = run_cli_readonly([env.state], "status", "--json", *python)
    assert _by_id(status)["mineru-tokenizer"]["verdict"] == "applied"
    unchanged = run_cli_readonly([env.state], "apply", *python)
    assert unchanged.returncode == 0, "nothing to do needs no write access"
    refused = run_cli_readonly([env.state], "revert", *python)
    assert refused.returncode == 1
    line = _one_error_line(refused.stderr)
    assert "cannot keep rocmfix's state in" in line
    assert ("read-only file system" if os.geteuid() == 0 else "not writable") in line
    # Not "run rocmfix as root, who owns it" to root on a read-only mount (issue 43).
    assert ("mounted read-write" in refused.stderr) == (os.geteuid() == 0), refused.stderr
    assert files_under(env.root) == before, "nothing outside or inside the state changed"


def test_readonly_share_folder_on_first_apply(mineru_env: Callable[[str], InstalledEnv]) -> None:
    env = mineru_env("0.1.13")
    (env.root / "share").mkdir()
    before = files_under(env.root)
    refused = run_cli_readonly([env.root / "share"], "apply", "--python", str(env.python))
    assert refused.returncode == 1
    assert "cannot keep rocmfix's state in" in _one_error_line(refused.stderr)
    assert files_under(env.root) == before
    assert not env.state.exists()


_NOBODY = 65534


def _as_nobody(*args: str) -> Result:
    """The CLI as an ordinary user (uid 65534) who may read everything (DAC_READ_SEARCH,
    so this Python under /root still runs) but write only what that user owns."""
    assert os.geteuid() == 0
    done = subprocess.run(
        [
            "setpriv",
            f"--reuid={_NOBODY}",
            f"--regid={_NOBODY}",
            "--clear-groups",
            "--inh-caps=+dac_read_search",
            "--ambient-caps=+dac_read_search",
            sys.executable,
            "-m",
            "rocmfix",
            *args,
        ],
        capture_output=True,
        env={
            **os.environ,
            "PYTHONPATH": PYTHONPATH,
            "COLUMNS": "200",
            "XDG_CACHE_HOME": "/nonexistent",
        },
        cwd="/",
        check=False,
    )
    return Result(
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
        done.stdout,
    )


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder every user can reach (pytest's tmp_path is private to its owner)."""
    path = Path(tempfile.mkdtemp(prefix="rocmfix-owner-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def other_users_env(open_dir: Path) -> InstalledEnv:
    python = conda_like_prefix(open_dir / "prefix")
    releases.pip_install(python, releases.wheel("doclayout-yolo", "0.0.4"))
    site = releases.site_packages(python)
    target = site / DOCLAYOUT_TARGET
    return InstalledEnv(python.parent.parent, python, site, target, target.read_bytes())


def test_prefix_owned_by_root_refuses_an_ordinary_user(other_users_env: InstalledEnv) -> None:
    env = other_users_env
    before = files_under(env.root)
    if os.geteuid() == 0:
        status, apply = (_as_nobody(c, "--python", str(env.python)) for c in ("status", "apply"))
        expected = "not writable by this user (owned by root)"
    else:
        # An ordinary user cannot make a root-owned prefix; one they may not write is the same.
        for path in (env.root, env.root / "share", env.target.parent):
            path.chmod(0o555)
        try:
            status, apply = env.cli("status"), env.cli("apply")
        finally:
            for path in (env.root, env.root / "share", env.target.parent):
                path.chmod(0o755)
        expected = "not writable by this user"
    assert status.returncode == 0, status.stderr
    assert "applicable" in status.stdout
    assert apply.returncode == 1
    line = _one_error_line(apply.stderr)
    assert "cannot keep rocmfix's state in" in line and expected in line, line
    assert files_under(env.root) == before


def test_root_patching_a_users_env_leaves_it_theirs(other_users_env: InstalledEnv) -> None:
    """`sudo rocmfix apply` on someone's environment: every file and folder rocmfix creates
    belongs to the environment's owner, who can then revert it without root."""
    if os.geteuid() != 0:
        pytest.fail("this test needs root (CI runs as root); it runs `sudo rocmfix` itself")
    env = other_users_env
    for path in [env.root, *env.root.rglob("*")]:
        os.lchown(path, _NOBODY, _NOBODY)
    before = files_under(env.root)
    applied = env.cli("apply", "--only", "doclayout-yolo")
    assert applied.returncode == 0, applied.stderr
    owned_by_root = [str(p) for p in env.root.rglob("*") if p.lstat().st_uid != _NOBODY]
    assert not owned_by_root, owned_by_root

    assert "applied" in _as_nobody("status", "--python", str(env.python)).stdout
    reverted = _as_nobody("revert", "--python", str(env.python))
    assert reverted.returncode == 0, reverted.stderr
    assert files_under(env.root) == before
    assert not env.state.exists()


# ---------------------------------------------------------------------------- encodings


def _tabs(data: bytes) -> bytes:
    out = []
    for line in data.split(b"\n"):
        spaces = len(line) - len(line.lstrip(b" "))
        out.append(b"\t" * (spaces // 4) + line[spaces // 4 * 4 :])
    return b"\n".join(out)


CONVERSIONS: dict[str, Callable[[bytes], bytes]] = {
    "crlf": lambda data: data.replace(b"\n", b"\r\n"),
    "bom": lambda data: b"\xef\xbb\xbf" + data,
    # A coding cookie and a byte that is not UTF-8 (e acute in latin-1) in a comment.
    "latin-1": lambda data: b"# -*- coding: latin-1 -*-\n# caf\xe9 au lait\n" + data,
    "tabs": _tabs,
}


@pytest.fixture
def all_targets_env(tmp_path: Path) -> InstalledEnv:
    """One environment with every target file: mineru-vl-utils 0.1.13, doclayout-yolo
    0.0.4 and vllm's three files from 0.11.0."""
    root = tmp_path / "all"
    python = releases.make_venv(root)
    releases.pip_install(
        python,
        releases.wheel("mineru-vl-utils", "0.1.13"),
        releases.wheel("doclayout-yolo", "0.0.4"),
    )
    site = releases.partial_install(
        python, "vllm", VLLM_VERSION, [*VLLM_TARGETS, "vllm/__init__.py"]
    )
    target = site / MINERU_TARGET
    return InstalledEnv(root, python, site, target, target.read_bytes())


def _rewrite_record(site: Path, rel: str, data: bytes) -> None:
    """Make ``data`` the file's bytes as installed: its RECORD line says so."""
    record = next(
        info / "RECORD"
        for info in site.glob("*.dist-info")
        if rel.encode() in (info / "RECORD").read_bytes()
    )
    lines = record.read_bytes().splitlines(keepends=True)
    prefix = rel.encode() + b","
    new = b"%s,sha256=%s,%d" % (rel.encode(), _record_hash(data).encode(), len(data))
    assert sum(line.startswith(prefix) for line in lines) == 1
    record.write_bytes(
        b"".join(
            new + line[len(line.rstrip(b"\r\n")) :] if line.startswith(prefix) else line
            for line in lines
        )
    )


def test_line_ends_bom_coding_cookie_and_tabs_survive(all_targets_env: InstalledEnv) -> None:
    env = all_targets_env
    targets = [MINERU_TARGET, DOCLAYOUT_TARGET, *VLLM_TARGETS]
    original = {rel: (env.site / rel).read_bytes() for rel in targets}
    assert env.cli("apply").returncode == 0
    patched = {rel: (env.site / rel).read_bytes() for rel in targets}
    assert all(patched[rel] != original[rel] for rel in targets)
    assert env.cli("revert").returncode == 0
    assert {rel: (env.site / rel).read_bytes() for rel in targets} == original

    for name, convert in CONVERSIONS.items():
        for rel in targets:
            converted = convert(original[rel])
            assert converted != original[rel]
            (env.site / rel).write_bytes(converted)
            _rewrite_record(env.site, rel, converted)
        before = files_under(env.site)
        statuses = _by_id(env.cli("status", "--json"))
        # DocLayout-YOLO's 1x1 conv patch waits for a measurement (no GPU here): apply
        # leaves its file alone, as it leaves every file of a patch that reads unmeasured.
        installed = {
            p: s for p, s in statuses.items() if s["verdict"] not in ("not-installed", "unmeasured")
        }
        assert len(installed) == len(targets)
        for patch, status in installed.items():
            assert (status["verdict"], status["pristine"]) == ("applicable", "record"), (
                name,
                patch,
                status,
            )
        applied = env.cli("apply")
        assert applied.returncode == 0, (name, applied.stderr)
        for rel in targets:
            # Only the rewritten region differs: the patched converted file is the converted
            # patched file, every other byte (line ends, BOM, cookie, tabs) as it was.
            assert (env.site / rel).read_bytes() == convert(patched[rel]), (name, rel)
        reverted = env.cli("revert")
        assert reverted.returncode == 0, (name, reverted.stderr)
        assert files_under(env.site) == before, name
        assert not env.state.exists()
