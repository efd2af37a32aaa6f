"""``kernels``: what the compiler made of every shipped kernel, per GPU arch."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.markup import escape

from rocmfix import __version__
from rocmfix.render.console import (
    Cell,
    config_text,
    document,
    environment_line,
    failures,
    grid,
    heading,
    out,
    wrapper,
)
from rocmfix.results import KernelCheck, KernelsReport

SCHEMA = "rocmfix-kernels/1"


def tile(check: KernelCheck) -> str:
    return config_text({**check.constexprs, **check.options})


def _shared(check: KernelCheck) -> str:
    return f"{check.shared / 1024:.0f}/{check.shared_limit // 1024} KiB"


def _matrix(check: KernelCheck) -> Cell:
    if not check.matrix_wanted:
        return ("FMA" if check.operands else "-", "dim")
    if check.matrix:
        return (f"{check.matrix_wanted} x{check.matrix}", "")
    return ("missing", "red")


def _spills(check: KernelCheck) -> str:
    if check.registers is None:
        return "-"
    return str(check.spills) + (f" ({check.sgpr_spills} sgpr)" if check.sgpr_spills else "")


HEADER = ("arch", "regs", "spills", "LDS", "waves", "matrix", "check", "config")
LEGEND = (
    "regs: VGPRs (AMD) or registers (NVIDIA) per lane; LDS: shared memory used of the GPU's; "
    "waves: per SIMD, as registers allow; matrix: the GPU's matrix instruction and how many "
    "the kernel issues (FMA: none for this dtype)."
)


def _rows(rows: list[KernelCheck]) -> list[list[Cell]]:
    out: list[list[Cell]] = []
    previous = ""
    for c in rows:
        if c.shape_label != previous:
            out.append([(c.shape_label, "bold")])
            previous = c.shape_label
        compiled = c.registers is not None
        out.append(
            [
                (c.arch, ""),
                ("-" if c.registers is None else str(c.registers), ""),
                (_spills(c), ""),
                (_shared(c) if compiled else "-", ""),
                ("-" if c.waves is None else str(c.waves), ""),
                _matrix(c),
                ("ok", "green") if c.ok else ("FAILED", "red"),
                (tile(c), ""),
            ]
        )
        for problem in c.problems:
            out.append([*([("", "")] * (len(HEADER) - 1)), (problem, "red")])
    return out


def kernels_table(report: KernelsReport) -> None:
    """Per kernel, a block of rows by shape and GPU arch, every arch name and verdict whole at
    any width (the config wraps under itself), and one legend at the end."""
    console = out()
    wrap = wrapper(console)
    d = report.device
    heading(console, "Environment", environment_line(report.environment))
    heading(
        console,
        "Compiler",
        f"triton {d.triton or '-'}, ahead of time for each GPU (none needed here)",
    )
    groups: dict[tuple[str, str, str], list[KernelCheck]] = {}
    for c in report.checks:
        groups.setdefault((c.op, c.scheme, c.kernel), []).append(c)
    for (op, scheme, kernel), rows in groups.items():
        console.print()
        console.print(f"[bold]{escape(op)} · {escape(scheme)}[/] [dim]({escape(kernel)})[/]")
        grid(console, HEADER, _rows(rows), right=(False, True, True, True, True))
    problems = sum(1 for c in report.checks if not c.ok)
    console.print()
    verdict = "no problems" if not problems else f"{problems} with problems"
    line = wrap(f"{len(report.checks)} compiles: {verdict}. {LEGEND}", "", "")
    line.stylize("green" if not problems else "red", len(f"{len(report.checks)} compiles: "),
                 len(f"{len(report.checks)} compiles: {verdict}"))  # fmt: skip
    console.print(line)
    failures(report.failures, report.worker_log)


# The JSON names of the fields whose names in :class:`KernelCheck` leave out a unit.
_JSON_NAMES = {
    "scratch": "scratch_bytes",
    "shared": "shared_bytes",
    "shared_limit": "shared_limit_bytes",
    "waves": "waves_per_simd",
    "matrix_wanted": "matrix_instruction",
    "matrix": "matrix_count",
}


def check_json(c: KernelCheck) -> dict[str, Any]:
    fields = dataclasses.asdict(c)
    config = {**fields.pop("constexprs"), **fields.pop("options")}
    return {**{_JSON_NAMES.get(k, k): v for k, v in fields.items()}, "config": config}


def kernels_document(report: KernelsReport) -> dict[str, Any]:
    d = report.device
    return {
        "schema": SCHEMA,
        "rocmfix_version": __version__,
        "python": report.environment.python.executable,
        "triton": d.triton,
        "torch": d.torch,
        "ok": report.ok,
        "checks": [check_json(c) for c in report.checks],
        "failures": list(report.failures),
    }


def kernels_json(report: KernelsReport) -> None:
    document(kernels_document(report))
