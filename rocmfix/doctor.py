"""``rocmfix doctor``: measure the slow ops and every scheme's kernel on this GPU, and say
which scheme to apply, if any.

The measuring runs in the target interpreter (:mod:`rocmfix.worker`, which holds it to its
time limits); this module turns the worker's events into frozen results and
adds what the environment says (the engine's verdicts and warnings, the tuned file). It never
prints.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from . import guest, kernels, measured, supervise, worker
from .checks import NOT_CHECKABLE, TRAPS, Confirm, EnvWarning, torch_build
from .environment import Environment
from .errors import UsageError, printable
from .fsops import TEST_HOOKS_ENV
from .guest import protocol
from .guest.protocol import item_id
from .ops import OPS, Op
from .registry import choose
from .results import (
    CaseResult,
    DoctorReport,
    KernelCheck,
    Measurement,
    OpReport,
    PatchStatus,
    StatusReport,
    Verdict,
    extended,
)
from .tuned_file import file_warnings as tuned_warnings
from .tuned_file import read as read_tuned

# A scheme must beat the native op by this much to be worth a patch.
WORTH = 1.2

DEFAULT_TIME_LIMIT_S = 10.0
# A trap's confirmation imports a package (vllm's import takes seconds) and prints a line.
CONFIRM_LIMIT_S = 60.0
# A Triton item's first call compiles the kernel; that is not the hang the limit is for.
TRITON_LIMIT_S = 180.0


def _items(ops: Sequence[Op]) -> list[protocol.MeasureItem]:
    return [
        protocol.MeasureItem(op=op.name, case=case.id, impl=impl)
        for op in ops
        for case in op.cases
        for impl in ("native", *op.scheme_names)
    ]


def _runs(
    ops: Sequence[Op],
    items: Sequence[protocol.MeasureItem],
    environ: Mapping[str, str] = os.environ,
) -> list[tuple[dict[str, str], list[protocol.MeasureItem]]]:
    """The worker runs that measure ``items``, each with its whole environment: the items of
    a scheme that needs settings read before torch is imported (``Scheme.env``) in a worker
    started with them, every other item in one started without any of them (what the user's
    stack does unless told)."""
    settings = {(op.name, s.name): s.env for op in ops for s in op.schemes}
    names = {name for env in settings.values() for name, _ in env}
    stock = {k: v for k, v in environ.items() if k not in names}
    groups: dict[tuple[tuple[str, str], ...], list[protocol.MeasureItem]] = {(): []}
    for item in items:
        groups.setdefault(settings.get((item.op, item.impl), ()), []).append(item)
    return [(dict(stock, **dict(env)), group) for env, group in groups.items() if group or not env]


def _limit(ops: Sequence[Op], time_limit: float) -> Callable[[str], float]:
    triton = {
        item_id(c.id, s.name) for op in ops for c in op.cases for s in op.schemes if s.needs_triton
    }
    return lambda item: max(time_limit, TRITON_LIMIT_S) if item in triton else time_limit


def _labels(ops: Sequence[Op], gpu: bool) -> dict[str, str]:
    return {
        item_id(case.id, impl): f"{op.title} {op.label(case.gpu if gpu else case.cpu)}: {impl}"
        for op in ops
        for case in op.cases
        for impl in ("native", *op.scheme_names)
    }


def select_ops(names: Sequence[str]) -> tuple[Op, ...]:
    known = {op.name: op for op in OPS}
    return tuple(known[name] for name in choose("op", names, list(known)))


def run(
    status: StatusReport,
    *,
    ops: Sequence[Op] = OPS,
    time_limit: float = DEFAULT_TIME_LIMIT_S,
    progress: worker.Progress | None = None,
) -> DoctorReport:
    """Measure every case of ``ops`` in the target interpreter; see the module doc."""
    env = status.environment
    if time_limit <= 0:
        raise UsageError("--time-limit must be more than 0 seconds")
    worker.needs_torch(env, "measure")
    status = dataclasses.replace(status, warnings=confirm_traps(env, status.warnings))
    items = _items(ops)
    body = worker.request("measure", ops, items=items, budget_s=0.5)
    labels: dict[str, str] = {}
    done = 0

    def on_event(event: protocol.AnyEvent) -> None:
        nonlocal done
        if progress is None:
            return
        if isinstance(event, protocol.Hello):
            # The table's own words for each row, at the shapes this device runs.
            labels.update(_labels(ops, event.device.kind == "gpu"))
            progress(done, len(items), "worker started")
        elif isinstance(event, protocol.Start):
            progress(done, len(items), labels.get(event.id, ""))
        elif isinstance(event, protocol.Measured):
            done += 1
            progress(done, len(items), f"{labels.get(event.id, '')}: {event.status}")

    answers = [
        worker.run(
            env.python.executable,
            dataclasses.replace(body, items=group),
            limit_for=_limit(ops, time_limit),
            listen=on_event,
            item_ids=[i.id for i in group],
            env=settings,
        )
        for settings, group in _runs(ops, items)
    ]
    answer = worker.Answer(
        hello=answers[0].hello,
        events=tuple(e for a in answers for e in a.events),
        fatal=next((a.fatal for a in answers if a.fatal), None),
        stderr_tail="".join(a.stderr_tail for a in answers)[-4000:],
    )
    compiled: dict[str, KernelCheck] = {}
    compiles = _compile_items(ops, answer)
    if compiles:
        if progress is not None:
            progress(done, len(compiles), "compiling the kernels it ran for their register use")
        compiled = kernels.compile_items(env, ops, compiles)
    report = build_report(
        status,
        answer,
        ops=ops,
        time_limit=time_limit,
        tuned_file=body.tuned_file,
        compiled=compiled,
    )
    # What status and apply follow for the ops whose slowness depends on the GPU.
    remember(report)
    return report


_CONFIRMS = {trap.code: trap.confirm for trap in TRAPS}


def confirm_traps(
    env: Environment, warnings: Sequence[EnvWarning], limit_s: float = CONFIRM_LIMIT_S
) -> tuple[EnvWarning, ...]:
    """``warnings`` with each trap of :data:`rocmfix.checks.TRAPS` among them confirmed or not
    by running its :class:`Confirm` in the target interpreter (once per code: rows share one),
    or said to be not checkable where it has none."""
    ran: dict[str, tuple[bool, str]] = {}
    out = []
    for warning in warnings:
        if warning.code not in _CONFIRMS:
            out.append(warning)
            continue
        confirm = _CONFIRMS[warning.code]
        if confirm is None:
            seen = (NOT_CHECKABLE, "no code to run shows more than the evidence above")
        else:
            if confirm.code not in ran:
                ran[confirm.code] = _run_confirm(env.python.executable, confirm, limit_s)
            seen = confirm.judge(*ran[confirm.code])
        out.append(dataclasses.replace(warning, confirmed=seen))
    return tuple(out)


def _run_confirm(python: str, confirm: Confirm, limit_s: float) -> tuple[bool, str]:
    """(whether the code ran, one line of what it showed), from a child of its own."""
    argv = guest.command(python, "confirm", confirm.code)
    try:
        done = supervise.capped(argv, timeout=limit_s, limit=64 * 1024)
    except OSError as exc:
        return False, f"cannot run {python}: {exc.strerror or exc}"
    if done.returncode is None:
        return False, f"no answer within {limit_s:g} s" if done.timed_out else "too much output"
    lines = done.stdout.decode("utf-8", "replace").strip().splitlines()
    said = printable(lines[-1], 300) if lines else ""
    if done.returncode < 0:
        try:
            return True, f"died of {signal.Signals(-done.returncode).name}"
        except ValueError:
            return True, f"died of signal {-done.returncode}"
    if done.returncode != 0 or not said:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return False, said or printable(tail[-1] if tail else f"exit {done.returncode}", 300)
    return True, said


def _compile_arch(device: protocol.DeviceFacts) -> str | None:
    """The GPU ahead-of-time compiles target for this device: its own arch, or, without a
    GPU, only the one a test names (``aot_arch`` in the test hooks)."""
    if device.kind == "gpu":
        return device.arch
    try:
        hooks = json.loads(os.environ.get(TEST_HOOKS_ENV) or "{}")
    except ValueError:
        return None
    arch = hooks.get("aot_arch") if isinstance(hooks, dict) else None
    return str(arch) if arch else None


def _compile_items(ops: Sequence[Op], answer: worker.Answer) -> list[protocol.CompileItem]:
    """Each Triton scheme's case as it ran (its config, its shape and dtype), to be compiled
    for the GPU it ran on: registers, spills and LDS are what the timings cannot show."""
    device = answer.device
    arch = _compile_arch(device)
    if arch is None:
        return []
    by_id = answer.by_id()
    items = []
    for op in ops:
        for case in op.cases:
            shape = case.gpu if device.kind == "gpu" else case.cpu
            for scheme in op.schemes:
                event = by_id.get(item_id(case.id, scheme.name))
                if not scheme.needs_triton or event is None or event.config is None:
                    continue
                items.append(
                    protocol.CompileItem(
                        id=event.id,
                        op=op.name,
                        scheme=scheme.name,
                        shape=case.id,
                        gpu=dict(shape),
                        dtype=shape["dtype"],
                        arch=arch,
                        config=event.config,
                    )
                )
    return items


def _measurement(
    case: str,
    impl: str,
    by_id: Mapping[str, protocol.Measured],
    compiled: Mapping[str, KernelCheck],
) -> Measurement:
    item = item_id(case, impl)
    event = by_id.get(item)
    if event is None:
        return Measurement(item, "missing", message="the worker never ran it", impl=impl)
    return extended(Measurement, event, impl=impl, compiled=compiled.get(item))


def build_report(
    status: StatusReport,
    answer: worker.Answer,
    *,
    ops: Sequence[Op],
    time_limit: float,
    tuned_file: str,
    compiled: Mapping[str, KernelCheck] | None = None,
) -> DoctorReport:
    """Turn the worker's events into the report (pure: the unit tests feed it events)."""
    compiled = compiled or {}
    env = status.environment
    device = answer.device
    by_id = answer.by_id()
    variant = "gpu" if device.kind == "gpu" else "cpu"
    reports = []
    for op in ops:
        results = tuple(
            CaseResult(
                op=op,
                case=case,
                shape=case.gpu if variant == "gpu" else case.cpu,
                native=_measurement(case.id, "native", by_id, compiled),
                schemes=tuple(_measurement(case.id, s, by_id, compiled) for s in op.scheme_names),
                timed=variant == "gpu",
            )
            for case in op.cases
        )
        patches = tuple(p for p in status.patches if p.patch.op is op)
        reports.append(_op_report(env, device, op, results, patches, time_limit))
    warnings = list(status.warnings)
    for message in dict.fromkeys(e.message for e in answer.of(protocol.KernelWarning)):
        warnings.append(
            EnvWarning(
                "kernel-warning", message, "the dropped-in kernels print the same warning in MinerU"
            )
        )
    overrides = answer.hello.overrides if answer.hello is not None else {}
    for name, value in sorted(overrides.items()):
        warnings.append(
            EnvWarning(
                "config-override",
                f"{name}={value} is set: it overrides the shipped and tuned configs",
                f"unset {name} unless you mean to pin a config",
            )
        )
    file = read_tuned(Path(tuned_file))
    if device.kind == "gpu":
        warnings.extend(tuned_warnings(file, device.arch, device))
    elif file.problem is not None:
        # Without a GPU no arch's entries apply, but a broken file is worth knowing about.
        warnings.extend(tuned_warnings(file, device.arch))
    return DoctorReport(
        status=status,
        device=device,
        ops=tuple(reports),
        time_limit_s=time_limit,
        tuned_file=tuned_file,
        tuned_archs=tuple(sorted(file.archs())),
        tuned_exists=file.exists,
        warnings=tuple(warnings),
        worker_error=answer.fatal,
        worker_log=answer.stderr_tail,
        graphs=next(iter(answer.of(protocol.Graphs)), None),
    )


