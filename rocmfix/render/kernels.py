"""``kernels``: what the compiler made of every shipped kernel, per GPU arch."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

from rich.markup import escape
from rich.table import Table

from rocmfix import __version__, kernels
from rocmfix.render.console import config_text, environment_line, failures, out


def tile(check: kernels.KernelCheck) -> str:
    return launch_text({**check.constexprs, **check.options})


def launch_text(config: Mapping[str, Any]) -> str:
    """A compiled launch's config (its constexprs and options) in a few words; the docs'
    kernel table (bench/kernels_table.py) writes the same words."""
    if "BLOCK_M" in config:
        return config_text(config)
    words = [f"{k}={v}" for k, v in config.items() if k.startswith("BLOCK")]
    return " ".join([*words, f"w{config.get('num_warps', '?')}"]) if config else "-"


def _shared(check: kernels.KernelCheck) -> str:
    return f"{check.shared / 1024:.0f}/{check.shared_limit // 1024} KiB"


def _matrix(check: kernels.KernelCheck) -> str:
    if not check.matrix_wanted:
        return "[dim]FMA[/]" if check.operands else "[dim]-[/]"
    return f"{check.matrix_wanted} x{check.matrix}" if check.matrix else "[red]missing[/]"


def _spills(check: kernels.KernelCheck) -> str:
    if check.registers is None:
        return "-"
    return str(check.spills) + (f" ({check.sgpr_spills} sgpr)" if check.sgpr_spills else "")


def kernels_table(report: kernels.KernelsReport) -> None:
    console = out()
    d = report.device
    console.print(f"[bold]Environment[/] {escape(environment_line(report.environment))}")
    console.print(
        f"[bold]Compiler[/]    triton {escape(d.triton or '-')}, ahead of time for each GPU "
        "(none needed here)"
    )
    groups: dict[tuple[str, str, str], list[kernels.KernelCheck]] = {}
    for c in report.checks:
        groups.setdefault((c.op, c.scheme, c.kernel), []).append(c)
    for (op, scheme, kernel), rows in groups.items():
        console.print()
        console.print(f"[bold]{escape(op)} · {escape(scheme)}[/] [dim]({escape(kernel)})[/]")
        table = Table(show_edge=False, pad_edge=False)
        for name in ("shape", "arch", "config", "regs", "spills", "LDS", "waves", "matrix",
                     "check"):  # fmt: skip
            numeric = name in ("regs", "spills", "LDS", "waves")
            table.add_column(name, no_wrap=name != "check", overflow="fold", min_width=5,
                             justify="right" if numeric else "left")  # fmt: skip
        previous = ""
        for c in rows:
            if previous and c.shape_label != previous:
                table.add_section()
            table.add_row(
                escape(c.shape_label) if c.shape_label != previous else "",
                c.arch,
                escape(tile(c)),
                "-" if c.registers is None else str(c.registers),
                _spills(c),
                _shared(c) if c.registers is not None else "-",
                "-" if c.waves is None else str(c.waves),
                _matrix(c),
                "[green]ok[/]" if c.ok else "[red]" + escape("; ".join(c.problems)) + "[/]",
            )
            previous = c.shape_label
        console.print(table)
    problems = sum(1 for c in report.checks if not c.ok)
    console.print()
    console.print(
        f"{len(report.checks)} compiles: "
        + ("[green]no problems[/]" if not problems else f"[red]{problems} with problems[/]")
        + ". regs: VGPRs (AMD) or registers (NVIDIA) per lane; waves: per SIMD, as registers "
        "allow."
    )
    failures(report.failures, report.worker_log)


def check_json(c: kernels.KernelCheck) -> dict[str, Any]:
    return {
        "op": c.op,
        "scheme": c.scheme,
        "kernel": c.kernel,
        "shape": c.shape,
        "shape_label": c.shape_label,
        "dtype": c.dtype,
        "arch": c.arch,
        "ok": c.ok,
        "registers": c.registers,
        "spills": c.spills,
        "sgpr_spills": c.sgpr_spills,
        "scratch_bytes": c.scratch,
        "shared_bytes": c.shared,
        "shared_limit_bytes": c.shared_limit,
        "waves_per_simd": c.waves,
        "operands": c.operands,
        "matrix_instruction": c.matrix_wanted,
        "matrix_count": c.matrix,
        "config": {**c.constexprs, **c.options},
        "problems": list(c.problems),
    }


def kernels_document(report: kernels.KernelsReport) -> dict[str, Any]:
    d = report.device
    return {
        "schema": kernels.SCHEMA,
        "rocmfix_version": __version__,
        "python": report.environment.python.executable,
        "triton": d.triton,
        "torch": d.torch,
        "ok": report.ok,
        "checks": [check_json(c) for c in report.checks],
        "failures": list(report.failures),
    }


def kernels_json(report: kernels.KernelsReport) -> None:
    sys.stdout.write(json.dumps(kernels_document(report), indent=2) + "\n")
