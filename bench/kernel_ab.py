"""GPU time of the dilated-conv and patch-embed kernels as two template trees compile them:
this tree's ``templates/`` (new) against an older one (old), same GPU, same process.

Each case is launched through each tree's own config resolution and launch preparation
(``dilated_conv_triton.prepare``, ``patch_embed_gemm.prepare``), as ``rocmfix kernels``
compiles them, and timed as GPU time in CUDA-graph replay (``do_bench_cudagraph``, median ms;
``do_bench`` where a capture fails), old and new alternating for ``--rounds`` rounds. Cases:
DocLayout-YOLO's dilated convs (96ch 5x5 d=2,3 at 160x116, 192ch 3x3 d=3,5 at 80x58; batch 1
and 4; fp32 with TF32, strict fp32, bf16; the shipped config),
MinerU2.5's patch embed (M = 5476 and 1024, K = 1176, N = 1280; bf16, fp16, fp32; the shipped
config, and the pointer kernel without a persistent grid). Prints one JSON line per case (old
and new medians of the rounds, new/old) and a summary; writes ``kernel_ab.json`` to ``$OUT``
where set.

    mkdir -p bench/ab_old && git archive f77ede8 templates | tar -x -C bench/ab_old
    python bench/kernel_ab.py --old bench/ab_old/templates [--rounds 5] [--budget 420]

(the first line where git is, before the tree is copied to the GPU machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import _load  # bench/_load.py: the templates as the targets import them
import torch

ROOT = Path(__file__).resolve().parents[1]
DILATED = [(96, 5, 160, 116, (2, 3)), (192, 3, 80, 58, (3, 5))]  # (C, k, H, W, dilations)
MODES = {"tf32": torch.float32, "ieee": torch.float32, "bf16": torch.bfloat16}
PATCH_M = (5476, 1024)
PATCH_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _launcher(prepared: tuple[Any, ...]) -> Callable[[], None]:
    kernel, grid, args, kwargs = prepared[:4]
    return lambda: kernel[grid](*args, **kwargs)


def _dilated_cases(mod: ModuleType) -> list[tuple[str, Callable[[], None]]]:
    cases = []
    for c, k, h, w, dilations in DILATED:
        for mode, dtype in MODES.items():
            # The modes as bench/dilated_conv.py sets them (prepare reads them).
            precision = "tf32" if mode == "tf32" else "ieee"
            torch.backends.cudnn.conv.fp32_precision = precision  # type: ignore[attr-defined]
            for n in (1, 4):
                for d in dilations:
                    gen = torch.Generator(device="cuda").manual_seed(0)
                    x = torch.randn(n, c, h, w, device="cuda", generator=gen).to(dtype)
                    wt = torch.randn(c, c, k, k, device="cuda", generator=gen).to(dtype)
                    prep = mod.prepare(x, wt, d, d * (k // 2), None, epilogue=2)
                    name = f"dilated c{c} k{k} d{d} n{n} {mode} shipped"
                    cases.append((name, _launcher(prep)))
    return cases


def _patch_cases(mod: ModuleType) -> list[tuple[str, Callable[[], None]]]:
    cases = []
    for m in PATCH_M:
        for dtype in PATCH_DTYPES:
            gen = torch.Generator(device="cuda").manual_seed(0)
            a = torch.randn(m, 1176, device="cuda", generator=gen).to(dtype)
            w = torch.randn(1280, 1176, device="cuda", generator=gen).to(dtype)
            b = torch.randn(1280, device="cuda", generator=gen).to(dtype)
            pointer = {"tma": False, "persistent": False}
            for label, config in (("shipped", None), ("pointer", pointer)):
                prep = mod.prepare(a, w, b, config=config)
                cases.append((f"patch-embed M{m} {str(dtype)[6:]} {label}", _launcher(prep)))
    return cases


def _gpu_ms(run: Callable[[], None]) -> float:
    import triton.testing

    run()  # compiled outside any capture
    torch.cuda.synchronize()
    try:
        return float(triton.testing.do_bench_cudagraph(run, rep=40, return_mode="median"))
    except Exception:  # noqa: BLE001 - a launch a graph cannot hold: timed eagerly
        return float(triton.testing.do_bench(run, rep=40, return_mode="median"))


def _trees(old: str) -> dict[str, tuple[ModuleType, ModuleType]]:
    folders = {"old": old, "new": str(ROOT / "templates")}
    return {
        tree: (
            _load.load(folder, "dilated_conv_triton", fresh=True),
            _load.load(folder, "patch_embed_gemm", fresh=True),
        )
        for tree, folder in folders.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the older tree's templates folder")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=420.0, help="seconds in all")
    opts = parser.parse_args()
    import triton.testing

    start = time.monotonic()
    trees = _trees(opts.old)
    cases: dict[str, dict[str, Callable[[], None]]] = {}
    for tree, (dilated, patch) in trees.items():
        for name, run in _dilated_cases(dilated) + _patch_cases(patch):
            cases.setdefault(name, {})[tree] = run
    rows: list[dict[str, Any]] = []
    with torch.inference_mode():
        for name, runs in cases.items():
            if time.monotonic() - start > opts.budget:
                print(json.dumps({"case": name, "skipped": "past --budget"}), flush=True)
                continue
            times: dict[str, list[float]] = {"old": [], "new": []}
            for _ in range(opts.rounds):
                for tree in ("old", "new"):  # alternating, so drift hits both alike
                    times[tree].append(_gpu_ms(runs[tree]))
            old, new = statistics.median(times["old"]), statistics.median(times["new"])
            row = {"case": name, "old": old, "new": new, "new/old": new / old}
            rows.append(row)
            print(json.dumps(row), flush=True)
    ratios: list[float] = [r["new/old"] for r in rows]
    summary = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "cases": len(rows),
        "new/old min": min(ratios),
        "new/old median": statistics.median(ratios),
        "new/old max": max(ratios),
    }
    print(json.dumps(summary), flush=True)
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"]) / "kernel_ab.json"
        out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
