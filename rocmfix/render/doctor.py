"""``doctor``: the device, the verdicts, and every case measured natively and by each scheme."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Console
from rich.markup import escape

from rocmfix import __version__
from rocmfix.guest.protocol import Graphs
from rocmfix.ops import Op
from rocmfix.render.console import (
    Cell,
    document,
    duration,
    environment_line,
    failures,
    grid,
    heading,
    out,
    warnings_block,
    wrapper,
)
from rocmfix.render.kernels import check_json, tile
from rocmfix.render.status import lead, status_document, verdicts_block, warning_json
from rocmfix.results import (
    LAUNCH_BOUND,
    CaseResult,
    DoctorReport,
    KernelCheck,
    Measurement,
    OpReport,
)

SCHEMA = "rocmfix-doctor/1"


def _case_label(result: CaseResult) -> str:
    return result.op.label(result.shape)


def _impl_label(report: DoctorReport, op: Op, impl: str) -> str:
    if impl == "native":
        library = (report.device.conv_library or "").split(" ")[0] or report.device.backend
        if report.device.interpreter:
            library = "CPU"
        return f"{op.native} ({library})"
    return f"{impl} ({op.scheme(impl).label})"


def _err_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def _device_line(report: DoctorReport) -> str:
    d = report.device
    if d.kind != "gpu":
        return (
            f"no GPU visible to torch {d.torch}: the kernels ran in Triton's CPU interpreter "
            "on small shapes (correctness only)"
        )
    build = f"ROCm {d.hip}" if d.hip else f"CUDA {d.cuda}"
    parts = [f"{d.name} ({d.arch})" + (f" x{d.count}" if d.count > 1 else ""), build]
    if d.conv_library:
        parts.append(d.conv_library)
    parts.append(f"triton {d.triton}" if d.triton else "no triton")
    return " · ".join(parts)


def _packages_line(report: DoctorReport) -> str:
    versions = report.environment.versions
    names = ("vllm", "mineru", "mineru-vl-utils", "doclayout-yolo", "triton", "pytorch-triton-rocm")
    return " · ".join(f"{n} {versions[n]}" for n in names if n in versions) or "-"


def _tuned_line(report: DoctorReport) -> str:
    arch = report.device.arch
    if not report.tuned_exists:
        return f"none ({report.tuned_file} does not exist; `rocmfix tune` writes it)"
    if report.device.interpreter:
        return f"{report.tuned_file} (not used without a GPU)"
    if arch in report.tuned_archs:
        return f"{report.tuned_file}: tuned configs for this GPU ({arch})"
    return f"no tuned configs for {arch} in {report.tuned_file}: the shipped ones apply"


def _compiled_line(c: KernelCheck) -> str:
    words = [
        f"{c.registers if c.registers is not None else '?'} registers",
        f"{c.spills} spilled",
        f"{c.shared / 1024:.0f}/{c.shared_limit // 1024} KiB LDS",
    ]
    if c.waves is not None:
        words.append(f"{c.waves} waves/SIMD")
    if c.matrix_wanted:
        words.append(f"{c.matrix_wanted} x{c.matrix}" if c.matrix else f"no {c.matrix_wanted}")
    text = ", ".join(words)
    return text if c.ok else f"{text}; {'; '.join(c.problems)}"


def _compiled_block(console: Console, report: DoctorReport) -> None:
    """Registers, spills and LDS of each config the Triton schemes ran, once per kernel,
    dtype and config: what a slow time alone cannot explain."""
    lines: dict[str, list[str]] = {}
    arch = ""
    for op in report.ops:
        for result in op.cases:
            for m in result.schemes:
                c = m.compiled
                if c is None:
                    continue
                arch = c.arch
                label = f"{op.op.name} {m.impl} ({c.kernel}, {c.dtype}, {tile(c)})"
                lines.setdefault(label, []).append(_compiled_line(c))
    if not lines:
        return
    console.print(f"[bold]Compiled for {escape(arch)}[/] (the configs above, ahead of time)")
    wrap = wrapper(console)
    for label, texts in lines.items():
        for text in dict.fromkeys(texts):
            console.print(wrap(f"{label}: {text}", "  ", "    "))


DOCTOR_HEADER = ("impl", "first call", "eager", "kernel", "vs native", "rel err", "check")


def _check_cell(m: Measurement) -> Cell:
    """The check column as plain text and a style: every verdict whole at any width."""
    if m.status == "ok":
        return ("ok", "green") if m.checked else ("reference", "dim")
    if m.status == "failed":
        return (f"WRONG (> {m.tolerance:.0e})" if m.tolerance else "WRONG", "red")
    if m.status == "timeout":
        return (f"no result within {m.limit_s:g} s" if m.limit_s else "timeout", "yellow")
    if m.status == "unavailable":
        return (f"unavailable: {m.message or ''}", "dim")
    return (f"{m.status}: {m.message or ''}", "red")


def _op_rows(op: OpReport) -> list[list[Cell]]:
    rows: list[list[Cell]] = []
    for result in op.cases:
        rows.append([(_case_label(result), "bold")])
        for m in (result.native, *result.schemes):
            ratio = result.speedup(m) if m.checked else None
            rows.append(
                [
                    (m.impl, ""),
                    (duration(m.first_ms), ""),
                    (duration(m.ms if result.timed else None), ""),
                    (_kernel_time(m, result.timed), ""),
                    ("-" if ratio is None else f"{ratio:.1f}x", ""),
                    (_err_text(m.rel_err), ""),
                    _check_cell(m),
                ]
            )
    return rows


def _checked_lines(console: Console, op: OpReport) -> None:
    """Without a GPU the kernels ran in Triton's CPU interpreter, where a time means nothing:
    one line per case with each scheme's check and its error against fp64 (the native op is
    named only where it did not give its reference)."""
    wrap = wrapper(console)
    for result in op.cases:
        parts = []
        for m in (result.native, *result.schemes):
            text, _ = _check_cell(m)
            if m.impl == "native" and text == "reference":
                continue
            err = f" (rel err {_err_text(m.rel_err)})" if m.rel_err is not None else ""
            parts.append(f"{m.impl} {text}{err}")
        label = _case_label(result)
        line = wrap(f"{label}: {', '.join(parts)}", "  ", "    ")
        line.stylize("bold", 2, 2 + len(label))
        console.print(line)


def doctor_table(report: DoctorReport) -> None:
    """The device and verdicts, then per op its cases as rows of one implementation each
    (short names, spelled out once above them), fitting the terminal at any width."""
    console = out()
    wrap = wrapper(console)
    for title, text in (
        ("Environment", environment_line(report.environment)),
        ("Device", _device_line(report)),
        ("Packages", _packages_line(report)),
        ("Tuned", _tuned_line(report)),
    ):
        heading(console, title, text)
    warnings = lead(console, report.environment, report.warnings)
    verdicts_block(console, report.status)
    for op in report.ops:
        console.print()
        console.print(f"[bold]{escape(op.op.title)}[/]")
        impls = dict.fromkeys(m.impl for r in op.cases for m in (r.native, *r.schemes))
        names = [
            f"native = {_impl_label(report, op.op, i)}" if i == "native"
            else _impl_label(report, op.op, i)
            for i in impls
        ]  # fmt: skip
        console.print(wrap(f"impl: {', '.join(names)}", "  ", "    "), style="dim")
        if report.device.interpreter:
            _checked_lines(console, op)
        else:
            grid(console, DOCTOR_HEADER, _op_rows(op), right=(False, True, True, True, True, True))
    console.print()
    if not report.device.interpreter and any(
        m.launch_bound for op in report.ops for r in op.cases for m in (r.native, *r.schemes)
    ):
        console.print(
            wrap(
                f"* launch-bound: the eager time per call is over {LAUNCH_BOUND:g}x the "
                "kernel's, so the host's per-call cost sets it. Eager times decide the advice: "
                "they are what MinerU gets.",
                "",
                "  ",
            )
        )
    _compiled_block(console, report)
    for op in report.ops:
        console.print(f"[bold]{escape(op.op.title)}[/]")
        if len(op.cases) > 1 and not report.device.interpreter:
            totals = ", ".join(
                f"{_impl_label(report, op.op, impl).split(' (')[0]} {duration(ms)}"
                for impl, ms in op.totals.items()
            )
            console.print(wrap(f"all {len(op.cases)} shapes: {totals}", "  ", "    "))
        console.print(wrap(op.why, "  ", "    "))
        console.print(wrap(op.advice, "  ", "    "))
    if report.graphs is not None:
        heading(console, "Graphs", _graphs_line(report.graphs))
    warnings_block(console, warnings)
    failures(report.failures, report.worker_log)


def _graphs_line(g: Graphs) -> str:
    """What the graph runner did here, and the caps in force, in one sentence each."""
    if g.status == "ok":
        each = zip(g.held_bytes, g.shapes, strict=False)
        held = ", ".join(f"{b / 2**20:.0f} MiB at {s}" for b, s in each)
        did = f"replayed equal to eager here; a small conv net's graphs held {held}."
    else:
        did = f"{g.status}: {g.message or 'no reason given'}."
    c = g.caps
    if not c:
        return did
    return (
        f"{did} Caps in force: a shape is captured once seen {c.get('MIN_SEEN')} times, and "
        f"while a model's graphs have been replayed {c.get('PAYBACK')} times a capture; at "
        f"most {c.get('MAX_GRAPHS')} graphs and {c.get('MAX_CAPTURES')} captures a model, "
        f"none new past {c.get('MAX_BYTES', 0) >> 20} MiB held."
    )


def _kernel_time(m: Measurement, timed: bool) -> str:
    if not timed:
        return duration(None)
    return duration(m.kernel_ms) + ("*" if m.launch_bound else "")


# Fields a measurement has from its worker event that doctor's document leaves out, as it did
# before Measurement was that event: the case is its entry's, and the guest's traceback goes
# to the worker's stderr tail.
_NOT_IN_JSON = ("id", "traceback")


def _measurement_json(m: Measurement, result: CaseResult) -> dict[str, Any]:
    fields = dataclasses.asdict(m)
    return {
        **{k: v for k, v in fields.items() if k not in _NOT_IN_JSON},
        "launch_bound": m.launch_bound,
        "speedup": result.speedup(m) if m.checked else None,
        "config": dict(m.config) if m.config else None,
        "compiled": check_json(m.compiled) if m.compiled else None,
    }


def doctor_document(report: DoctorReport) -> dict[str, Any]:
    d = report.device
    status = status_document(report.status)
    return {
        "schema": SCHEMA,
        "rocmfix_version": __version__,
        "environment": status["environment"],
        # Every fact the worker reported, and whether the kernels ran in the interpreter.
        "device": {**dataclasses.asdict(d), "interpreter": d.interpreter},
        "versions": dict(sorted(report.environment.versions.items())),
        # Each patch as status --json gives it.
        "patches": status["patches"],
        "time_limit_s": report.time_limit_s,
        "tuned_file": report.tuned_file,
        "tuned_archs": list(report.tuned_archs),
        "tuned_exists": report.tuned_exists,
        "ops": [
            {
                "op": op.op.name,
                "needed": op.needed,
                "why": op.why,
                "recommended": op.recommended,
                "speedup": op.speedup,
                "speedup_at_least": op.speedup_at_least,
                "advice": op.advice,
                "totals_ms": dict(op.totals),
                "cases": [
                    {
                        "id": r.case.id,
                        "shape": dict(r.shape),
                        "native": _measurement_json(r.native, r),
                        "schemes": [_measurement_json(m, r) for m in r.schemes],
                    }
                    for r in op.cases
                ],
            }
            for op in report.ops
        ],
        "warnings": [warning_json(w) for w in report.warnings],
        "graphs": dataclasses.asdict(report.graphs) if report.graphs else None,
        "ok": report.ok,
        "failures": list(report.failures),
    }


def doctor_json(report: DoctorReport) -> None:
    document(doctor_document(report))
    failures(report.failures, report.worker_log)
