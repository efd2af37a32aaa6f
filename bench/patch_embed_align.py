"""Does 128-byte row alignment of the operands change the patch-embed GEMM's speed?

K = 1176 bf16 makes 2352-byte rows: every other row starts 16 bytes into a 32-byte L2 sector,
so a 128-byte TMA box row touches 4 or 5 sectors. The weight can be stored once with padded
rows; the activations cannot without a copy per call, so the padded-activation rows only bound
what alignment is worth. "repacked" copies the weight into its padded buffer inside every call
(the price of not caching the copy). CUDA-graph replay medians (best of 3), each against
F.linear on the unpadded operands in the same process. ``--alt`` also times other tile configs
with and without the padded weight.

    python bench/patch_embed_align.py [--m 5476 16384 56700] [--alt]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from patch_embed import SWEEP_M, K, N, load_template, rel_err, rotating_graph_ms

PAD_K = 1216
ALT_CONFIGS: dict[str, dict[str, Any]] = {
    "s4 sub": {"num_stages": 4, "epilogue_subtile": True},
    "256x128": {"BLOCK_M": 256, "BLOCK_N": 128},
    "g16": {"GROUP_M": 16},
    "no flatten": {"flatten": False},
    "128x128 occ2": {"BLOCK_N": 128, "occupancy": 2},
    "ptr 128x256x64 s3": {"tma": False},
}


def padded(t: torch.Tensor, stride: int) -> torch.Tensor:
    store = torch.zeros(t.shape[0], stride, device=t.device, dtype=t.dtype)
    store[:, : t.shape[1]].copy_(t)
    return store[:, : t.shape[1]]


def bench_m(m: int, gemm: ModuleType, w: torch.Tensor, alt: bool) -> None:
    dev = w.device
    sets = 4 if m < 16384 else 2
    xs = [torch.randn(m, K, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
    xps = [padded(x, PAD_K) for x in xs]
    outs = [torch.empty(m, N, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
    ref = xs[0].double() @ w.double().T
    # pack_weight off: this script places the padding itself.
    raw = {**gemm.resolve_config(dev), "pack_weight": False}
    wps = {s: padded(w, s) for s in (1184, PAD_K, 1280)}
    wbuf = padded(w, PAD_K)

    def gemm_on(x: torch.Tensor, wt: torch.Tensor, out: torch.Tensor, cfg: dict[str, Any]) -> Any:
        return gemm.patchify_gemm(x, wt, None, config=cfg, out=out)

    def repacked(i: int) -> Any:
        wbuf.copy_(w)
        return gemm_on(xs[i], wbuf, outs[i], raw)

    cases: dict[str, Callable[[int], Any]] = {
        "F.linear": lambda i: torch.mm(xs[i], w.t(), out=outs[i]),
        "F.linear, W 1216": lambda i: torch.mm(xs[i], wps[PAD_K].t(), out=outs[i]),
        "gemm": lambda i: gemm_on(xs[i], w, outs[i], raw),
        "gemm, W 1184": lambda i: gemm_on(xs[i], wps[1184], outs[i], raw),
        "gemm, W 1216": lambda i: gemm_on(xs[i], wps[PAD_K], outs[i], raw),
        "gemm, W 1280": lambda i: gemm_on(xs[i], wps[1280], outs[i], raw),
        "gemm, W 1216 repacked": repacked,
        "gemm, X+W 1216": lambda i: gemm_on(xps[i], wps[PAD_K], outs[i], raw),
    }
    if alt:
        for name, over in ALT_CONFIGS.items():
            cfg = {**raw, **over}
            cases[name] = lambda i, cfg=cfg: gemm_on(xs[i], w, outs[i], cfg)
            cases[f"{name}, W 1216"] = lambda i, cfg=cfg: gemm_on(xs[i], wps[PAD_K], outs[i], cfg)
    base = None
    for name, fn in cases.items():
        try:
            fn(0)
            torch.cuda.synchronize()
            err = rel_err(outs[0], ref)
            ms = min(rotating_graph_ms(fn, sets) for _ in range(3))
        except Exception as exc:  # noqa: BLE001
            print(f"M={m:<6} {name:<26} FAILED {type(exc).__name__}: {str(exc)[:200]}")
            continue
        base = base or ms
        print(
            f"M={m:<6} {name:<26} {ms * 1e3:8.1f} us  x{base / ms:.3f}  err {err:.2e}", flush=True
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--m", type=int, nargs="+", default=list(SWEEP_M))
    ap.add_argument("--alt", action="store_true", help="also time ALT_CONFIGS")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no GPU: nothing to benchmark")
        return 2
    dev = torch.device("cuda")
    gemm = load_template("gemm")
    print(f"{torch.cuda.get_device_name(dev)} torch {torch.__version__}")
    w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) / math.sqrt(K)
    for m in args.m:
        bench_m(m, gemm, w, args.alt)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
