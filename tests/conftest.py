from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

# Without a GPU, Triton runs only in its interpreter, and triton.language's own @jit helpers
# are made interpreted or compiled when triton is first imported: whichever test module
# imports triton first would otherwise decide for all the others.
os.environ.setdefault("TRITON_INTERPRET", "1")

import forkserver

from rocmfix import fsops
from rocmfix.guest import templates as _templates
from rocmfix.manifest import ManifestEntry

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


# The CLI tests are about rocmfix, not the GPU: they see none, so they run the same on a GPU
# host as in CI. tests/test_gpu.py runs doctor and tune on a real one (it passes its own env).
NO_GPU = {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": ""}
# rocmfix from this checkout, ahead of whatever PYTHONPATH the runner already had.
PYTHONPATH = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)


# What the fork servers start with (tests/forkserver.py); ROCMFIX_TESTS_NO_FORK=1 runs every
# call through a fresh interpreter instead.
_FORK_BASE = {**os.environ, "PYTHONPATH": PYTHONPATH}
_FORK = not os.environ.get("ROCMFIX_TESTS_NO_FORK")


def run_cli(
    *args: str,
    env: dict[str, str] | None = None,
    user: str | None = None,
    timeout: float = 120,
) -> Result:
    """The real CLI in a process of its own, the way a user runs it: forked from a server
    that imported it once (tests/forkserver.py), or a fresh interpreter where a fork cannot
    stand for one (another user, or variables only an interpreter start reads)."""
    full_env = {**os.environ, "PYTHONPATH": PYTHONPATH, "COLUMNS": "200", **NO_GPU, **(env or {})}
    if _FORK and user is None and forkserver.usable(full_env, _FORK_BASE):
        with tempfile.TemporaryDirectory(prefix="rocmfix-cli-") as tmp:
            out, err = Path(tmp, "out"), Path(tmp, "err")
            out.touch()
            err.touch()
            code = forkserver.run(list(args), full_env, _FORK_BASE, out, err, timeout)
            stdout = out.read_bytes()
            return Result(
                returncode=code,
                stdout=stdout.decode("utf-8", "replace"),
                stderr=err.read_bytes().decode("utf-8", "replace"),
                stdout_bytes=stdout,
            )
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
    full_env = {**os.environ, "PYTHONPATH": PYTHONPATH, "COLUMNS": "200"}
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


# What the files of one unit each (test_manifest_trust, test_lock, test_recovery,
# test_target_files, test_cli_contract) share: one small release, and places beside it that
# nothing may touch.
@pytest.fixture
def env(mineru_env: Callable[[str], InstalledEnv]) -> InstalledEnv:
    return mineru_env("0.1.13")


@pytest.fixture
def canary(env: InstalledEnv) -> Path:
    """A file beside the environment that nothing may ever touch."""
    path = env.root.parent / "outside" / "canary.txt"
    path.parent.mkdir()
    path.write_text("nobody writes here\n")
    return path


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A folder outside every environment that nothing may ever touch."""
    folder = tmp_path / "victim"
    folder.mkdir()
    (folder / "precious.txt").write_text("nobody writes here\n")
    (folder / "notes.md").write_text("nor here\n")
    return folder


def one_error_line(stderr: str) -> str:
    """The run's one ``error:`` line; a run that fails says why once."""
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr
    return lines[0]


VLLM_MODELS = "vllm/model_executor/models"
VLLM_TARGETS = [f"{VLLM_MODELS}/{name}" for name in ("qwen2_vl.py", "qwen2_5_vl.py", "qwen3_vl.py")]
# What the verdicts read besides the targets: the Conv3dLayer gate (vllm >= 0.11.1).
VLLM_CONV = "vllm/model_executor/layers/conv.py"


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


def measured_vit(torch: str, hip: str, speedups: dict[str, float]) -> None:
    """What ``rocmfix doctor --op vit-attention`` stores on a gfx1100 (each scheme's speed-up
    over vLLM's stock SDPA), in the isolated home's measured.json; read where the test sets
    ``HSA_OVERRIDE_GFX_VERSION=11.0.0``."""
    best = max(speedups, key=lambda s: speedups[s])
    entry = {"arch": "gfx1100", "torch": torch, "hip": hip, "scheme": best,
             "speedup": speedups[best], "speedups": speedups,
             "measured_at": "2026-11-27"}  # fmt: skip
    file = Path(os.environ["XDG_CONFIG_HOME"]) / "rocmfix" / "measured.json"
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps({"schema": 1, "ops": {"vit-attention": {"k": entry}}}))


