"""``rocmfix doctor``'s measuring, in the target interpreter: per item (one case of one op, run
natively or by one scheme), the first call (kernel search or compile included), a check of a
second call's output against fp64, and the median of further calls."""

from __future__ import annotations

import os
import time
import traceback
import warnings
from typing import Any

from . import context, harness
from .context import Context, Unavailable, finite, interpreter_unavailable, one_line
from .harness.base import Bench
from .protocol import First, Measured, MeasureItem, Start
from .timing import poison, rel_err, time_eager, time_graph


def measure(ctx: Context) -> None:
    request = ctx.request
    skip = set(request.skip)
    benches: dict[str, Bench] = {}
    budget_s = request.budget_s if request.budget_s is not None else 0.5
    hooks = ctx.hooks
    for item in request.items:
        item_id = item.id
        if item_id in skip:
            continue
        result: dict[str, Any] = {"id": item_id, "status": "ok"}
        ctx.channel.send(Start(id=item_id))
        if item_id in hooks.get("crash", []):
            os._exit(70)
        if item_id in hooks.get("sleep", {}):
            if hooks.get("pidfile"):
                with open(hooks["pidfile"], "a", encoding="utf-8") as handle:
                    handle.write(f"{os.getpid()}\n")
            time.sleep(float(hooks["sleep"][item_id]))
        caught: list[Any] = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                _measure_item(ctx, item, benches, result, budget_s)
        except Unavailable as exc:
            result["status"] = "unavailable"
            result["message"] = str(exc)
        except Exception as exc:  # noqa: BLE001 - one implementation's error is a finding
            unavailable = None if ctx.gpu else interpreter_unavailable(exc)
            if unavailable is not None:
                result["status"] = "unavailable"
                result["message"] = str(unavailable)
            else:
                result["status"] = "error"
                result["message"] = one_line(exc)
                result["traceback"] = traceback.format_exc()[-2000:]
        ctx.forward(caught)
        ctx.channel.send(Measured(**result))


def _bench(ctx: Context, item: MeasureItem, benches: dict[str, Bench]) -> Bench:
    call = ctx.request.calls.get(item.case)  # the profile's replay: one bench for every form
    key = item.case if call is not None else item.op + "/" + item.case
    if key not in benches and call is not None:
        benches[key] = harness.module("call").Bench(ctx, ctx.request.ops.get(call.op), call)
    elif key not in benches:
        op = ctx.request.ops[item.op]
        shape = op.cases[item.case].on(ctx.variant)
        benches[key] = harness.module(op.harness).Bench(ctx, op, shape)
    return benches[key]


def _measure_item(
    ctx: Context,
    item: MeasureItem,
    benches: dict[str, Bench],
    result: dict[str, Any],
    budget_s: float,
) -> None:
    item_id, impl = item.id, item.impl
    bench = _bench(ctx, item, benches)
    if impl == "native":
        fn, config = bench.native(), None
    else:
        op = ctx.request.ops.get(item.op)
        if op is not None and impl in op.triton_schemes:
            ctx.needs_triton()
        entry = op.schemes[impl] if op is not None else ""
        fn, config = bench.scheme(ctx.module(entry)) if entry else (bench.setting(impl), None)
    result["config"] = config
    torch = context.torch
    with torch.no_grad():
        ctx.sync()
        t0 = time.perf_counter()
        out = fn()
        ctx.sync()
        result["first_ms"] = (time.perf_counter() - t0) * 1e3
        ctx.channel.send(First(id=item_id, ms=result["first_ms"]))
        if ctx.gpu:
            del out
            poison(ctx, bench.out_bytes)
            out = fn()
            ctx.sync()
        if item_id in ctx.hooks.get("corrupt", []):
            out = out + 1.0
        err = rel_err(out.reshape(bench.ref.shape), bench.ref)
        del out
        result["rel_err"] = finite(err)
        if impl != "native":
            result["tolerance"] = bench.tolerance()
            if not err < result["tolerance"]:  # NaN fails too
                result["status"] = "failed"
        if ctx.request.mode == "replay":  # the user's own call, on the device it ran on
            result["ms"] = time_eager(ctx, fn, budget_s)
        elif ctx.gpu:
            # What users get (eager, one Python call per op) decides; the kernel's own time
            # beside it shows how much of that is the host's launch cost.
            result["ms"] = time_eager(ctx, fn, budget_s)
            try:
                result["kernel_ms"] = time_graph(ctx, fn, budget_s)
            except Exception:  # noqa: BLE001 - a path a CUDA graph cannot record: no kernel time
                result["kernel_ms"] = None
        else:
            # One interpreted call: the timing means nothing, the check does.
            result["ms"] = result["first_ms"]