def _total(results: Sequence[CaseResult], impl: str, floor: bool = False) -> float | None:
    """``impl``'s time over all cases, None where a case gave none; with ``floor``, a case
    that timed out counts as its limit (the total is then a lower bound)."""
    total = 0.0
    for result in results:
        m = next(m for m in (result.native, *result.schemes) if m.impl == impl)
        if m.status == "ok" and m.ms is not None:
            total += m.ms
        elif floor and m.status == "timeout" and m.limit_s is not None:
            total += m.limit_s * 1e3
        else:
            return None
    return total


def _op_report(
    env: Environment,
    device: protocol.DeviceFacts,
    op: Op,
    results: tuple[CaseResult, ...],
    patches: tuple[PatchStatus, ...],
    time_limit: float,
) -> OpReport:
    totals = {impl: _total(results, impl) for impl in ("native", *op.scheme_names)}
    native_total = _total(results, "native", floor=True)
    timed_out = [r for r in results if r.native.status == "timeout"]
    at_least = bool(timed_out) and native_total is not None
    candidates = [(ms, s) for s, ms in totals.items() if s != "native" and ms]
    recommended: str | None = None
    speedup: float | None = None
    if candidates:
        best_ms, recommended = min(candidates)
        if native_total:
            speedup = native_total / best_ms
    needed, why = _needed(env, op, patches, timed_out, time_limit)
    advice = _advice(device, op, patches, needed, recommended, speedup, at_least)
    return OpReport(
        op=op,
        cases=results,
        patches=patches,
        needed=needed,
        why=why,
        recommended=recommended,
        speedup=speedup,
        speedup_at_least=at_least,
        advice=advice,
        totals=totals,
    )