@pytest.fixture
def vllm_env(tmp_path: Path) -> Callable[..., InstalledEnv]:
    """A venv holding vllm's three target files (and its real METADATA/RECORD) from the
    released wheel, as pip would have laid them out; the rest of the 400 MB stays on PyPI."""

    def make(version: str, torch: str | None = None, hip: str | None = None) -> InstalledEnv:
        root = tmp_path / f"vllm-{version}-{torch}"
        python = releases.make_venv(root)
        site = releases.partial_install(
            python, "vllm", version, [*VLLM_TARGETS, VLLM_CONV, "vllm/__init__.py"]
        )
        if torch is not None:
            fake_torch(site, torch, hip=hip)
        target = site / VLLM_TARGETS[0]
        return InstalledEnv(root, python, site, target, target.read_bytes())

    return make


def require(condition: bool, reason: str) -> None:
    """Skip a test that lacks what it needs, except in CI (``ROCMFIX_CI``, set by .ci/run),
    which installs everything the suite needs: there a missing need is a failure."""
    if condition:
        return
    if os.environ.get("ROCMFIX_CI"):
        pytest.fail(f"{reason} (CI must provide it)")
    pytest.skip(reason)


TRANSFORMERS_MODELS = "transformers/models"


@pytest.fixture
def transformers_env(tmp_path: Path) -> Callable[..., InstalledEnv]:
    """A venv holding every modeling file rocmfix patches (those the release has) with the
    release's real METADATA/RECORD, as pip would have laid them out."""
    from rocmfix.registry import all_patches

    def make(version: str, torch: str | None = None, hip: str | None = None) -> InstalledEnv:
        root = tmp_path / f"transformers-{version}-{torch}"
        python = releases.make_venv(root)
        files = [p.path for p in all_patches() if p.distribution == "transformers"]
        packages = ["transformers/__init__.py", f"{TRANSFORMERS_MODELS}/__init__.py"]
        packages += [f.rsplit("/", 1)[0] + "/__init__.py" for f in files]
        site = releases.partial_install(python, "transformers", version, files + packages)
        if torch is not None:
            fake_torch(site, torch, hip=hip)
        target = site / files[0]
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


TEMPLATES = ROOT / "templates"


def load_template(
    name: str,
    *,
    interpret: bool | None = True,
    block_triton: bool = False,
    env: dict[str, str | None] | None = None,
) -> ModuleType:
    """A fresh import of a template (and of the config module beside it), the way the worker
    loads them. TRITON_INTERPRET and ``env`` hold only during the import: triton chooses
    interpreter or compiler when the kernels are decorated. ``block_triton`` makes
    ``import triton`` fail, as on a machine without it."""
    settings = dict(env or {})
    if interpret is not None:
        settings["TRITON_INTERPRET"] = "1" if interpret else "0"
    saved = {key: os.environ.get(key) for key in settings}
    saved_triton = {
        k: v for k, v in sys.modules.items() if k == "triton" or k.startswith("triton.")
    }
    if block_triton:
        for key in saved_triton:
            del sys.modules[key]
        sys.modules["triton"] = None  # type: ignore[assignment]  # makes `import triton` fail
    try:
        for key, value in settings.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        return _templates.load(str(TEMPLATES), name, fresh=True)
    finally:
        if block_triton:
            del sys.modules["triton"]
            sys.modules.update(saved_triton)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# Files that take minutes (a fault sweep, the compat sample, whole-model forwards) go first,
# longest first (by the full run's --durations): the workers start on them while the short
# files fill in behind, instead of one worker finishing the run alone on a long file it drew
# last.
SLOW_FIRST = (
    "test_compat.py",
    "test_faults.py",
    "test_mineru_graphs_layout.py",
    "test_profile.py",
    "test_mineru_ocr.py",
    "test_tune.py",
    "test_kernels_aot.py",
    "test_profile_report.py",
    "test_doclayout_e2e.py",
    "test_compile_models.py",
    "test_lock.py",
    "test_transformers_model.py",
    "test_transformers.py",
    "test_doctor.py",
    "test_mineru_graphs.py",
    "test_vllm.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


# ---------------------------------------------------------------- in-process unit tests
# Shared by test_fsops_units and test_transaction.


@pytest.fixture
def no_kernel_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No developer's tuned file or ROCMFIX_*_CONFIG leaks into a kernel test: the shipped
    tiles, whatever this machine holds."""
    monkeypatch.setenv("ROCMFIX_TUNED_FILE", str(tmp_path / "absent.json"))
    for name in ("DEPTHWISE_CONV", "DILATED_CONV", "PATCH_EMBED"):
        monkeypatch.delenv(f"ROCMFIX_{name}_CONFIG", raising=False)


@pytest.fixture
def no_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    """No fault-injection hooks from the environment, and the write points counted afresh."""
    monkeypatch.delenv(fsops.TEST_HOOKS_ENV, raising=False)
    monkeypatch.setattr(fsops, "_write_points", 0)


@pytest.fixture
def umask() -> Iterator[Callable[[int], None]]:
    old = os.umask(0o022)
    os.umask(old)

    def set_mask(mask: int) -> None:
        os.umask(mask)

    yield set_mask
    os.umask(old)


def file_mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def manifest_entry() -> ManifestEntry:
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
