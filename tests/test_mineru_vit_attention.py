"""The vision-tower backend patch on real releases: MinerU's wheel installed with pip, the
installed vLLM's own ``platforms/rocm.py`` and ``engine/arg_utils.py`` beside it, a ROCm
torch's metadata and a stored doctor result; then the patched functions themselves called on
the CPU (issue 42, item 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import releases
from conftest import InstalledEnv, fake_torch, files_under, measured_vit

pytestmark = pytest.mark.network

TORCH, HIP = "2.9.1+rocm7.2", "7.2.26015-fc0010cf6a"
ON_GFX1100 = {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}
FILES = {"4.0.12": "mineru/model/vlm/engine_utils.py", "3.4.5": "mineru/backend/vlm/utils.py"}
IDS = {"4.0.12": "mineru-vit-attention", "3.4.5": "mineru-vit-attention-3"}
VLLM_FILES = ["vllm/__init__.py", "vllm/platforms/rocm.py", "vllm/engine/arg_utils.py"]


def _env(tmp_path: Path, mineru: str, vllm: str) -> InstalledEnv:
    python = releases.make_venv(tmp_path / f"mineru-{mineru}-vllm-{vllm}")
    releases.pip_install(python, releases.wheel("mineru", mineru))
    site = releases.partial_install(python, "vllm", vllm, VLLM_FILES)
    fake_torch(site, TORCH, hip=HIP)
    info = site / "triton-3.5.0.dist-info"  # vLLM's Triton kernel needs Triton
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: triton\nVersion: 3.5.0\n")
    (info / "RECORD").write_text("")
    target = site / FILES[mineru]
    return InstalledEnv(tmp_path, python, site, target, target.read_bytes())


def _verdict(env: InstalledEnv, patch: str) -> dict[str, Any]:
    result = env.cli("status", "--json", env=ON_GFX1100)
    assert result.returncode == 0, result.stderr
    found: dict[str, Any] = {p["id"]: p for p in result.json()["patches"]}[patch]
    return found


@pytest.mark.parametrize(("mineru", "vllm"), [("4.0.12", "0.19.1"), ("3.4.5", "0.19.1"),
                                              ("4.0.12", "0.33.0")])  # fmt: skip
def test_applied_only_where_measured_faster_and_reverted_byte_for_byte(
    tmp_path: Path, mineru: str, vllm: str
) -> None:
    env = _env(tmp_path, mineru, vllm)
    patch = IDS[mineru]
    found = _verdict(env, patch)
    assert found["verdict"] == "unmeasured", found
    assert "rocmfix doctor --op vit-attention" in found["reason"]
    measured_vit(TORCH, HIP, {"sdpa-aotriton": 4.0, "triton-attn": 0.9})
    found = _verdict(env, patch)
    assert found["verdict"] == "not-needed", found
    assert found["reason"].startswith("triton-attn measured no faster here (0.90x on gfx1100")

    measured_vit(TORCH, HIP, {"sdpa-aotriton": 4.0, "triton-attn": 5.0})
    found = _verdict(env, patch)
    assert found["verdict"] == "applicable", found
    assert found["reason"] == "triton-attn measured 5.0x faster on gfx1100, ROCm 7.2, 2026-11-27"
    assert f"vllm {vllm} gives RDNA's vision tower TORCH_SDPA" in " ".join(found["notes"])
    before = files_under(env.site)
    applied = env.cli("apply", env=ON_GFX1100)
    assert applied.returncode == 0, applied.stderr
    after = files_under(env.site)
    changed = {k for k in after if before.get(k) != after[k]}
    assert FILES[mineru] in changed
    assert b'config.setdefault("mm_encoder_attn_backend", "TRITON_ATTN")' in after[FILES[mineru]]
    assert _verdict(env, patch)["verdict"] == "applied"
    reverted = env.cli("revert")
    assert reverted.returncode == 0, reverted.stderr
    assert files_under(env.site) == before


def test_a_vllm_without_a_triton_tower_backend_is_left_alone(tmp_path: Path) -> None:
    env = _env(tmp_path, "4.0.12", "0.14.0")
    measured_vit(TORCH, HIP, {"triton-attn": 5.0})
    found = _verdict(env, IDS["4.0.12"])
    assert found["verdict"] == "not-needed", found
    assert "vllm 0.14.0 offers no TRITON_ATTN for the vision tower on ROCm" in found["reason"]


# Calls MinerU's patched functions as its vLLM engines do: the settings a server gets as
# arguments, and those an engine gets as keyword arguments (vllm.config stands in only for
# the class MinerU imports from it).
CALLS = """
import json, sys
from mineru.model.vlm import engine_utils as eu
print(json.dumps({
    "config": eu._get_device_config(""),
    "kxpu": eu._get_device_config("kxpu").get("mm_encoder_attn_backend"),
    "server": eu.mod_kwargs_by_device_type([], "server"),
    "server_user": eu.mod_kwargs_by_device_type(["--mm-encoder-attn-backend=TORCH_SDPA"], "server"),
    "engine": eu.mod_kwargs_by_device_type({"model": "m"}, "async_engine"),
    "engine_user": eu.mod_kwargs_by_device_type({"mm_encoder_attn_backend": "FLASH_ATTN"},
                                                "sync_engine"),
}))
"""


def _call(tmp_path: Path, engine_utils: bytes, hip: str | None, env: dict[str, str]) -> Any:
    shims = tmp_path / f"shims-{hip}-{len(env)}"
    (shims / "torch").mkdir(parents=True, exist_ok=True)
    (shims / "torch" / "__init__.py").write_text("from . import version\n")
    (shims / "torch" / "version.py").write_text(f"hip = {hip!r}\n")
    (shims / "vllm").mkdir(exist_ok=True)
    (shims / "vllm" / "__init__.py").write_text("")
    (shims / "vllm" / "config.py").write_text("class CompilationConfig:\n    pass\n")
    mineru = releases.importable("mineru", "4.0.12")
    tree = tmp_path / f"mineru-{len(engine_utils)}"
    if not tree.exists():
        releases.copy_tree(mineru / "mineru", tree / "mineru")
        (tree / "mineru" / "model" / "vlm" / "engine_utils.py").write_bytes(engine_utils)
        # MinerU's package root re-exports its document types (docvortex): not what runs here.
        (tree / "mineru" / "__init__.py").write_text("")
    path = [str(p) for p in (shims, tree, releases.importable("loguru", "0.7.3"))]
    done = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path[:0] = {path}\n" + CALLS],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", **env},
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_patched_settings_select_triton_attn_on_rocm_only(tmp_path: Path) -> None:
    env = _env(tmp_path, "4.0.12", "0.19.1")
    measured_vit(TORCH, HIP, {"triton-attn": 5.0})
    applied = env.cli("apply", "--only", IDS["4.0.12"], env=ON_GFX1100)
    assert applied.returncode == 0, applied.stderr
    patched = env.target.read_bytes()

    rocm = _call(tmp_path, patched, "7.2.26015", {})
    assert rocm["config"] == {"mm_encoder_attn_backend": "TRITON_ATTN"}
    assert rocm["kxpu"] == "TRITON_ATTN"
    assert rocm["server"] == ["--mm-encoder-attn-backend", "TRITON_ATTN"]
    assert rocm["server_user"] == ["--mm-encoder-attn-backend=TORCH_SDPA"]  # the user's wins
    assert rocm["engine"] == {"model": "m", "mm_encoder_attn_backend": "TRITON_ATTN"}
    assert rocm["engine_user"] == {"mm_encoder_attn_backend": "FLASH_ATTN"}

    stock = _call(tmp_path, env.original, "7.2.26015", {})
    assert stock["config"] is None and stock["server"] == [] and stock["engine"] == {"model": "m"}
    # Off ROCm, and where the user chose flash-attn's Triton path, MinerU's own settings.
    for hip, extra in ((None, {}), ("7.2.26015", {"FLASH_ATTENTION_TRITON_AMD_ENABLE": "TRUE"})):
        off = _call(tmp_path, patched, hip, extra)
        assert {k: off[k] for k in ("config", "server", "engine")} == {
            "config": None,
            "server": [],
            "engine": {"model": "m"},
        }
