"""Per-call host cost in eager mode: what a Python caller pays for each dropped-in entry point,
beside the vendor op it replaces and the floors under both.

Each row is timed in bursts of back-to-back calls (CUDA synchronised before and after each
burst): ``host`` is the time to issue one call (the loop, before the final synchronise),
``wall`` the time per call including the GPU. On a problem small enough that the GPU idles,
``wall`` is the host cost; at MinerU's shapes it is what an eager forward waits for.

Rows:

* floors: an empty torch op; a bare Triton launch of a six-argument kernel through
  ``kernel[grid](...)``; the same compiled kernel launched through its own launcher
  (``CompiledKernel.run``), which is what ``kernel[grid]`` ends in;
* patch embed (bf16, K = 1176, N = 1280): ``F.linear``, the stock ``F.conv3d``, the dropped-in
  ``triton_conv3d_patchify`` as shipped for this GPU, with the portable pointer tiles that
  ROCm runs (``gfx942``) and with this GPU's tiles through the pointer kernel (on sm_90, what
  skipping the descriptor kernel would cost), and, for the gfx942 tiles, Triton's
  ``kernel[grid]`` and the compiled launcher with the arguments already prepared (what the
  template's own code adds is the rest);
* dilated conv (fp32 with TF32, as MinerU runs DocLayout-YOLO): ``F.conv2d``, the
  dropped-in Triton ``dilated_conv2d`` and the phase split (the ``linear`` scheme) at a tiny
  size and at MinerU's batch-1 sizes; then at those sizes the whole line the rewrite replaces,
  ``act(bn(conv))`` with an eval BatchNorm and SiLU, against the dropped-in call that takes both
  modules (the Triton kernel applies them as it stores).

    python bench/eager_host.py [--bursts 21] [--calls 50]

Prints a markdown table; with ``$OUT`` set also writes ``eager_host.md`` and ``.json`` there.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import _load  # bench/_load.py: the templates as the targets import them
import torch
import torch.nn.functional as F

PATCH = (3, 2, 14)  # channels, frames, patch size: K = 1176
N = 1280
PATCH_M = (64, 1024, 2048, 5476)
DILATED = (
    # (label, c, k, h, w, dilation): a tiny launch-bound size, then MinerU's P3/P4 at batch 1.
    ("tiny c96 k5 d2 8x8", 96, 5, 8, 8, 2),
    ("P3 c96 k5 d2 160x116", 96, 5, 160, 116, 2),
    ("P3 c96 k5 d3 160x116", 96, 5, 160, 116, 3),
    ("P4 c192 k3 d3 80x58", 192, 3, 80, 58, 3),
    ("P4 c192 k3 d5 80x58", 192, 3, 80, 58, 5),
)


def _burst(fn: Callable[[], Any], calls: int) -> tuple[float, float]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    issued = time.perf_counter()
    torch.cuda.synchronize()
    done = time.perf_counter()
    return (issued - start) / calls * 1e6, (done - start) / calls * 1e6


def group(
    name: str, fns: list[tuple[str, Callable[[], Any]]], bursts: int, calls: int
) -> list[dict[str, Any]]:
    """Median (host, wall) microseconds per call of each of ``fns``, their bursts taken in
    turn (the order rotating), so a host that speeds up or slows down over the run weighs on
    all of them alike and the ratios hold."""
    for _label, fn in fns:
        for _ in range(5):
            fn()
    host: dict[str, list[float]] = {label: [] for label, _ in fns}
    wall: dict[str, list[float]] = {label: [] for label, _ in fns}
    for b in range(bursts):
        for label, fn in fns[b % len(fns) :] + fns[: b % len(fns)]:
            h, w = _burst(fn, calls)
            host[label].append(h)
            wall[label].append(w)
    rows = []
    for label, _ in fns:
        row = {"group": name, "label": label, "host_us": statistics.median(host[label]),
               "wall_us": statistics.median(wall[label])}  # fmt: skip
        print(f"{name:22s} {label:50s} host {row['host_us']:7.1f}  wall {row['wall_us']:8.1f}",
              file=sys.stderr)  # fmt: skip
        rows.append(row)
    return rows


def compiled_launcher(
    kernel: Any, grid: tuple[int, ...], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Callable[[], None] | None:
    """``kernel[grid](*args, **kwargs)`` as a bare call of the compiled kernel's own launcher:
    the templates' Launcher adopts it, and its per-call checks are left out here (the floor).
    None where this Triton's launch path is not the one the Launcher knows."""
    launcher = _load.template("rocmfix_launcher").Launcher(kernel, grid, kwargs)
    launcher(*args)
    compiled = launcher.compiled
    if compiled is None:
        return None
    stream = torch.cuda.current_stream().cuda_stream
    run, function, meta = compiled.run, compiled.function, compiled.packed_metadata
    values = (*args, *launcher.tail)

    def launch() -> None:
        run(*launcher.grid, stream, function, meta, None, None, None, *values)

    return launch


