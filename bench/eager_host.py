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
    python bench/eager_host.py --depthwise [--old OLD/templates] [--no-transposed] \
        --bursts 21 --calls 100

``--depthwise``: every MinerU depthwise shape and the DB head's transposed convs instead, the
dropped-in entries against ``F.conv2d`` (the module for the transposed ones) in strictly
interleaved bursts, median and interquartile range, and per depthwise shape the pieces of a
replayed call (see :func:`depthwise`) with the floors they set (bench/eager_gpu.sh runs it).

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


DEVICE = "cuda"  # --cpu-try: "cpu", the depthwise rows at the interpreter's shapes


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _burst(fn: Callable[[], Any], calls: int) -> tuple[float, float]:
    _sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    issued = time.perf_counter()
    _sync()
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


def interleaved(
    name: str, fns: list[tuple[str, Callable[[], Any]]], bursts: int, calls: int
) -> list[dict[str, Any]]:
    """Bursts of ``calls`` back-to-back calls of each of ``fns`` strictly in turn (A, B, A, B
    ...), so that a lent host's drift weighs on all alike: per call, the median and
    interquartile range of ``wall`` (synchronised at the burst's end) and of ``host``."""
    for _label, fn in fns:
        for _ in range(10):
            fn()
    host: dict[str, list[float]] = {label: [] for label, _ in fns}
    wall: dict[str, list[float]] = {label: [] for label, _ in fns}
    for _ in range(bursts):
        for label, fn in fns:
            h, w = _burst(fn, calls)
            host[label].append(h)
            wall[label].append(w)
    rows = []
    for label, _ in fns:
        q1, _q2, q3 = statistics.quantiles(wall[label], n=4)
        row = {"group": name, "label": label, "host_us": statistics.median(host[label]),
               "wall_us": statistics.median(wall[label]), "wall_q1": q1, "wall_q3": q3}  # fmt: skip
        print(f"{name:44s} {label:30s} wall {row['wall_us']:7.1f} ({q1:.1f}-{q3:.1f})  "
              f"host {row['host_us']:7.1f}", file=sys.stderr, flush=True)  # fmt: skip
        rows.append(row)
    return rows


_ACTS: dict[str, Any] = {"none": None, "relu": torch.nn.ReLU, "silu": torch.nn.SiLU,
                         "gelu": torch.nn.GELU, "hardswish": torch.nn.Hardswish}  # fmt: skip


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _planned(tri: Any, conv: Any, x: torch.Tensor, direct: bool, addresses: bool) -> Any:
    """``conv``'s replay planned with the launch options given (the module's defaults kept)."""
    saved = tri.DIRECT, tri.ADDRESSES
    tri.DIRECT, tri.ADDRESSES = direct, addresses
    try:
        tri.depthwise_conv2d(x, conv)
    finally:
        tri.DIRECT, tri.ADDRESSES = saved
    return tri.replay_of(conv)


