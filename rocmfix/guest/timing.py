"""Correctness and time, the same way for every op: fp64 references, NaN-poisoned outputs,
eager timing (what users run) and CUDA-graph timing (the kernel alone)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from . import context
from .context import Context


def rel_err(out: Any, ref: Any) -> float:
    out64 = out.double()
    if not bool(context.torch.isfinite(out64).all()):
        return float("nan")
    return float((out64 - ref).norm() / ref.norm().clamp_min(1e-30))


def poison(ctx: Context, nbytes: int) -> None:
    # The caching allocator hands this NaN block to the next allocation of about this size:
    # an output element a kernel never writes stays NaN and fails the check.
    if ctx.gpu:
        block = context.torch.empty(
            nbytes // 4 + 64, dtype=context.torch.float32, device=ctx.device
        )
        block.fill_(float("nan"))
        del block


def dtype(name: str) -> Any:
    torch = context.torch
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def time_eager(ctx: Context, fn: Callable[[], Any], budget_s: float, bursts: int = 5) -> float:
    """Median milliseconds per call over bursts of back-to-back calls launched from Python, as
    MinerU launches them: the host's launch cost shows where it exceeds the kernel's time.
    (Events around every call would add their own host time to each call.)"""
    torch = context.torch
    ctx.sync()
    start = time.perf_counter()
    fn()
    ctx.sync()
    estimate = max(time.perf_counter() - start, 1e-6)
    calls = int(max(1, min(50, budget_s / bursts / estimate)))
    samples: list[float] = []
    for _ in range(bursts):
        if ctx.gpu:
            begin = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            samples.append(float(begin.elapsed_time(end)) / calls)
        else:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter() - t0) * 1e3 / calls)
    samples.sort()
    return samples[len(samples) // 2]


def time_graph(ctx: Context, fn: Callable[[], Any], budget_s: float, calls: int = 10) -> float:
    """Median GPU milliseconds per call from CUDA-graph replays: no host overhead, so a
    tile config is ranked by its kernel, not by Python's launch cost."""
    torch = context.torch
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    graph.replay()
    torch.cuda.synchronize()
    estimate = max(time.perf_counter() - start, 1e-6)
    reps = int(max(5, min(50, budget_s / estimate)))
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(reps)
    ]
    for begin, end in events:
        begin.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    samples = sorted(float(begin.elapsed_time(end)) / calls for begin, end in events)
    del graph
    return samples[len(samples) // 2]
