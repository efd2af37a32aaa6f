"""The wheel carries patches and templates, and works when installed somewhere else."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import ROOT, InstalledEnv

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(out),
            str(ROOT),
        ],
        check=True,
    )
    (found,) = out.glob("rocmfix-*.whl")
    return found


def test_wheel_carries_patches_and_templates(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in ("patches", "templates"):
        for path in sorted((ROOT / folder).glob("*.py")):
            assert f"rocmfix/{folder}/{path.name}" in names
    for module in ("probe", "worker", "doctor", "tune", "harness/patch_embed"):
        assert f"rocmfix/guest/{module}.py" in names
    assert not any(name.startswith(("tests/", "patches/", "templates/")) for name in names)


def test_wheel_works_from_a_fresh_venv(
    wheel: Path, tmp_path: Path, vllm_env: Callable[..., InstalledEnv]
) -> None:
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", str(fresh)], check=True)
    subprocess.run(
        [str(fresh / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)], check=True
    )
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}

    def rocmfix(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(fresh / "bin" / "rocmfix"), *args],
            capture_output=True,
            text=True,
            env=clean,
            cwd=tmp_path,
            check=False,
        )

    helped = rocmfix("--help")
    assert helped.returncode == 0, helped.stderr
    for command in ("status", "apply", "revert"):
        assert command in helped.stdout
    own = rocmfix("status")
    assert own.returncode == 0, own.stderr
    assert "not installed" in own.stdout

    # The installed copy must find its templates: apply a scheme that drops one, and revert.
    env = vllm_env("0.11.0")
    applied = rocmfix("apply", "--python", str(env.python), "--only", "vllm-qwen2-vl")
    assert applied.returncode == 0, applied.stderr
    assert (env.site / "vllm/model_executor/models/qwen2_vl_vision_kernels.py").is_file()
    assert rocmfix("revert", "--python", str(env.python)).returncode == 0
    assert env.target.read_bytes() == env.original
    module = subprocess.run(
        [str(fresh / "bin" / "python"), "-m", "rocmfix", "--version"],
        capture_output=True,
        text=True,
        env=clean,
        check=False,
    )
    assert module.returncode == 0
    assert re.fullmatch(r"rocmfix \d+\.\d+\.\d+\n", module.stdout)


def test_runtime_dependencies_stay_light() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    dependencies = text.split("dependencies = [", 1)[1].split("]", 1)[0]
    names = set(re.findall(r'"([A-Za-z0-9_.-]+)', dependencies))
    assert names == {"typer", "libcst", "rich", "packaging"}


@pytest.mark.network
def test_the_readmes_first_command_installs_and_runs(tmp_path: Path) -> None:
    """The README's first line, as a newcomer pastes it: a virtual environment of rocmfix's
    own (so a PEP 668 system Python does not refuse it), an install from the checkout, and a
    status that names the environment and says where to point rocmfix next."""
    readme = (ROOT / "README.md").read_text().split("---", 1)[0]
    first = next(line.strip() for line in readme.splitlines() if line.startswith("    "))
    assert first.startswith("python3 -m venv ~/.rocmfix")
    home = tmp_path / "home"
    home.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # `python3` is a CPython 3.10+ without rocmfix's dependencies (this test's own base Python).
    (bin_dir / "python3").symlink_to(Path(sys.base_prefix) / "bin" / "python3")
    done = subprocess.run(
        ["bash", "-c", first],
        cwd=ROOT,
        env={"HOME": str(home), "PATH": f"{bin_dir}:/usr/bin:/bin", "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"\nEnvironment {home}/.rocmfix/bin/python" in done.stdout
    assert "point rocmfix at the environment that runs MinerU" in done.stderr
    assert (home / ".rocmfix" / "bin" / "rocmfix").exists()
