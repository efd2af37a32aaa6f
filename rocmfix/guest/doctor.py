"""``rocmfix doctor``'s measuring, in the target interpreter: per item (one case of one op, run
natively or by one scheme), the first call (kernel search or compile included), a check of a
second call's output against fp64, and the median of further calls."""

from __future__ import annotations

import contextlib
import os
import time
import traceback
import warnings
from typing import Any

from . import context, harness, templates
from .context import Context, Unavailable, finite, interpreter_unavailable, one_line
from .harness.base import Bench
from .protocol import First, Graphs, Measured, MeasureItem, Start
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
    ctx.channel.send(graphs(ctx))


# The graph runner's settings doctor reports (the environment sets the first two).
GRAPH_CAPS = ("MIN_SEEN", "PAYBACK", "MAX_GRAPHS", "MAX_CAPTURES", "MAX_BYTES")
# det's two page sizes (MinerU's OCR det, A4 and Letter at 200 DPI).
GRAPH_SHAPES = ((1, 3, 960, 672), (1, 3, 736, 960))


def graphs(ctx: Context) -> Graphs:
    """The graph runner here: its caps, and on a GPU the memory each graph of a small conv net
    holds (the runner's own ``held_bytes``), with each replay checked against eager."""
    try:
        runner = templates.load(ctx.request.templates_dir, "rocmfix_graphs", fresh=True)
        caps = {name: int(getattr(runner, name)) for name in GRAPH_CAPS}
    except Exception as exc:  # noqa: BLE001 - a finding, not the end of doctor
        return Graphs(status="error", message=one_line(exc))
    if not ctx.gpu or not runner.ENABLED:
        why = "ROCMFIX_GRAPHS=0: graph replay is off" if ctx.gpu else "no GPU: nothing to capture"
        return Graphs(status="unavailable", message=why, caps=caps)
    # Its own copy: this check captures at a shape's 2nd call, whatever the environment says.
    vars(runner).update(MIN_SEEN=2, PAYBACK=0)
    torch = context.torch
    nn = torch.nn
    held: list[int] = []
    try:
        with warnings.catch_warnings(), torch.inference_mode():
            warnings.simplefilter("ignore")  # a capture that fails is in the stats
            net = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1),
                                nn.ReLU(), nn.Conv2d(32, 1, 1)).to(ctx.device).eval()  # fmt: skip
            for shape in GRAPH_SHAPES:
                x = torch.randn(shape, device=ctx.device)
                for _ in range(3):  # eager, captured, replayed
                    out = runner.forward(net, x)
                if not torch.equal(out, net(x)):
                    return Graphs(status="failed", message="a replay differed from eager",
                                  caps=caps)  # fmt: skip
                held.append(runner.held_bytes(net) - sum(held))
        stats = runner.stats(net)
    except Exception as exc:  # noqa: BLE001
        return Graphs(status="error", message=one_line(exc), caps=caps)
    shapes = ["x".join(map(str, s)) + " fp32" for s in GRAPH_SHAPES]
    if stats["broken"] or stats["graphs"] != len(GRAPH_SHAPES):
        why = stats["broken"] or f"{stats['graphs']} graphs kept, counts {stats['counts']}"
        return Graphs(status="failed", message=why, caps=caps)
    return Graphs(status="ok", shapes=shapes, held_bytes=held, caps=caps)


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
        # What users get (eager, one Python call per op) decides; the replay times the user's
        # own call on the device it ran on. One interpreted call's time means nothing (the
        # check does).
        replay = ctx.request.mode == "replay"
        result["ms"] = time_eager(ctx, fn, budget_s) if ctx.gpu or replay else result["first_ms"]
        if ctx.gpu and not replay:
            # The kernel's own time beside it shows how much of that is the host's launch cost
            # (none where a CUDA graph cannot record the path).
            with contextlib.suppress(Exception):
                result["kernel_ms"] = time_graph(ctx, fn, budget_s)
