"""What the patch embed costs next to the vision encoder it feeds (one GPU, bf16).

The `gemm` scheme trails cuBLAS by some microseconds per call (docs/performance-patch-embed.md).
This puts those microseconds next to the encoder that runs after the patch embed on the same
tokens: a stand-in with Qwen2-VL's vision dimensions (32 pre-norm blocks, width 1280, 16 heads,
MLP 5120, full attention over one image's patches through SDPA). It is not vllm's module (no
rotary embedding, no patch merger), so treat the encoder time as an order of magnitude. Each
M is one image: vllm attends within each image, so an M that stands for several pages makes
this stand-in's attention, and the encoder time, too large.

Times are medians of CUDA-graph replays (kernel time, no host overhead) and of
``triton.testing.do_bench`` (eager, host overhead included).

    python bench/patch_embed_share.py [--m 5476] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from patch_embed import C, K, N, P, T, bench_ms, graph_ms, load_template

DEPTH, HEADS, MLP = 32, 16, 5120


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, nargs="+", default=[5476], help="patches of one image")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for the json result")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no GPU: nothing to measure")
        return 2
    import triton

    dev = torch.device("cuda")
    torch.manual_seed(0)
    gemm = load_template("gemm")
    dtype = torch.bfloat16
    layer = nn.TransformerEncoderLayer(
        N, HEADS, MLP, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
    )
    encoder = nn.TransformerEncoder(layer, DEPTH, enable_nested_tensor=False)
    encoder = encoder.to(dev, dtype).eval()
    conv = nn.Conv3d(C, N, (T, P, P), stride=(T, P, P), bias=False).to(dev, dtype)
    w = conv.weight.detach().reshape(N, K)
    env = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    print(json.dumps(env), flush=True)
    rows: list[dict[str, Any]] = []
    with torch.inference_mode():
        for m in args.m:
            x = torch.randn(m, K, device=dev, dtype=dtype)
            x5 = x.view(m, C, T, P, P)
            h = torch.randn(1, m, N, device=dev, dtype=dtype)
            out = torch.empty(m, N, device=dev, dtype=dtype)
            cases: dict[str, Callable[[], Any]] = {
                "encoder (32 blocks)": lambda h=h: encoder(h),
                "patch embed F.linear": lambda x=x: F.linear(x, w),
                "patch embed gemm": lambda x=x, out=out: gemm.patchify_gemm(x, w, None, out=out),
                "patch embed nn.Conv3d": lambda x5=x5: conv(x5),
            }
            row: dict[str, Any] = {"M": m}
            for name, fn in cases.items():
                row[f"{name} eager ms"] = bench_ms(fn, warmup=5, rep=40)
                try:
                    row[f"{name} graph ms"] = graph_ms(fn)
                except Exception as exc:  # noqa: BLE001 - keep the eager number
                    print(f"  {name}: no graph timing ({type(exc).__name__}: {exc})")
                    row[f"{name} graph ms"] = row[f"{name} eager ms"]
            enc = row["encoder (32 blocks) graph ms"]
            gap = row["patch embed gemm graph ms"] - row["patch embed F.linear graph ms"]
            gap_eager = row["patch embed gemm eager ms"] - row["patch embed F.linear eager ms"]
            row["gemm gap vs F.linear, share of encoder (graph)"] = gap / enc
            row["gemm gap vs F.linear, share of encoder (eager)"] = gap_eager / enc
            rows.append(row)
            print(f"M={m}")
            for key, val in row.items():
                if key.endswith("ms"):
                    print(f"  {key:<36} {val * 1e3:10.1f} us")
            print(
                f"  gemm's gap to F.linear: {gap * 1e3:.1f} us graph / {gap_eager * 1e3:.1f} us"
                f" eager = {gap / enc:.2%} / {gap_eager / enc:.2%} of the encoder's graph time",
                flush=True,
            )
    if args.out:
        out_dir = Path(args.out)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "patch_embed_share.json").write_text(json.dumps({"env": env, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
