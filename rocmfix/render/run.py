"""``apply`` and ``revert``: the diff on stdout, what was done on stderr."""

from __future__ import annotations

import sys

from rich.markup import escape

from rocmfix.diffing import unified_diffs
from rocmfix.render.console import err
from rocmfix.results import Action, RunResult


def diff(result: RunResult) -> None:
    sys.stdout.flush()
    sys.stdout.buffer.write(unified_diffs(result.changes))
    sys.stdout.buffer.flush()


def run_summary(result: RunResult) -> None:
    console = err()
    for warning in result.warnings:
        console.print(f"[yellow]warning[/] {warning.code}: {escape(warning.message)}")
    for note in result.recovered:
        console.print(f"[yellow]recovered[/] {escape(note)}")
    if result.command == "revert" and not result.outcomes:
        console.print("Nothing to revert: rocmfix has not patched this environment.")
        return
    verb = {True: "would be", False: ""}[result.dry_run]
    absent = dict.fromkeys(
        o.patch.distribution for o in result.outcomes if o.action is Action.ABSENT
    )
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
