from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# Without a GPU, Triton runs only in its interpreter, and triton.language's own @jit helpers
# are made interpreted or compiled when triton is first imported: whichever test module
# imports triton first would otherwise decide for all the others.
os.environ.setdefault("TRITON_INTERPRET", "1")

import releases

ROOT = Path(__file__).resolve().parents[1]
MINERU_TARGET = "mineru_vl_utils/vlm_client/vllm_async_engine_client.py"
DOCLAYOUT_TARGET = "doclayout_yolo/nn/modules/g2l_crm.py"
# Resolved before any test moves XDG_CACHE_HOME, so downloads are shared across tests.
DOWNLOAD_CACHE = releases.cache_dir()


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    stdout_bytes: bytes

    def json(self) -> Any:
        return json.loads(self.stdout)


def run_cli(
    *args: str,
    env: dict[str, str] | None = None,
    user: str | None = None,
    timeout: float = 120,
) -> Result:
    """The real CLI in a subprocess, the way a user runs it."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env or {})}
    done = subprocess.run(
        [sys.executable, "-m", "rocmfix", *args],
        capture_output=True,
        env=full_env,
        cwd="/",
        timeout=timeout,
        user=user,
        check=False,
    )
    return Result(
        returncode=done.returncode,
        stdout=done.stdout.decode("utf-8", "replace"),
        stderr=done.stderr.decode("utf-8", "replace"),
        stdout_bytes=done.stdout,
    )


def run_cli_readonly(paths: list[Path], *args: str) -> Result:
    """Run the CLI with ``paths`` read-only: a read-only bind mount in a private mount
    namespace as root (root writes through permission bits), chmod otherwise."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    if os.geteuid() == 0:
        assert shutil.which("unshare"), "running as root needs unshare(1) for read-only mounts"
        script = (
            'for p in $PATHS; do mount --bind "$p" "$p" && mount -o remount,bind,ro "$p" "$p" '
            '|| exit 90; done; exec "$@"'
        )
        done = subprocess.run(
            [
                "unshare",
                "--mount",
                "sh",
                "-c",
                script,
                "sh",
                sys.executable,
                "-m",
                "rocmfix",
                *args,
            ],
            capture_output=True,
            env={**full_env, "PATHS": " ".join(map(str, paths))},
            cwd="/",
            check=False,
        )
        assert done.returncode != 90, done.stderr
    else:
        modes = {p: p.stat().st_mode for p in paths}
        for p in paths:
            p.chmod(0o555)
        try:
            done = subprocess.run(
                [sys.executable, "-m", "rocmfix", *args],
                capture_output=True,
                env=full_env,
                cwd="/",
                check=False,
            )
        finally:
            for p, mode in modes.items():
                p.chmod(mode)
    return Result(
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
        done.stdout,
    )


@dataclass
class InstalledEnv:
    """A virtual environment with one real release installed by pip."""

    root: Path
    python: Path
    site: Path
    target: Path
    original: bytes

    def cli(self, *args: str, **kwargs: Any) -> Result:
        return run_cli(*args, "--python", str(self.python), **kwargs)

    def status(self, patch: str) -> dict[str, Any]:
        result = self.cli("status", "--json")
        assert result.returncode == 0, result.stderr
        by_id = {p["id"]: p for p in result.json()["patches"]}
        entry: dict[str, Any] = by_id[patch]
        return entry

    @property
    def state(self) -> Path:
        return self.root / "share" / "rocmfix"


def install_release(root: Path, project: str, version: str, target: str) -> InstalledEnv:
    """A fresh venv with one released wheel installed by pip, as a user would have it."""
    python = releases.make_venv(root)
    releases.pip_install(python, releases.wheel(project, version))
    site = releases.site_packages(python)
    path = site / target
    return InstalledEnv(root, python, site, path, path.read_bytes() if path.exists() else b"")


@pytest.fixture
def mineru_env(tmp_path: Path) -> Callable[[str], InstalledEnv]:
    def make(version: str) -> InstalledEnv:
        return install_release(
            tmp_path / f"mineru-{version}", "mineru-vl-utils", version, MINERU_TARGET
        )

    return make


@pytest.fixture
def doclayout_env(tmp_path: Path) -> Callable[[str], InstalledEnv]:
    def make(version: str) -> InstalledEnv:
        return install_release(
            tmp_path / f"doclayout-{version}", "doclayout-yolo", version, DOCLAYOUT_TARGET
        )

    return make


VLLM_MODELS = "vllm/model_executor/models"
VLLM_TARGETS = [f"{VLLM_MODELS}/{name}" for name in ("qwen2_vl.py", "qwen2_5_vl.py", "qwen3_vl.py")]


def fake_torch(site: Path, version: str, hip: str | None = None, cuda: str | None = None) -> None:
    """Metadata of a torch build (what the probe reads), never torch itself."""
    info = site / f"torch-{version.split('+')[0]}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    (info / "RECORD").write_text("")
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("")
    (site / "torch" / "version.py").write_text(
        f"__version__ = {version!r}\nhip = {hip!r}\ncuda = {cuda!r}\n"
    )


@pytest.fixture
def vllm_env(tmp_path: Path) -> Callable[..., InstalledEnv]:
    """A venv holding vllm's three target files (and its real METADATA/RECORD) from the
    released wheel, as pip would have laid them out; the rest of the 400 MB stays on PyPI."""

    def make(version: str, torch: str | None = None, hip: str | None = None) -> InstalledEnv:
        root = tmp_path / f"vllm-{version}-{torch}"
        python = releases.make_venv(root)
        site = releases.partial_install(
            python, "vllm", version, [*VLLM_TARGETS, "vllm/__init__.py"]
        )
        if torch is not None:
            fake_torch(site, torch, hip=hip)
        target = site / VLLM_TARGETS[0]
        return InstalledEnv(root, python, site, target, target.read_bytes())

    return make


def patch_p1(diff: bytes, cwd: Path) -> int:
    """Apply a diff the way the README tells CI users to: ``patch -p1`` from site-packages."""
    return subprocess.run(["patch", "-p1", "--quiet"], input=diff, cwd=cwd, check=False).returncode


def files_under(path: Path) -> dict[str, bytes]:
    """Every file below ``path`` with its bytes, bytecode caches excluded."""
    return {
        str(p.relative_to(path)): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Logs and tuned configs go to the user's dirs; keep tests out of the real ones.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("ROCMFIX_TEST_CACHE", str(DOWNLOAD_CACHE))