def _needed(
    env: Environment,
    op: Op,
    patches: tuple[PatchStatus, ...],
    timed_out: Sequence[CaseResult],
    time_limit: float,
) -> tuple[bool | None, str]:
    """Whether this stack needs the op's patch, in one plain sentence."""
    assert env.torch is not None
    forced = [p.patch.id for p in patches if p.verdict is Verdict.APPLIED]
    if not env.torch.hip:
        library = "cuDNN" if env.torch.cuda else "the CPU"
        why = (
            f"not needed on this stack: torch {env.torch.version} is a {torch_build(env)} build "
            f"and {library} runs {op.native} natively; the patch is for ROCm's MIOpen"
        )
        if forced:
            why += f" (applied here anyway, with --force: {', '.join(forced)})"
        return False, why
    installed = [p for p in patches if p.verdict is not Verdict.NOT_INSTALLED]
    evidence = (
        f"{op.native} did not finish within {time_limit:g} s on {len(timed_out)} of the shapes "
        "(a MIOpen kernel search or its naive kernel)"
        if timed_out
        else ""
    )
    if not installed:
        dists = " or ".join(dict.fromkeys(p.patch.distribution for p in patches))
        why = f"{dists or 'no package with this op'} is not installed here; measured anyway"
        return (True if timed_out else None), (why + (f": {evidence}" if evidence else ""))
    needing = [p for p in installed if p.verdict in (Verdict.APPLICABLE, Verdict.STALE)]
    applied = [p for p in installed if p.verdict is Verdict.APPLIED]
    upstream = [p for p in installed if p.verdict is Verdict.NOT_NEEDED]
    if needing:
        why = f"needed: {needing[0].reason}"
    elif applied:
        why = f"needed, and applied ({applied[0].scheme or 'default'} scheme)"
    elif upstream:
        return False, f"not needed: {upstream[0].patch.id}: {upstream[0].reason}"
    else:
        return (
            None,
            f"{installed[0].patch.id} is {installed[0].verdict.value}: {installed[0].reason}",
        )
    return True, why + (f"; {evidence}" if evidence else "")


