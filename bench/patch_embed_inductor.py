"""How far Triton gets on the patch-embed GEMM when torch Inductor autotunes it.

A second opinion on docs/performance-patch-embed.md's claim that our `gemm` kernel is near
what Triton can do on this shape (bf16, K = 1176, N = 1280). ``torch.compile`` with
max-autotune benchmarks Inductor's Triton matmul templates (the persistent TMA one included
where torch supports it) against the ATen/cuBLAS mm in one process and prints its AUTOTUNE
table; this script keeps that table. It then times, with CUDA-graph replay in one process,
``F.linear``, the Triton-only compiled GEMM and our shipped `gemm` template.

    python bench/patch_embed_inductor.py [--m 5476 16384 56700] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from patch_embed import K, N, graph_ms, load_template


def compile_triton_only(w: torch.Tensor, x: torch.Tensor) -> tuple[Callable[..., Any], str]:
    """Compile ``F.linear(x, w)`` with Triton templates only; return it and the autotune log."""
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    wanted: dict[str, Any] = {
        "max_autotune": True,
        "max_autotune_gemm": True,
        "max_autotune_gemm_backends": "ATEN,TRITON",
        "autotune_fallback_to_aten": False,
        "triton.enable_persistent_tma_matmul": True,
    }
    # Keys come and go between torch releases; patch only the ones this torch has.
    settings = {
        key: value
        for key, value in wanted.items()
        if hasattr(
            inductor_config.triton if key.startswith("triton.") else inductor_config,
            key.split(".")[-1],
        )
    }
    # The first compile includes ATen so that the AUTOTUNE table shows cuBLAS next to the
    # Triton templates; the second leaves only Triton so the winner is a Triton kernel.
    log = io.StringIO()
    with inductor_config.patch(settings), contextlib.redirect_stderr(log):
        both = torch.compile(lambda a: F.linear(a, w), dynamic=False)
        both(x)
    torch._dynamo.reset()
    settings["max_autotune_gemm_backends"] = "TRITON"
    with inductor_config.patch(settings), contextlib.redirect_stderr(io.StringIO()):
        triton_only = torch.compile(lambda a: F.linear(a, w), dynamic=False)
        triton_only(x)
    lines = log.getvalue().splitlines()
    table = "\n".join(line for line in lines if "AUTOTUNE" in line or " ms " in line)
    if not table:
        table = "(no AUTOTUNE table on stderr; last lines:)\n" + "\n".join(lines[-15:])
    return triton_only, table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, nargs="+", default=[5476, 16384, 56700])
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for the json result")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no GPU: nothing to measure")
        return 2
    import triton

    torch.manual_seed(0)
    dev = torch.device("cuda")
    gemm = load_template("gemm")
    w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) / K**0.5
    env = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    print(json.dumps(env), flush=True)
    rows: list[dict[str, Any]] = []
    for m in args.m:
        x = torch.randn(m, K, device=dev, dtype=torch.bfloat16)
        out = torch.empty(m, N, device=dev, dtype=torch.bfloat16)
        t0 = time.time()
        compiled, table = compile_triton_only(w, x)
        ref = x.double() @ w.double().T
        err = float((compiled(x).double() - ref).norm() / ref.norm())
        row: dict[str, Any] = {"M": m, "autotune_s": time.time() - t0, "inductor_err": err}
        row["F.linear"] = graph_ms(lambda x=x: F.linear(x, w))
        row["inductor triton"] = graph_ms(lambda x=x, fn=compiled: fn(x))
        row["rocmfix gemm"] = graph_ms(lambda x=x, out=out: gemm.patchify_gemm(x, w, None, out=out))
        row["autotune_table"] = table
        rows.append(row)
        base = row["F.linear"]
        print(f"M={m} (autotune {row['autotune_s']:.0f}s, inductor rel err {err:.2e})")
        print(table)
        for name in ("F.linear", "inductor triton", "rocmfix gemm"):
            print(f"  {name:<16} {row[name] * 1e3:8.1f} us  {base / row[name]:.3f}x F.linear")
        sys.stdout.flush()
    if args.out:
        out_dir = Path(args.out)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "patch_embed_inductor.json").write_text(json.dumps({"env": env, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