def depthwise(bursts: int, calls: int, old: str | None) -> list[dict[str, Any]]:
    """Every MinerU depthwise shape (rocmfix/ops/depthwise_conv.py), under
    ``torch.inference_mode`` as MinerU's forwards run, in strictly interleaved bursts:
    ``F.conv2d`` alone (what the issue's target compares with); the entry with the conv alone
    (as RepLKFPN and the token conv call it: it replaces one ``F.conv2d``) as shipped, and
    planned to launch through Triton's ``CompiledKernel.run`` with the tensors (as before
    this change) and with their addresses; the entry with the layer's BatchNorm and activation
    (as PPLCNetV4 and HGNetV2 call it); the stock line that replaces; and the pieces of a
    replayed call: the entry with its launch stubbed (rocmfix's checks and the allocation),
    Triton's ``CompiledKernel.run`` alone on prepared tensors, the C launch alone as the entry
    calls it (addresses), the allocation alone. With ``old`` the fused entry of another tree's
    templates beside."""
    from rocmfix.guest.templates import load
    from rocmfix.ops import op

    tri = _load.template("depthwise_conv_triton")
    before = load(old, "depthwise_conv_triton", fresh=True) if old else None
    rows = []
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    cases = op("depthwise-conv").cases
    for case in cases if DEVICE == "cuda" else cases[:2]:
        s = case.gpu if DEVICE == "cuda" else case.cpu
        c, kh, kw = s["c"], s["kh"], s["kw"]
        dtype = torch.float16 if s["dtype"] == "float16" else torch.float32
        if DEVICE == "cpu":
            dtype = torch.float32  # the interpreter's fp16 is slow and proves nothing more

        def make_conv(
            c: int = c, kh: int = kh, kw: int = kw, s: Any = s, dtype: Any = dtype
        ) -> Any:
            conv = torch.nn.Conv2d(c, c, (kh, kw), s["s"], ((kh - 1) // 2, (kw - 1) // 2),
                                   groups=c, bias=False).to(DEVICE)  # fmt: skip
            with torch.no_grad():
                conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen, device=DEVICE))
                conv.weight.div_(kh)
            return conv.to(dtype).eval()

        # One conv per entry row: a layer keeps one replay, so a conv called both alone and
        # with its BatchNorm would plan anew at each burst's start (~4 us a call on an H100
        # host, 2026-11-25 05:33: the alone and fused rows of that run carry it).
        conv, fused = make_conv(), make_conv()
        bn = torch.nn.BatchNorm2d(c).to(DEVICE)
        with torch.no_grad():
            bn.running_var.copy_(torch.rand(c, generator=gen, device=DEVICE) + 0.5)
        bn = bn.to(dtype).eval()
        make = _ACTS[s["act"]]
        act = make() if make is not None else None
        x = torch.randn(s["n"], c, s["h"], s["w"], generator=gen, device=DEVICE).to(dtype)
        w, stride, pad = conv.weight.detach(), conv.stride, conv.padding

        def stock(x: Any = x, conv: Any = fused, bn: Any = bn, act: Any = act) -> Any:
            y = bn(conv(x))
            return act(y) if act is not None else y

        with torch.inference_mode():
            # Checked on replayed calls (the third), with a new input each.
            for _ in range(3):
                x2 = torch.randn(x.shape, generator=gen, device=DEVICE).to(dtype)
                err = _rel(tri.depthwise_conv2d(x2, fused, bn, act), stock(x2))
                err_alone = _rel(tri.depthwise_conv2d(x2, conv), conv(x2))
            plan = tri.replay_of(conv)
            via_run, via_addresses, stubbed = make_conv(), make_conv(), make_conv()
            run_plan = _planned(tri, via_run, x, False, False)
            _planned(tri, via_addresses, x, False, True)
            stub_plan = _planned(tri, stubbed, x, tri.DIRECT, tri.ADDRESSES)
        fns = [
            ("F.conv2d", partial(F.conv2d, x, w, None, stride, pad, 1, c)),
            ("entry alone", partial(tri.depthwise_conv2d, x, conv)),
            ("entry alone, via run, tensors", partial(tri.depthwise_conv2d, x, via_run)),
            ("entry alone, via run, addresses", partial(tri.depthwise_conv2d, x, via_addresses)),
            ("entry conv+BN+act", partial(tri.depthwise_conv2d, x, fused, bn, act)),
            ("stock conv, BN, act", stock),
        ]
        if before is not None:
            fns.append(
                ("old entry conv+BN+act", partial(before.depthwise_conv2d, x, fused, bn, act))
            )
        direct = False
        # A plan the bench's own calls did not make (the entry fell back) has no pieces.
        if None not in (plan, run_plan, stub_plan) and plan.launch is not None:
            tri._replays[id(stubbed)] = tuple(stub_plan._replace(launch=lambda *args: None))
            direct = plan.launch is not plan.launcher.compiled.run
            fns += [
                ("entry alone, launch stubbed", partial(tri.depthwise_conv2d, x, stubbed)),
                *_launch_pieces(x, plan, run_plan),
            ]
        with torch.inference_mode():
            group_rows = interleaved(case.id, fns, bursts, calls)
        for row in group_rows:
            row.update(rel_err=err, rel_err_alone=err_alone, direct=direct)
        rows += group_rows
    return rows


def _launch_pieces(x: torch.Tensor, plan: Any, run_plan: Any) -> list[tuple[str, Any]]:
    """Triton's ``CompiledKernel.run`` on prepared tensors, the launch as the replay makes it
    (``plan``'s, addresses), and the replay's allocation, each alone."""
    out = torch.empty(plan.out_shape, dtype=x.dtype, device=x.device)
    stream = plan.launcher.stream()
    k_run = (x, *run_plan.keep, out, *run_plan.rest)
    k_ptr = (x.data_ptr(), plan.wk, plan.scale, plan.shift, out.data_ptr(), *plan.rest)
    run, grid, after = run_plan.launch, run_plan.head, run_plan.between
    launch, head, between = plan.launch, plan.head, plan.between

    def run_alone() -> None:
        run(*grid, stream, *after, *k_run)

    def launch_alone() -> None:
        if plan.spread:
            launch(*head, stream, *between, *k_ptr)
        else:
            launch(*head, stream, *between, k_ptr)

    if plan.alloc == 0:
        alloc = partial(torch.empty_like, x)
    elif plan.alloc == 1:
        alloc = partial(torch.empty_like, x, memory_format=torch.contiguous_format)
    else:
        alloc = partial(x.new_empty, plan.out_shape)
    return [
        ("Triton's CompiledKernel.run alone", run_alone),
        ("the replay's launch alone", launch_alone),
        ("the allocation alone", alloc),
    ]


