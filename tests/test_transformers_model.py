"""The patched transformers vision towers run, not only read well: a real transformers release
(the whole wheel, installed by pip into a venv), a tiny random-weight Qwen2-VL
(``Qwen2VLForConditionalGeneration``, what MinerU's vlm-transformers backend loads) and a
Qwen3-VL vision tower (its patch embed has a bias) built from configs written here, no hub.

Stock first, then ``rocmfix apply`` through the real CLI, then the patched tower in a fresh
process: the stock state dict loads with ``strict=True`` (the parameters and keys are as they
were), the output matches the stock one, no convolution runs in the patched forward (the
profiler sees one in the stock forward), and ``torch.compile`` gives the same output. CPU
inputs run the Triton kernel in the interpreter (``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import json
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

import pytest

import releases
from conftest import run_cli

pytestmark = pytest.mark.network

# 4.57 is the newest release line whose requirements this test environment meets
# (transformers 5 wants huggingface-hub 1.x); 5.x files are covered by test_transformers.py.
RELEASE = "4.57.6"

SCRIPT = r"""
import inspect, json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel


def qwen2_vl():
    vision = dict(depth=1, embed_dim=32, hidden_size=48, num_heads=2, mlp_ratio=2,
                  in_channels=3, patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
    config = Qwen2VLConfig(vision_config=vision, hidden_size=48, intermediate_size=64,
                           num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                           vocab_size=128)
    model = Qwen2VLForConditionalGeneration(config).eval()
    return model, getattr(model, "visual", None) or model.model.visual, 3 * 2 * 14 * 14


def qwen3_vl():
    config = Qwen3VLVisionConfig(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                 in_channels=3, patch_size=16, spatial_merge_size=2,
                                 temporal_patch_size=2, out_hidden_size=48,
                                 num_position_embeddings=64, deepstack_visual_indexes=[0])
    model = Qwen3VLVisionModel._from_config(config).eval()
    return model, model, 3 * 2 * 16 * 16


def run(visual, x, grid):
    with torch.no_grad(), torch.profiler.profile() as prof:
        out = visual(x, grid_thw=grid)
    out = out[0] if isinstance(out, tuple) else out
    convs = sorted({e.key for e in prof.key_averages() if "conv" in e.key.lower()})
    return out, convs


mode, store = sys.argv[1], sys.argv[2]
report = {}
for name, build in (("qwen2_vl", qwen2_vl), ("qwen3_vl", qwen3_vl)):
    torch.manual_seed(0)
    model, visual, k = build()
    path = os.path.join(store, name + ".pt")
    if mode == "stock":
        grid, x = torch.tensor([[1, 4, 6]]), torch.randn(24, k)
        out, convs = run(visual, x, grid)
        torch.save({"state": model.state_dict(), "x": x, "grid": grid, "out": out}, path)
        report[name] = {"convs": convs, "bias": visual.patch_embed.proj.bias is not None}
        continue
    saved = torch.load(path)
    model.load_state_dict(saved["state"], strict=True)
    out, convs = run(visual, saved["x"], saved["grid"])
    compiled = torch.compile(visual, backend="aot_eager", fullgraph=False)
    with torch.no_grad():
        again = compiled(saved["x"], grid_thw=saved["grid"])
    again = again[0] if isinstance(again, tuple) else again
    ref = saved["out"].double()
    report[name] = {
        "convs": convs,
        "rel_err": ((out.double() - ref).norm() / ref.norm()).item(),
        "compiled_rel_err": ((again.double() - ref).norm() / ref.norm()).item(),
        "forward": inspect.getsource(type(visual.patch_embed).forward),
    }
print(json.dumps(report))
"""


def _tower(python: Path, mode: str, store: Path) -> dict[str, Any]:
    done = subprocess.run(
        [str(python), "-c", SCRIPT, mode, str(store)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("transformers-model")
    python = releases.make_venv(root / "venv")
    releases.pip_install(python, releases.wheel("transformers", RELEASE))
    # torch, tokenizers and the rest come from the test environment, after the venv's own.
    site = releases.site_packages(python)
    (site / "zz_test_runner.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def test_the_patched_vision_towers_match_stock_without_a_convolution(
    venv: Path, tmp_path: Path
) -> None:
    # gemm, the default; `linear` keeps the stock op for CPU inputs, bit for bit.
    stock = _tower(venv, "stock", tmp_path)
    assert stock["qwen2_vl"]["convs"] and stock["qwen3_vl"]["convs"]  # the profiler sees it
    assert stock["qwen3_vl"]["bias"] is True and stock["qwen2_vl"]["bias"] is False

    applied = run_cli("apply", "--scheme", "gemm", "--only", "transformers", "--force",
                      "--python", str(venv), timeout=600)  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    try:
        patched = _tower(venv, "patched", tmp_path)
    finally:
        reverted = run_cli("revert", "--python", str(venv), timeout=600)
        assert reverted.returncode == 0, reverted.stderr
    for name in ("qwen2_vl", "qwen3_vl"):
        tower = patched[name]
        assert "rocmfix" in tower["forward"], name  # the rewritten class ran
        assert tower["convs"] == [], (name, tower["convs"])
        assert tower["rel_err"] < 1e-5, (name, tower["rel_err"])
        assert tower["compiled_rel_err"] < 1e-5, (name, tower["compiled_rel_err"])
    # After revert the stock forward (with its convolution) is back.
    assert _tower(venv, "stock", tmp_path)["qwen2_vl"]["convs"]
