"""Known conflicts, `rocmfix env`, `rocmfix list` and the first five minutes.

Conflicting distributions are made of metadata only (a dist-info folder and the one file the
probe reads): the checks read metadata and never import what they look at.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rocmfix.ops import OPS
from rocmfix.registry import all_patches, scheme_names

from conftest import PYTHONPATH, InstalledEnv, fake_torch, measured_vit, require, run_cli

pytestmark = pytest.mark.network
ECHO = 'echo "$TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL $MINERU_MODEL_SOURCE"'


def fake_distribution(
    site: Path, name: str, version: str, requires: tuple[str, ...] = (), files: tuple[str, ...] = ()
) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    (info / "RECORD").write_text("")
    for rel in files:
        (site / rel).mkdir(parents=True, exist_ok=True)


def _warnings(env: InstalledEnv) -> dict[str, dict[str, str]]:
    result = env.cli("status", "--json")
    assert result.returncode == 0, result.stderr
    return {w["code"]: w for w in result.json()["warnings"]}


@pytest.fixture
def doclayout(doclayout_env: Callable[[str], InstalledEnv]) -> Callable[[], InstalledEnv]:
    return lambda: doclayout_env("0.0.4")


def test_cuda_torch_is_not_rocm(doclayout: Callable[[], InstalledEnv]) -> None:
    env = doclayout()
    fake_torch(env.site, "2.9.0+cu128", cuda="12.8")
    fake_distribution(env.site, "triton", "3.5.0")
    warnings = _warnings(env)
    assert "CUDA 12.8 build" in warnings["torch-not-rocm"]["message"]
    assert "--force" in warnings["torch-not-rocm"]["advice"]
    status = env.status("doclayout-dilated-conv")
    assert status["verdict"] == "not-needed"
    assert "is for ROCm" in status["reason"]
    table = env.cli("status")
    # Said once, first: what a newcomer on a machine without ROCm needs (issue 43).
    assert table.stdout.splitlines()[1].startswith("No ROCm torch here"), table.stdout

    skipped = env.cli("apply")
    assert skipped.returncode == 0
    assert skipped.stderr.startswith("No ROCm torch here (torch 2.9.0+cu128 is a CUDA 12.8 build)")
    assert env.target.read_bytes() == env.original
    forced = env.cli("apply", "--force")
    assert forced.returncode == 0, forced.stderr
    assert env.target.read_bytes() != env.original
    assert env.status("doclayout-dilated-conv")["verdict"] == "applied"
    assert env.cli("revert").returncode == 0
    assert env.target.read_bytes() == env.original


def test_rocm_torch_without_triton_refuses_triton_schemes(
    doclayout: Callable[[], InstalledEnv],
) -> None:
    env = doclayout()
    fake_torch(env.site, "2.10.0+rocm7.0", hip="7.0.51831")
    warnings = _warnings(env)
    assert set(warnings) == {"triton-missing"}
    assert "--scheme linear" in warnings["triton-missing"]["advice"]
    refused = env.cli("apply")
    assert refused.returncode == 1
    assert "no Triton in this environment for the gemm scheme" in refused.stderr
    assert env.target.read_bytes() == env.original
    linear = env.cli("apply", "--scheme", "linear")
    assert linear.returncode == 0, linear.stderr
    assert env.status("doclayout-dilated-conv")["scheme"] == "linear"


def test_two_tritons_shadow_each_other(doclayout: Callable[[], InstalledEnv]) -> None:
    env = doclayout()
    fake_torch(env.site, "2.10.0+rocm7.0", hip="7.0.51831")
    fake_distribution(env.site, "triton", "3.5.0")
    fake_distribution(env.site, "pytorch-triton-rocm", "3.5.0+gitbbb06c03")
    warnings = _warnings(env)
    assert "triton-shadowed" in warnings
    assert "pytorch-triton-rocm 3.5.0+gitbbb06c03" in warnings["triton-shadowed"]["message"]
    assert "triton-missing" not in warnings


def test_flash_attn_triton_backend_on_rocm(doclayout: Callable[[], InstalledEnv]) -> None:
    env = doclayout()
    fake_torch(env.site, "2.10.0+rocm7.0", hip="7.0.51831")
    fake_distribution(env.site, "pytorch-triton-rocm", "3.5.0")
    fake_distribution(env.site, "flash-attn", "2.8.3", files=("flash_attn/flash_attn_triton_amd",))
    warnings = _warnings(env)
    assert "pip uninstall flash-attn" in warnings["flash-attn-triton"]["advice"]


def test_flash_attn_without_triton_backend_is_fine(doclayout: Callable[[], InstalledEnv]) -> None:
    env = doclayout()
    fake_torch(env.site, "2.10.0+rocm7.0", hip="7.0.51831")
    fake_distribution(env.site, "pytorch-triton-rocm", "3.5.0")
    fake_distribution(env.site, "flash-attn", "2.8.3", files=("flash_attn",))
    assert _warnings(env) == {}


def test_mixed_torch_and_vllm(vllm_env: Callable[..., InstalledEnv], tmp_path: Path) -> None:
    env = vllm_env("0.10.2")  # its wheel pins torch==2.8.0
    elsewhere = tmp_path / "other-site"
    fake_torch(elsewhere, "2.10.0+rocm7.0", hip="7.0.51831")
    (env.site / "elsewhere.pth").write_text(f"{elsewhere}\n")
    fake_distribution(env.site, "pytorch-triton-rocm", "3.5.0")
    warnings = _warnings(env)
    assert "torch ==2.8.0" in warnings["mixed-torch"]["message"]
    assert str(elsewhere) in warnings["mixed-site"]["message"]


# `rocmfix env` exports the AOTriton flag where doctor measured SDPA faster with it on this
# GPU (tests/test_vit_attention.py has the cases where it did not).
GFX1100 = {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}


def measured_aotriton() -> None:
    measured_vit("2.10.0+rocm7.0", "7.0.51831", {"sdpa-aotriton": 4.0})


def test_env_exports_for_rocm_in_bash(doclayout: Callable[[], InstalledEnv]) -> None:
    env = doclayout()
    fake_torch(env.site, "2.10.0+rocm7.0", hip="7.0.51831")
    measured_aotriton()
    out = env.cli("env", "--model-source", "modelscope", env=GFX1100)
    assert out.returncode == 0, out.stderr
    shown = subprocess.run(
        [
            "bash",
            "-c",
            'eval "$1"; echo "$TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL $MINERU_MODEL_SOURCE"',
            "bash",
            out.stdout,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.strip() == "1 modelscope"
    assert "# AOTriton's SDPA kernels" in out.stdout


def test_env_exports_nothing_by_default_off_rocm(doclayout: Callable[[], InstalledEnv]) -> None:
    env = doclayout()
    fake_torch(env.site, "2.9.0+cu128", cuda="12.8")
    out = env.cli("env")
    assert out.returncode == 0
    assert [line for line in out.stdout.splitlines() if not line.startswith("#")] == []
    assert "MINERU_MODEL_SOURCE" not in out.stdout


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_env_exports_parse_in_other_shells(
    shell: str, doclayout: Callable[[], InstalledEnv], tmp_path: Path
) -> None:
    require(shutil.which(shell) is not None, f"{shell} is not installed")
    env = doclayout()
    fake_torch(env.site, "2.10.0+rocm7.0", hip="7.0.51831")
    measured_aotriton()
    out = env.cli("env", "--shell", shell, "--model-source", "modelscope", env=GFX1100)
    script = tmp_path / f"env.{shell}"
    script.write_text(
        out.stdout + 'echo "$TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL $MINERU_MODEL_SOURCE"\n'
    )
    subprocess.run([shell, "-n", str(script)], check=True)
    ran = subprocess.run([shell, str(script)], capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == "1 modelscope"


def test_env_exports_powershell_syntax(doclayout: Callable[[], InstalledEnv]) -> None:
    env = doclayout()
    fake_torch(env.site, "2.10.0+rocm7.0", hip="7.0.51831")
    measured_aotriton()
    out = env.cli("env", "--shell", "powershell", "--model-source", "modelscope", env=GFX1100)
    code = [line for line in out.stdout.splitlines() if not line.startswith("#")]
    assert code == [
        "$env:TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL = '1'",
        "$env:MINERU_MODEL_SOURCE = 'modelscope'",
    ]


def test_list_names_every_patch_with_files_versions_and_schemes() -> None:
    listed = run_cli("list", "--json")
    assert listed.returncode == 0
    doc = listed.json()
    ids = [p["id"] for p in doc["patches"]]
    assert ids == [p.id for p in all_patches()]
    assert ids[:4] == ["vllm-qwen2-vl", "vllm-qwen2.5-vl", "vllm-qwen3-vl", "transformers-qwen2-vl"]
    assert ids[-2:] == ["doclayout-dilated-conv", "mineru-tokenizer"]
    for patch in doc["patches"]:
        assert patch["file"].endswith(".py") and patch["known"]
    table = run_cli("list")
    assert "doclayout_yolo/nn/modules/g2l_crm.py" in table.stdout
    assert "linear" in table.stdout


@pytest.mark.parametrize(
    "command", ["status", "apply", "revert", "list", "doctor", "tune", "kernels", "env"]
)
def test_every_help_has_an_example_and_names_its_choices(command: str) -> None:
    result = run_cli(command, "--help")
    assert result.returncode == 0
    assert "Example:" in result.stdout
    # Flags take no value, so no type is shown beside them; valued options name their choices.
    assert "<bool>" not in result.stdout and "<str>" not in result.stdout
    choices = {"apply": ", ".join(scheme_names()),
               "doctor": ", ".join(op.name for op in OPS),
               "kernels": "gfx1100, gfx1201"}  # fmt: skip
    if command in choices:
        assert choices[command] in result.stdout


def test_shell_completion_is_offered() -> None:
    result = run_cli("--help")
    assert "--install-completion" in result.stdout and "<bool>" not in result.stdout
    # --show-completion takes no value: typer names the shell it runs under, found among its
    # parent processes, so run it from bash, as a user would (under a runner with no shell
    # above it, it prints "Shell  not supported."); the `exit` keeps bash from exec-ing it.
    shown = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m rocmfix --show-completion; exit $?'],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
        timeout=120,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert "complete -o default -F _rocmfix_completion rocmfix" in shown.stdout


def test_status_json_schema_is_versioned(doclayout: Callable[[], InstalledEnv]) -> None:
    env = doclayout()
    doc = json.loads(env.cli("status", "--json").stdout)
    assert doc["schema"] == "rocmfix-status/1"
    assert set(doc) >= {"environment", "patches", "warnings", "summary", "pending", "busy"}
