"""``apply`` and ``revert``: the diff on stdout, what was done on stderr."""

from __future__ import annotations

import sys
from pathlib import Path, PurePosixPath

from rich.markup import escape

from rocmfix.diffing import unified_diffs
from rocmfix.render.console import err
from rocmfix.results import Action, FileChange, RunResult


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
        # Where the files are, not the interpreter's prefix: a package on PYTHONPATH or in the
        # user site lives outside it.
        where = ", ".join(escape(str(root)) for root in dict.fromkeys(map(_root, result.changes)))
        console.print(f"{count} file(s) changed in {where}.")
    else:
        console.print("Nothing to do.")


def _root(change: FileChange) -> Path:
    """The directory that holds the changed file's package (``rel`` is relative to it)."""
    return change.path.parents[len(PurePosixPath(change.rel).parts) - 1]
