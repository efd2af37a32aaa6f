"""A Qwen2-VL vision tower with MinerU2.5's vision dimensions (embed_dim 1280, 32 blocks, patch
14, temporal 2) on one page's patches (M = 5476: a 1036x1036 page), bf16, in the installed
transformers, stock and then patched by the real `rocmfix apply`: issue 14's device proof.

    python bench/vision_tower.py --phase stock   --out DIR   # before `rocmfix apply`
    python bench/vision_tower.py --phase patched --out DIR   # after it

The stock phase saves the random weights (seeded), the input and the output to DIR; the
patched phase loads them (strict: the parameters and keys are unchanged), checks the output
against the stock one, lists the convolutions torch.profiler sees (none may remain), times
the tower eagerly and under torch.compile, and times the patch embed alone against the stock
F.conv3d and F.linear on the same weight in the same process. Both phases print one JSON line.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

GRID = (1, 74, 74)  # t, h, w in patches: 5476 patches, a multiple of the 2x2 merge
DIMS = {
    "depth": 32,
    "embed_dim": 1280,
    "hidden_size": 896,
    "num_heads": 16,
    "mlp_ratio": 4,
    "in_channels": 3,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
}


def tower(depth: int) -> torch.nn.Module:
    from transformers.models.qwen2_vl import modeling_qwen2_vl as m
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig

    torch.manual_seed(0)
    config = Qwen2VLVisionConfig(**{**DIMS, "depth": depth})
    model = m.Qwen2VisionTransformerPretrainedModel._from_config(config)
    return model.to(device="cuda", dtype=torch.bfloat16).eval()


def median_ms(fn: Any, warmup: int = 3, reps: int = 15) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def convolutions(fn: Any) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.key for e in prof.key_averages() if "conv" in e.key.lower()})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--phase", choices=("stock", "patched"), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--depth", type=int, default=DIMS["depth"])
    args = parser.parse_args()
    out = Path(args.out)
    store = Path("/tmp/vision_tower.pt")
    model = tower(args.depth)
    embed = model.patch_embed
    k = DIMS["in_channels"] * DIMS["temporal_patch_size"] * DIMS["patch_size"] ** 2
    grid = torch.tensor([GRID], device="cuda")
    report: dict[str, Any] = {
        "phase": args.phase,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "m": int(grid.prod()),
        "k": k,
        "n": DIMS["embed_dim"],
        "depth": args.depth,
        "date": time.strftime("%Y-%m-%d"),
    }
    if args.phase == "stock":
        x = torch.randn(int(grid.prod()), k, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            y = model(x, grid_thw=grid)
        y = y[0] if isinstance(y, tuple) else getattr(y, "last_hidden_state", y)
        torch.save({"state": model.state_dict(), "x": x, "y": y}, store)
    else:
        saved = torch.load(store)
        model.load_state_dict(saved["state"], strict=True)
        x, ref = saved["x"], saved["y"]
        report["forward"] = inspect.getsource(type(embed).forward)
        with torch.no_grad():
            y = model(x, grid_thw=grid)
            y = y[0] if isinstance(y, tuple) else getattr(y, "last_hidden_state", y)
            report["rel_err_vs_stock"] = rel_err(y, ref)
            report["bitwise_equal"] = bool(torch.equal(y, ref))
    with torch.no_grad():
        report["convolutions"] = convolutions(lambda: model(x, grid_thw=grid))
        report["tower_ms"] = median_ms(lambda: model(x, grid_thw=grid))
        # The patch embed alone, against the ops it replaces, on the same weight and input.
        w = embed.proj.weight
        view = x.view(-1, DIMS["in_channels"], DIMS["temporal_patch_size"],
                      DIMS["patch_size"], DIMS["patch_size"])  # fmt: skip
        conv3d = lambda: F.conv3d(view, w, None, stride=tuple(w.shape[2:]))  # noqa: E731
        linear = lambda: F.linear(x, w.reshape(w.shape[0], -1))  # noqa: E731
        module = lambda: embed(x)  # noqa: E731
        ref_embed = conv3d().reshape(x.shape[0], -1)
        report["embed_rel_err_vs_conv3d"] = rel_err(module(), ref_embed)
        report["embed_ms"] = {
            "module": median_ms(module, reps=50),
            "F.conv3d": median_ms(conv3d, reps=50),
            "F.linear": median_ms(linear, reps=50),
        }
        compiled = torch.compile(model)
        start = time.perf_counter()
        yc = compiled(x, grid_thw=grid)
        torch.cuda.synchronize()
        report["compile_s"] = time.perf_counter() - start
        yc = yc[0] if isinstance(yc, tuple) else getattr(yc, "last_hidden_state", yc)
        report["compiled_rel_err_vs_eager"] = rel_err(yc, y)
        report["compiled_tower_ms"] = median_ms(lambda: compiled(x, grid_thw=grid))
        report["compiled_convolutions"] = convolutions(lambda: compiled(x, grid_thw=grid))
    line = json.dumps(report)
    (out / f"vision_tower_{args.phase}.json").write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
