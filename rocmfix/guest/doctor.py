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
from .harness.base import Case
from .timing import poison, rel_err, time_eager, time_graph


def measure(ctx: Context) -> None:
    request = ctx.request
    skip = set(request.get("skip", []))
    cases: dict[str, Case] = {}
    budget_s = float(request.get("budget_s", 0.5))
    hooks = ctx.hooks
    for item in request["items"]:
        item_id = item["id"]
        if item_id in skip:
            continue
        result: dict[str, Any] = {"event": "item", "id": item_id, "status": "ok"}
        ctx.channel.send({"event": "start", "id": item_id})
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
                _measure_item(ctx, item, cases, result, budget_s)
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
        ctx.channel.send(result)


def _case(ctx: Context, item: dict[str, Any], cases: dict[str, Case]) -> Case:
    key = item["op"] + "/" + item["case"]
    if key not in cases:
        op = ctx.request["ops"][item["op"]]
        shape = op["cases"][item["case"]][ctx.variant]
        cases[key] = harness.module(op["harness"]).Case(ctx, op, dict(shape))
    return cases[key]


def _measure_item(
    ctx: Context,
    item: dict[str, Any],
    cases: dict[str, Case],
    result: dict[str, Any],
    budget_s: float,
) -> None:
    item_id, impl = item["id"], item["impl"]
    case = _case(ctx, item, cases)
    if impl == "native":
        fn, config = case.native(), None
    else:
        op = ctx.request["ops"][item["op"]]
        if impl in op["triton_schemes"]:
            ctx.needs_triton()
        fn, config = case.scheme(ctx.module(op["schemes"][impl]))
    result["config"] = config
    torch = context.torch
    with torch.no_grad():
        ctx.sync()
        t0 = time.perf_counter()
        out = fn()
        ctx.sync()
        result["first_ms"] = (time.perf_counter() - t0) * 1e3
        ctx.channel.send({"event": "first", "id": item_id, "ms": result["first_ms"]})
        if ctx.gpu:
            del out
            poison(ctx, case.out_bytes)
            out = fn()
            ctx.sync()
        if item_id in ctx.hooks.get("corrupt", []):
            out = out + 1.0
        err = rel_err(out.reshape(case.ref.shape), case.ref)
        del out
        result["rel_err"] = finite(err)
        if impl != "native":
            result["tolerance"] = case.tolerance()
            if not err < result["tolerance"]:  # NaN fails too
                result["status"] = "failed"
        if ctx.gpu:
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
