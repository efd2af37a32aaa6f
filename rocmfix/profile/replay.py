"""Replay the hot calls in the target interpreter through doctor's worker
(:mod:`rocmfix.worker`, mode ``replay``): each recorded call is a case (a
:class:`~rocmfix.guest.protocol.Call`) measured as it ran, in the other forms of it and by each
scheme of the registry's op whose call it is (:attr:`rocmfix.ops.Op.replayed`), every form an
item under its own time limit (a MIOpen search or a native kernel that takes minutes is
killed, not waited on); and this machine's matmul rate and copy bandwidth, measured the same
way."""

from __future__ import annotations

import dataclasses
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rocmfix import worker
from rocmfix.guest import protocol
from rocmfix.ops import OPS

from .model import Calibration, Form

REPLAY_LIMIT_S = 120.0
# The generic forms of a conv (harness/call.py says which exist for a call; the others answer
# "unavailable"), after the call as it ran.
FORMS = ("native", "channels-last", "contiguous", "reshape+matmul", "native fallback")
# Calibration: a square matmul per dtype and a float32 copy.
_MATMUL = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Replayed:
    device_name: str | None = None
    calibration: Calibration | None = None
    forms: dict[str, tuple[Form, ...]] = field(default_factory=dict)
    fatal: str | None = None


def _calibration(gpu: bool) -> dict[str, protocol.Call]:
    n = 4096 if gpu else 1024
    calls = {
        f"calibrate-{dtype}": protocol.Call(
            name="aten::mm", shapes=[[n, n]] * 2, dtypes=[dtype] * 2
        )
        for dtype in (_MATMUL if gpu else _MATMUL[:1])
    }
    elems = (256 if gpu else 32) * 2**20 // 4
    calls["calibrate-copy"] = protocol.Call(name="aten::copy_", shapes=[[elems]] * 2,
                                            dtypes=["float32"] * 2)  # fmt: skip
    return calls


def run(
    python: str,
    calls: Mapping[str, protocol.Call],
    device: str,
    backend: Mapping[str, Any],
    limit_s: float = REPLAY_LIMIT_S,
) -> Replayed:
    """Each call's forms by its key in ``calls``, and the calibration."""
    gpu = device == "cuda"
    cases = {f"op{n}": call for n, call in enumerate(calls.values())}
    specs: dict[str, protocol.OpSpec] = {}
    items = [protocol.MeasureItem(op="", case=case, impl="native") for case in _calibration(gpu)]
    for case, call in cases.items():
        items += [protocol.MeasureItem(op="", case=case, impl=impl) for impl in FORMS]
        op = next((each for each in OPS if each.name == call.op), None)
        if op is None:
            continue
        # The op's schemes under their forms' labels: a scheme shares no name with a form.
        schemes = {label: s for label, s in op.replayed.items() if gpu or not s.needs_triton}
        specs[op.name] = dataclasses.replace(
            op.request(), schemes={label: s.entry for label, s in schemes.items()},
            triton_schemes=[label for label, s in schemes.items() if s.needs_triton],
        )  # fmt: skip
        items += [protocol.MeasureItem(op=op.name, case=case, impl=label) for label in schemes]
    body = dataclasses.replace(
        worker.request("replay", ()), ops=specs, items=items,
        templates=sorted({t for spec in specs.values() for t in spec.schemes.values()}),
        calls={**_calibration(gpu), **cases}, backend=dict(backend), interpret=not gpu,
    )  # fmt: skip
    try:
        answer = worker.run(python, body, limit_for=lambda _item: limit_s, need_hello=False,
                            item_ids=[item.id for item in items],
                            idle_limit_s=max(limit_s, 300.0))  # fmt: skip
    except worker.ProtocolRefusal as exc:
        return Replayed(fatal=exc.message)
    measured = answer.by_id()
    forms = {}
    for key, case in zip(calls, cases, strict=True):
        forms[key] = tuple(
            _form(item.impl, measured[item.id])
            for item in items
            if item.case == case and item.id in measured
            and measured[item.id].status != "unavailable"
        )  # fmt: skip
    return Replayed(_device_name(answer, backend), _calibrated(measured, gpu), forms, answer.fatal)


def _form(impl: str, m: protocol.Measured) -> Form:
    error = None if m.status in ("ok", "failed") else f"{m.status}: {m.message or ''}".rstrip(": ")
    if m.status == "timeout":  # a MIOpen search or a native kernel that takes minutes
        error = "killed at its time limit" + (f" ({m.limit_s:.0f} s)" if m.limit_s else "")
    return Form(label="as run" if impl == "native" else impl, ms=m.ms, first_ms=m.first_ms,
                rel_err=m.rel_err, ok=m.status == "ok", error=error)  # fmt: skip


def _calibrated(measured: Mapping[str, protocol.Measured], gpu: bool) -> Calibration | None:
    """This machine's matmul rate per dtype and copy bandwidth, from the calibration calls."""
    rates, copy_gbps = {}, 0.0
    for case, call in _calibration(gpu).items():
        ms = measured.get(protocol.item_id(case, "native"), protocol.Measured("", "missing")).ms
        if ms is None or ms <= 0:
            return None
        n = call.shapes[0][0]
        if call.name == "aten::mm":
            rates[call.dtypes[0]] = 2 * n**3 / (ms * 1e-3) / 1e12
        else:
            copy_gbps = 2 * n * 4 / (ms * 1e-3) / 1e9
    return Calibration(matmul_tflops=rates, copy_gbps=copy_gbps)


def _device_name(answer: worker.Answer, backend: Mapping[str, Any]) -> str | None:
    if answer.hello is None:
        return None
    if answer.device.kind == "gpu":
        return answer.device.name
    threads = int(backend.get("num_threads") or 1)
    return f"CPU ({platform.machine()}, {threads} thread{'s' if threads != 1 else ''})"
