"""Everything rocmfix shows. Reports a command was asked for (status, diffs, JSON) go to
stdout; progress, summaries, warnings and errors go to stderr."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import __version__
from .diffing import unified_diffs
from .environment import Environment
from .errors import RocmfixError
from .patch import Patch
from .results import Action, PatchStatus, RunResult, StatusReport, Verdict

STATUS_SCHEMA = "rocmfix-status/1"

_STYLE = {
    Verdict.APPLIED: "green",
    Verdict.NOT_NEEDED: "dim",
    Verdict.NOT_INSTALLED: "dim",
    Verdict.APPLICABLE: "yellow",
    Verdict.STALE: "yellow",
    Verdict.CHANGED: "red",
    Verdict.UNSUPPORTED: "red",
    Verdict.INTERRUPTED: "red",
}


def _out() -> Console:
    console = Console(soft_wrap=False)
    if not console.is_terminal:
        # Piped output is read by people in logs and CI, not by an 80-column tty.
        console.width = max(console.width, 140)
    return console


def _err() -> Console:
    return Console(stderr=True, soft_wrap=True)


def _environment_line(env: Environment) -> str:
    parts = [f"{env.python.executable} (Python {env.python.version})"]
    if env.torch is not None:
        backend = (
            f"ROCm {env.torch.hip}"
            if env.torch.hip
            else f"CUDA {env.torch.cuda}"
            if env.torch.cuda
            else "CPU"
        )
        parts.append(f"torch {env.torch.version} ({backend})")
    else:
        parts.append("no torch")
    return " · ".join(parts)


def status_table(report: StatusReport) -> None:
    console = _out()
    console.print(f"[bold]Environment[/] {escape(_environment_line(report.environment))}")
    table = Table(show_edge=False, pad_edge=False, expand=False)
    table.add_column("patch", no_wrap=True)
    table.add_column("package", no_wrap=True)
    table.add_column("version")
    table.add_column("verdict", no_wrap=True)
    table.add_column("scheme", no_wrap=True)
    table.add_column("reason", overflow="fold", ratio=1)
    for item in report.patches:
        table.add_row(
            item.patch.id,
            item.patch.distribution,
            item.version or "-",
            f"[{_STYLE[item.verdict]}]{item.verdict.value}[/]",
            item.scheme or "-",
            escape(item.reason),
        )
    console.print(table)
    for item in report.patches:
        for note in item.notes:
            console.print(f"  {item.patch.id}: {escape(note)}")
    if report.warnings:
        console.print("[bold yellow]Warnings[/]")
        for warning in report.warnings:
            console.print(f"  [yellow]{warning.code}[/]: {escape(warning.message)}")
            console.print(f"    {escape(warning.advice)}", style="dim")
    if report.hint:
        _err().print(f"hint: {escape(report.hint)}")


def next_step(report: StatusReport) -> None:
    verdicts = {item.verdict for item in report.patches}
    python = (
        "" if report.environment.in_process else f" --python {report.environment.python.executable}"
    )
    if Verdict.INTERRUPTED in verdicts:
        step = f"rocmfix revert{python}   (or rocmfix apply{python}) finishes the interrupted run"
    elif verdicts & {Verdict.APPLICABLE, Verdict.STALE}:
        step = f"rocmfix apply --dry-run{python}   then   rocmfix apply{python}"
    elif verdicts & {Verdict.CHANGED, Verdict.UNSUPPORTED}:
        step = "read the reasons above; rocmfix leaves files it does not recognise alone"
    elif verdicts <= {Verdict.NOT_INSTALLED}:
        step = "rocmfix status --python PATH   (point it at the environment that runs MinerU)"
    else:
        step = f"nothing to do; rocmfix revert{python} undoes the patches"
    _err().print(f"[bold]next:[/] {escape(step)}", highlight=False)


def _patch_json(item: PatchStatus) -> dict[str, Any]:
    return {
        "id": item.patch.id,
        "summary": item.patch.summary,
        "distribution": item.patch.distribution,
        "version": item.version,
        "file": item.patch.path,
        "path": str(item.path) if item.path else None,
        "verdict": item.verdict.value,
        "reason": item.reason,
        "scheme": item.scheme,
        "schemes": list(item.patch.scheme_names),
        "editable": item.editable,
        "pristine": item.pristine.name.lower() if item.pristine else None,
        "notes": list(item.notes),
    }


def status_document(report: StatusReport) -> dict[str, Any]:
    env = report.environment
    counts = Counter(item.verdict.value for item in report.patches)
    pending = report.pending
    return {
        "schema": STATUS_SCHEMA,
        "rocmfix_version": __version__,
        "environment": {
            "python": env.python.executable,
            "python_version": env.python.version,
            "prefix": str(env.python.prefix),
            "purelib": str(env.python.purelib) if env.python.purelib else None,
            "torch": None
            if env.torch is None
            else {"version": env.torch.version, "hip": env.torch.hip, "cuda": env.torch.cuda},
        },
        "busy": report.busy,
        "pending": None
        if pending is None
        else {"op": pending.op, "pid": pending.pid, "started_at": pending.started_at},
        "patches": [_patch_json(item) for item in report.patches],
        "warnings": [
            {"code": w.code, "message": w.message, "advice": w.advice} for w in report.warnings
        ],
        "summary": {
            "verdicts": dict(sorted(counts.items())),
            "settled": all(item.verdict.settled for item in report.patches),
        },
        "hint": report.hint,
    }


def patch_list(patches: Sequence[Patch], *, as_json: bool) -> None:
    if as_json:
        doc = [
            {
                "id": p.id,
                "summary": p.summary,
                "distribution": p.distribution,
                "file": p.path,
                "known": list(p.known),
                "schemes": [{"name": s.name, "summary": s.summary} for s in p.schemes],
                "needs_rocm": p.needs_rocm,
            }
            for p in patches
        ]
        sys.stdout.write(json.dumps({"schema": "rocmfix-list/1", "patches": doc}, indent=2) + "\n")
        return
    console = _out()
    for patch in patches:
        console.print(f"[bold]{patch.id}[/]  {escape(patch.summary)}")
        console.print(f"  file     {patch.distribution}: {patch.path}")
        for index, known in enumerate(patch.known):
            console.print(f"  {'knows' if index == 0 else '':<8} {escape(known)}")
        for index, scheme in enumerate(patch.schemes):
            default = " (default)" if index == 0 else ""
            label = "schemes" if index == 0 else ""
            console.print(f"  {label:<8} {scheme.name}{default}: {escape(scheme.summary)}")
        if not patch.schemes:
            console.print("  schemes  - (one fixed rewrite)")
        console.print()


def text(value: str) -> None:
    sys.stdout.write(value)


def status_json(report: StatusReport) -> None:
    sys.stdout.write(json.dumps(status_document(report), indent=2) + "\n")


def diff(result: RunResult) -> None:
    sys.stdout.flush()
    sys.stdout.buffer.write(unified_diffs(result.changes))
    sys.stdout.buffer.flush()


def run_summary(result: RunResult) -> None:
    console = _err()
    for warning in result.warnings:
        console.print(f"[yellow]warning[/] {warning.code}: {escape(warning.message)}")
    for note in result.recovered:
        console.print(f"[yellow]recovered[/] {escape(note)}")
    if result.command == "revert" and not result.outcomes:
        console.print("Nothing to revert: rocmfix has not patched this environment.")
        return
    verb = {True: "would be", False: ""}[result.dry_run]
    absent = [o.patch.id for o in result.outcomes if o.action is Action.ABSENT]
    if absent:
        console.print(f"[dim]not installed here: {', '.join(absent)}[/]")
    for outcome in result.outcomes:
        if outcome.action is Action.ABSENT:
            continue
        scheme = f" ({outcome.scheme})" if outcome.scheme else ""
        if outcome.action in (Action.SKIP, Action.UNCHANGED):
            console.print(
                f"[dim]{outcome.patch.id}: {outcome.action.value}{scheme}: "
                f"{escape(outcome.reason)}[/]"
            )
        else:
            label = f"{verb} {outcome.action.value}".strip()
            console.print(f"[green]{outcome.patch.id}[/]: {label}{scheme}")
    count = len(result.changes)
    if result.dry_run:
        console.print(f"{count} file(s) would change; nothing was written.")
    elif count:
        console.print(
            f"{count} file(s) changed in {escape(str(result.environment.python.prefix))}."
        )
    else:
        console.print("Nothing to do.")


def error(exc: RocmfixError) -> None:
    console = _err()
    console.print(f"[red]error:[/] {escape(exc.message)}", highlight=False)
    if exc.hint:
        console.print(f"hint: {escape(exc.hint)}", highlight=False)


def internal_error(exc: BaseException, log: str | None) -> None:
    where = f"; the traceback is in {log}" if log else ""
    _err().print(
        f"[red]internal error:[/] {escape(type(exc).__name__)}: {escape(str(exc))}{escape(where)}",
        highlight=False,
    )
    _err().print("This is a bug in rocmfix; please report it with that file.", highlight=False)