def _advice(
    device: protocol.DeviceFacts,
    op: Op,
    patches: tuple[PatchStatus, ...],
    needed: bool | None,
    recommended: str | None,
    speedup: float | None,
    at_least: bool,
) -> str:
    if device.interpreter:
        return (
            "no GPU: the kernels ran in Triton's CPU interpreter on small shapes; "
            "their results were checked, their timings mean nothing"
        )
    if recommended is None:
        return "no scheme ran correctly here; keep the native op"
    if speedup is None:
        return f"fastest correct scheme: {recommended} (the native op gave no time to compare)"
    ratio = f"{'≥ ' if at_least else ''}{speedup:.1f}x"
    installed = [p.patch for p in patches if p.verdict is not Verdict.NOT_INSTALLED]
    only = "".join(f" --only {d}" for d in dict.fromkeys(p.distribution for p in installed))
    command = f"rocmfix apply{only} --scheme {recommended}"
    scheme = op.scheme(recommended)
    if not scheme.entry:  # a setting: rocmfix env exports it, or a patch selects it
        realized = [p.id for p in installed if p.realizes == recommended]
        if scheme.env:
            command = 'eval "$(rocmfix env)"'
        elif realized:
            command = "rocmfix apply" + "".join(f" --only {p}" for p in realized)
        else:
            return f"fastest: {recommended}, {ratio} {op.native}; no rocmfix setting selects it"
    if speedup < WORTH and not at_least:
        return (
            f"the native {op.native} is about as fast or faster ({recommended}: {ratio}); "
            "no scheme is worth a patch here"
        )
    if needed is False:
        return f"fastest scheme: {recommended}, {ratio} the native op; nothing to apply here"
    return f"recommend {recommended}: {ratio} faster than {op.native} here; `{command}`"


def remember(report: DoctorReport, file: Path | None = None) -> Path | None:
    """Record what ``report`` measured on a GPU for the ops whose verdict is measured: the
    best correct scheme's eager speed-up over the vendor op at MinerU's shapes. Nothing from
    Triton's CPU interpreter (its times mean nothing), nor for an op where a scheme failed."""
    device = report.device
    if device.interpreter:
        return None
    results, each = {}, {}
    for op in report.ops:
        failed = any(m.failed for case in op.cases for m in case.schemes)
        if op.op.measured_verdict and not failed and op.recommended and op.speedup:
            results[op.op.name] = (op.recommended, op.speedup)
            # The best scheme's speed-up is the native total over its total: each other
            # scheme's is the same native total over its own.
            native = op.speedup * (op.totals.get(op.recommended) or 0.0)
            each[op.op.name] = {
                s: native / ms for s, ms in op.totals.items() if s != "native" and ms and native
            }
    return measured.record(results, device.arch, device.torch, device.hip, file, speedups=each)