def floors(bursts: int, calls: int) -> list[dict[str, Any]]:
    import triton
    import triton.language as tl

    @triton.jit
    def touch(a, b, c, n, m, k, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(c + offs, tl.load(a + offs, mask=mask) + tl.load(b + offs, mask=mask), mask=mask)

    a = torch.ones(16, device="cuda")
    b, c = torch.ones_like(a), torch.empty_like(a)
    rows = [("empty torch op (torch.neg, 1 element)", lambda: torch.neg(a[:1]))]
    rows.append(
        ("Triton kernel[grid](...), 6 arguments", partial(touch[(1,)], a, b, c, 16, 3, 5, BLOCK=16))
    )
    direct = compiled_launcher(touch, (1,), (a, b, c, 16, 3, 5), {"BLOCK": 16})
    if direct is not None:
        rows.append(("the same, through CompiledKernel.run", direct))
    return group("floor", rows, bursts, calls)


def _fresh_gemm(config: dict[str, Any] | None) -> Any:
    if config is None:
        os.environ.pop("ROCMFIX_PATCH_EMBED_CONFIG", None)
    else:
        os.environ["ROCMFIX_PATCH_EMBED_CONFIG"] = json.dumps(config)
    module = _load.template("patch_embed_gemm")
    # The plan is made (and the variable read) at the first call per device and dtype.
    module._plan_for(torch.device("cuda", torch.cuda.current_device()), torch.bfloat16)
    os.environ.pop("ROCMFIX_PATCH_EMBED_CONFIG", None)
    return module


def patch_embed(bursts: int, calls: int) -> list[dict[str, Any]]:
    rows = []
    c, t, p = PATCH
    shipped = _fresh_gemm(None)
    portable_cfg = shipped.CONFIG.shipped_config("gfx942", ("any", "f16"))
    portable = _fresh_gemm(portable_cfg)
    # This GPU's own tiles through the pointer kernel (where the descriptor kernel would run):
    # what a cheaper launch would cost in GPU time where the host cost shows.
    pointer = _fresh_gemm({**shipped.resolve_config(torch.device("cuda"), torch.bfloat16),
                           "tma": False})  # fmt: skip
    weight = torch.randn(N, c, t, p, p, device="cuda", dtype=torch.bfloat16)
    w2 = weight.flatten(1)
    for m in PATCH_M:
        x = torch.randn(m, c, t, p, p, device="cuda", dtype=torch.bfloat16)
        a = x.flatten(1)
        g = f"embed M={m}"
        calls_ = [
            ("F.linear (vendor BLAS)", partial(F.linear, a, w2)),
            ("F.conv3d (stock)", partial(F.conv3d, x, weight, stride=(t, p, p))),
            ("triton_conv3d_patchify, shipped tiles",
             partial(shipped.triton_conv3d_patchify, x, weight)),
            ("triton_conv3d_patchify, portable tiles (gfx942)",
             partial(portable.triton_conv3d_patchify, x, weight)),
            ("triton_conv3d_patchify, shipped tiles, pointer kernel",
             partial(pointer.triton_conv3d_patchify, x, weight)),
        ]  # fmt: skip
        plan = portable._plan_for(a.device, a.dtype)
        out = torch.empty(m, N, device="cuda", dtype=torch.bfloat16)
        packed = portable._packed_weight(w2) if plan.pack else w2
        kernel, grid, args, kwargs = portable.prepare_launch(a, packed, None, out, plan)
        calls_.append(
            (
                "  its kernel[grid](...) alone, arguments prepared",
                partial(kernel[grid], *args, **kwargs),
            )
        )
        direct = compiled_launcher(kernel, grid, args, kwargs)
        if direct is not None:
            calls_.append(("  its CompiledKernel.run alone", direct))
        rows += group(g, calls_, bursts, calls)
    return rows


def dilated(bursts: int, calls: int) -> list[dict[str, Any]]:
    rows = []
    module = _load.template("dilated_conv_triton")
    phase = _load.template("dilated_conv_phase")
    act = torch.nn.SiLU()
    for label, c, k, h, w, d in DILATED:
        x = torch.randn(1, c, h, w, device="cuda")
        weight = torch.randn(c, c, k, k, device="cuda")
        pad = d * (k - 1) // 2
        fns = [
            ("F.conv2d (cuDNN)", partial(F.conv2d, x, weight, None, 1, pad, d)),
            ("dilated_conv2d (dropped in)", partial(module.dilated_conv2d, x, weight, d, pad)),
            ("phase split (`linear`, no Triton)", partial(phase.dilated_conv2d, x, weight, d, pad)),
        ]
        rows += group(label, fns, bursts, calls)
        if label.startswith("tiny"):
            continue
        # The whole line the rewrite replaces: act(bn(conv)) with DocLayout-YOLO's modules.
        bn = torch.nn.BatchNorm2d(c).cuda().eval()
        fns = [
            ("F.conv2d, bn, act (the stock line)",
             lambda x=x, w=weight, d=d, p=pad, bn=bn: act(bn(F.conv2d(x, w, None, 1, p, d)))),
            ("dilated_conv2d(bn=, act=) (dropped in)",
             partial(module.dilated_conv2d, x, weight, d, pad, bn=bn, act=act)),
            ("phase split, bn, act",
             partial(phase.dilated_conv2d, x, weight, d, pad, bn=bn, act=act)),
        ]  # fmt: skip
        rows += group(f"{label} +BN+SiLU", fns, bursts, calls)
    return rows


def profile() -> int:
    """Where the host time of one entry point goes: cProfile over many calls."""
    import cProfile
    import pstats

    c, t, p = PATCH
    portable_cfg = _fresh_gemm(None).CONFIG.shipped_config("gfx942", ("any", "f16"))
    gemm = _fresh_gemm(portable_cfg)
    weight = torch.randn(N, c, t, p, p, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1024, c, t, p, p, device="cuda", dtype=torch.bfloat16)
    conv = _load.template("dilated_conv_triton")
    xd, wd = torch.randn(1, 192, 80, 58, device="cuda"), torch.randn(192, 192, 3, 3, device="cuda")
    for label, fn in (
        ("patch embed, portable tiles, M=1024", partial(gemm.triton_conv3d_patchify, x, weight)),
        ("dilated conv P4 d3", partial(conv.dilated_conv2d, xd, wd, 3, 3)),
    ):
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        print(f"== {label}: 2000 calls")
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    return 0


def render(rows: list[dict[str, Any]], header: str) -> str:
    out = [
        header,
        "",
        "| case | call | host µs/call | wall µs/call | wall vs vendor |",
        "|---|---|---:|---:|---:|",
    ]
    vendor: dict[str, float] = {}
    for r in rows:
        if r["label"].startswith(("F.linear", "F.conv2d")):
            vendor[r["group"]] = r["wall_us"]
        base = vendor.get(r["group"])
        ratio = f"{r['wall_us'] / base:.2f}x" if base else ""
        out.append(
            f"| {r['group']} | {r['label'].strip()} | {r['host_us']:.1f} | "
            f"{r['wall_us']:.1f} | {ratio} |"
        )
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bursts", type=int, default=21)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--profile", action="store_true", help="cProfile the entry points")
    args = parser.parse_args()
    if args.profile:
        return profile()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    import triton

    header = (
        f"{datetime.date.today()} · {torch.cuda.get_device_name()} · torch {torch.__version__} · "
        f"triton {triton.__version__} · Python {platform.python_version()} · "
        f"median of {args.bursts} bursts of {args.calls} back-to-back calls"
    )
    rows = floors(args.bursts, args.calls) + patch_embed(args.bursts, args.calls)
    rows += dilated(args.bursts, args.calls)
    table = render(rows, header)
    print(table)
    out = os.environ.get("OUT")
    if out:
        Path(out, "eager_host.md").write_text(table)
        doc = {"header": header, "rows": rows}
        Path(out, "eager_host.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
