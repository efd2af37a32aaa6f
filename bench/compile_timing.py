"""Timing for bench/compile_gpu.py: CUDA-event wall time, CUDA-graph replay time (GPU time
without the host's launches) and torch.profiler's kernel time by group.

``smoke`` (a CPU try of the bench) gives 1.0 for every time and no profile.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any


def ms(
    fns: dict[str, Callable[[], Any]],
    reps: int,
    smoke: bool = False,
    raw: dict[str, list[float]] | None = None,
) -> dict[str, float]:
    """Median ms per call of each, alternating so clocks and neighbours hit all alike;
    ``raw`` gets every call's ms, in order (for ratios of neighbouring calls)."""
    import torch

    if smoke:
        return {k: 1.0 for k in fns}
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        for _ in range(3):
            fn()
    for _ in range(reps):
        for key, fn in fns.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times[key].append(start.elapsed_time(end))
    if raw is not None:
        raw.update(times)
    return {k: statistics.median(v) for k, v in times.items()}


def paired(raw: dict[str, list[float]], ours: str, base: str) -> list[float]:
    """Quartiles of the ratios of neighbouring calls (``ours`` over ``base``, one round
    each): a slow drift of the host moves both calls of a round, and cancels."""
    ratios = sorted(a / b for a, b in zip(raw[ours], raw[base], strict=True))
    return [round(q, 4) for q in statistics.quantiles(ratios, n=4)]


def graph_ms(fns: dict[str, Callable[[], Any]], reps: int, smoke: bool = False) -> dict[str, float]:
    """Median ms per replay of each captured in a CUDA graph: GPU time alone, without the
    host's launches (which a compiled model still makes one by one in the default mode)."""
    import torch

    if smoke:
        return {k: 1.0 for k in fns}
    graphs = {}
    for key, fn in fns.items():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.inference_mode():
            fn()
        graphs[key] = graph
    return ms({k: g.replay for k, g in graphs.items()}, reps)


HOST_OPS = ("aten::convolution", "aten::cudnn_convolution", "aten::copy_", "aten::empty",
            "aten::empty_strided")  # fmt: skip


def kind(kernel: str) -> str:
    """A GPU kernel's group by its name: rocmfix's Triton kernels, the vendor's convolutions
    (cuDNN's names: xmma/implicit-GEMM fprop, grouped direct, winograd), the rest."""
    low = kernel.lower()
    if "_dconv_" in low:
        return "rocmfix_dilated"
    if "_dw_kernel" in low:
        return "rocmfix_depthwise"
    if any(k in low for k in ("conv", "cudnn", "xmma", "fprop", "implicit", "winograd")):
        return "vendor_conv"
    if low.startswith("triton_"):
        return "inductor"
    return "other"


def kernels(fn: Callable[[], Any], forwards: int = 5, smoke: bool = False) -> dict[str, Any]:
    """torch.profiler over ``forwards`` calls: GPU kernel time per forward by group (see
    :func:`kind`) and by kernel (the 8 largest), kernels per forward, and the host's CPU
    time per forward as the profiler's wall over the forwards."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if smoke:
        return {}
    with torch.inference_mode():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(forwards):
                fn()
            torch.cuda.synchronize()
    by_kernel: dict[str, float] = {}
    host: dict[str, list[float]] = {}  # the host's ops that launch convolutions: calls, us
    count = 0
    for e in prof.events():
        if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
            if e.name.startswith("rocmfix::") or e.name in HOST_OPS:
                seen = host.setdefault(e.name, [0.0, 0.0])
                seen[0] += 1 / forwards
                seen[1] += e.cpu_time_total / forwards
            continue
        if e.name.startswith(("Memcpy", "Memset")) or "cudaGraph" in e.name:
            continue
        us = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0)
        by_kernel[e.name] = by_kernel.get(e.name, 0.0) + us / forwards
        count += 1
    groups: dict[str, float] = {}
    for name, us in by_kernel.items():
        groups[kind(name)] = groups.get(kind(name), 0.0) + us
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1])[:8]
    return {
        "us_per_forward": {k: round(v, 1) for k, v in sorted(groups.items())},
        "total_us": round(sum(groups.values()), 1),
        "kernels_per_forward": count / forwards,
        "top": [[name[:90], round(us, 1)] for name, us in top],
        # Per forward, under the profiler (which adds a few us an op): calls, CPU us.
        "host_ops": {k: [round(c, 1), round(us, 1)] for k, (c, us) in sorted(host.items())},
    }


def count_calls(
    module: Any, names: list[str], fn: Callable[[], Any], forwards: int = 5
) -> dict[str, dict[str, float]]:
    """Calls of ``module``'s functions ``names`` per forward of ``fn`` and the host time spent
    in them (perf_counter, no sync): whether an op's implementation takes its cached launch
    plan in a compiled model, and what its Python costs there. The functions are looked up
    as module globals by their callers, so wrapping the attribute sees every call."""
    import time

    import torch

    counts = {n: [0, 0.0] for n in names if hasattr(module, n)}
    saved = {n: getattr(module, n) for n in counts}

    def wrap(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                counts[name][0] += 1
                counts[name][1] += time.perf_counter() - start

        return call

    try:
        for name, real in saved.items():
            setattr(module, name, wrap(name, real))
        with torch.inference_mode():
            for _ in range(forwards):
                fn()
    finally:
        for name, real in saved.items():
            setattr(module, name, real)
    return {
        n: {"calls": c / forwards, "host_us": round(s / forwards * 1e6, 1)}
        for n, (c, s) in counts.items()
    }


def host_profile(
    fn: Callable[[], Any], forwards: int = 20, top: int = 25, dump: str | None = None
) -> dict[str, Any]:
    """cProfile over ``forwards`` calls of ``fn`` (warm, synchronised once at the end): where
    a compiled forward's host time goes, per forward, by function (calls, own us, cumulative
    us), the ``top`` largest by own time. cProfile's own cost inflates small functions alike
    on both sides, so compare patched with stock, not with wall times. ``dump``: the whole
    profile written there too (``pstats``), for the calls below the top."""
    import cProfile
    import pstats

    import torch

    with torch.inference_mode():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(forwards):
            fn()
        prof.disable()
        torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    if dump:
        stats.dump_stats(dump)
    rows = []
    for (path, line, name), (_, calls, own, cum, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{path.rsplit('/', 2)[-1] if '/' in path else path}:{line}:{name}"
        rows.append((own, [where[:100], round(calls / forwards, 1), round(own / forwards * 1e6, 1),
                           round(cum / forwards * 1e6, 1)]))  # fmt: skip
    rows.sort(key=lambda r: -r[0])
    total = sum(r[0] for r in rows)
    return {"total_us": round(total / forwards * 1e6, 1), "top": [r[1] for r in rows[:top]]}