def render_pieces(rows: list[dict[str, Any]]) -> str:
    """One line per shape: the medians, each as a ratio of F.conv2d, and the floors (Triton's
    run + allocation; the replay's launch + allocation) that no Triton entry gets below."""
    by: dict[str, dict[str, float]] = {}
    err: dict[str, float] = {}
    for r in rows:
        by.setdefault(r["group"], {})[r["label"]] = r["wall_us"]
        err[r["group"]] = max(r.get("rel_err", 0.0), r.get("rel_err_alone", 0.0))
    out = ["| shape | F.conv2d µs | alone µs | fused µs | alone / F | fused / F | "
           "via run, tensors / F | run + alloc / F | launch + alloc / F | stubbed entry µs | "
           "rel err |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for group, m in by.items():
        f = m.get("F.conv2d")
        if not f or "entry alone" not in m:
            continue
        run, launch, alloc = (m.get(k) for k in ("Triton's CompiledKernel.run alone",
                              "the replay's launch alone", "the allocation alone"))  # fmt: skip
        cells = [m["entry alone"], m["entry conv+BN+act"],
                 m.get("entry alone, via run, tensors"),
                 None if run is None or alloc is None else run + alloc,
                 None if launch is None or alloc is None else launch + alloc]  # fmt: skip
        ratios = " | ".join("" if v is None else f"{v / f:.2f}x" for v in cells)
        stub = m.get("entry alone, launch stubbed")
        out.append(
            f"| {group} | {f:.1f} | {m['entry alone']:.1f} | {m['entry conv+BN+act']:.1f} | "
            f"{ratios} | {'' if stub is None else f'{stub:.1f}'} | {err[group]:.1e} |"
        )
    return "\n".join(out) + "\n"


def transposed(bursts: int, calls: int, old: str | None) -> list[dict[str, Any]]:
    """The DB head's two transposed convs (rocmfix/ops/conv_transpose.py): the module against
    the GEMM entry (and another tree's, with ``old``)."""
    from rocmfix.guest.templates import load
    from rocmfix.ops import op

    ct = _load.template("conv_transpose_linear")
    before = load(old, "conv_transpose_linear", fresh=True) if old else None
    rows = []
    for case in op("conv-transpose").cases:
        s = case.gpu if DEVICE == "cuda" else case.cpu
        d = torch.nn.ConvTranspose2d(s["cin"], s["cout"], s["k"], s["k"]).to(DEVICE).eval()
        x = torch.randn(s["n"], s["cin"], s["h"], s["w"], device=DEVICE)
        fns = [
            ("module (cuDNN)", partial(d, x)),
            ("entry (GEMM)", partial(ct.conv_transpose2d, x, d)),
        ]
        if before is not None:
            fns.append(("old entry (GEMM)", partial(before.conv_transpose2d, x, d)))
        with torch.inference_mode():
            err = _rel(ct.conv_transpose2d(x, d), d(x))
            group_rows = interleaved(case.id, fns, bursts, calls)
        for row in group_rows:
            row["rel_err"] = err
        rows += group_rows
    return rows


def render_interleaved(rows: list[dict[str, Any]], header: str) -> str:
    out = [header, "", "| case | call | wall µs/call (IQR) | host µs/call | vs first row |",
           "|---|---|---:|---:|---:|"]  # fmt: skip
    base: dict[str, float] = {}
    for r in rows:
        first = base.setdefault(r["group"], r["wall_us"])
        wall = f"{r['wall_us']:.1f} ({r['wall_q1']:.1f}-{r['wall_q3']:.1f})"
        ratio = r["wall_us"] / first
        out.append(f"| {r['group']} | {r['label']} | {wall} | {r['host_us']:.1f} | {ratio:.2f}x |")
    return "\n".join(out) + "\n"


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
    parser.add_argument(
        "--depthwise", action="store_true", help="the depthwise and transposed entries only"
    )
    parser.add_argument("--old", help="another tree's templates folder, measured beside")
    parser.add_argument("--cpu-try", action="store_true", help="--depthwise on the CPU (tiny)")
    parser.add_argument(
        "--no-transposed", action="store_true", help="--depthwise: leave the transposed convs"
    )
    args = parser.parse_args()
    if args.cpu_try:
        global DEVICE
        DEVICE = "cpu"
        os.environ["TRITON_INTERPRET"] = "1"  # before the first template imports triton
    if args.profile:
        return profile()
    if args.depthwise:
        return depthwise_main(args)
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


def depthwise_main(args: argparse.Namespace) -> int:
    import triton

    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (interpreter)"
    header = (
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC · "
        f"{name} · torch {torch.__version__} · triton "
        f"{triton.__version__} · Python {platform.python_version()} · median (IQR) of "
        f"{args.bursts} interleaved bursts of {args.calls} calls"
    )
    rows = depthwise(args.bursts, args.calls, args.old)
    if not args.no_transposed:
        rows += transposed(args.bursts, args.calls, args.old)
    table = render_interleaved(rows, header) + "\n" + render_pieces(rows)
    print(table)
    out = os.environ.get("OUT")
    if out:
        Path(out, "eager_depthwise.md").write_text(table)
        doc = {"header": header, "rows": rows}
        Path(out, "eager_depthwise.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
