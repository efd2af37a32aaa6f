"""``apply`` and ``revert``: the diff on stdout, what was done on stderr."""

from __future__ import annotations

import sys
from pathlib import Path, PurePosixPath

from rich.markup import escape

from rocmfix.diffing import unified_diffs
from rocmfix.render.console import err, labelled, wrapper
from rocmfix.render.status import group_label, lead
from rocmfix.results import Action, FileChange, Outcome, RunResult


def diff(result: RunResult) -> None:
    sys.stdout.flush()
    sys.stdout.buffer.write(unified_diffs(result.changes))
    sys.stdout.buffer.flush()


def run_summary(result: RunResult) -> None:
    """What the run did (or would do) first, then what it left alone, grouped by reason;
    in a terminal the lines wrap at its width, never inside a word."""
    console = err()
    wrap = wrapper(console)
    # What the environment lacks, once and first, on apply's one line each (status says it
    # in full); a revert puts bytes back whatever the environment holds, and says none of it.
    warnings = result.warnings if result.command != "revert" else ()
    for warning in lead(console, result.environment, warnings):
        console.print(labelled(console, "warning", f"{warning.code}: {warning.message}", "yellow"))
    for note in result.recovered:
        console.print(labelled(console, "recovered:", note, "yellow"))
    if result.command == "revert" and result.applied:
        named = [o.patch.id for o in result.outcomes]
        which = (
            f"{', '.join(named)} {'is' if len(named) == 1 else 'are'}"
            if len(named) <= 3
            else f"none of the {len(named)} selected patches is"
        )
        env = result.environment
        python = "" if env.in_process else f" --python {env.python.executable}"
        only = f" --only {result.applied[0]}" if len(result.applied) == 1 else ""
        message = (
            f"Nothing to revert: {which} not applied here; rocmfix has applied "
            f"{', '.join(result.applied)} (rocmfix revert{only}{python} reverts "
            f"{'it' if only else 'them'})"
        )
        console.print(wrap(message, "", "    "))
        return
    if result.command == "revert" and not result.outcomes:
        console.print("Nothing to revert: rocmfix has not patched this environment.")
        return
    verb = {True: "would be", False: ""}[result.dry_run]
    absent = dict.fromkeys(
        o.patch.distribution for o in result.outcomes if o.action is Action.ABSENT
    )
    if absent:
        console.print(f"[dim]not installed here: {', '.join(absent)}[/]")
    # What the run does first, then what it leaves: one line per reason.
    left: dict[tuple[Action, str | None, str], list[Outcome]] = {}
    for outcome in result.outcomes:
        if outcome.action is Action.ABSENT:
            continue
        scheme = f" ({outcome.scheme})" if outcome.scheme else ""
        if outcome.action in (Action.SKIP, Action.UNCHANGED):
            reason = _absent_file(result, outcome) or outcome.reason
            left.setdefault((outcome.action, outcome.scheme, reason), []).append(outcome)
        else:
            label = f"{verb} {outcome.action.value}".strip()
            forced = f"; --force overrode: {'; '.join(outcome.forced)}" if outcome.forced else ""
            line = wrap(f"{outcome.patch.id}: {label}{scheme}{forced}", "", "    ")
            line.stylize("green", 0, len(outcome.patch.id))
            console.print(line)
    for (action, scheme_name, reason), group in left.items():
        scheme = f" ({scheme_name})" if scheme_name else ""
        if len({o.reason for o in group}) == 1:
            reason = group[0].reason  # one missing folder, say: that is the better reason
        label = group_label([o.patch for o in group])
        console.print(wrap(f"{label}: {action.value}{scheme}: {reason}", "", "    "), style="dim")
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


def _absent_file(result: RunResult, outcome: Outcome) -> str | None:
    """What a skip for a file the installed release does not have shares with the others
    like it (each names its own model, as status's grouped line does not)."""
    dist = result.environment.distributions.get(outcome.patch.distribution)
    if dist is None or outcome.action is not Action.SKIP:
        return None
    if outcome.reason != outcome.patch.missing_reason.format(version=dist.version):
        return None
    return f"{dist.name} {dist.version} has none of these files"


def _root(change: FileChange) -> Path:
    """The directory that holds the changed file's package (``rel`` is relative to it)."""
    return change.path.parents[len(PurePosixPath(change.rel).parts) - 1]
