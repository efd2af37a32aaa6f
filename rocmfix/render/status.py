"""``status`` and ``list``: what is installed, patched and needed, and why."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape

from rocmfix import __version__
from rocmfix.checks import EnvWarning, Placement, placements, torch_build
from rocmfix.environment import Environment
from rocmfix.patch import Patch
from rocmfix.render.console import (
    STYLE,
    document,
    environment_line,
    err,
    heading,
    hint,
    labelled,
    out,
    warnings_block,
    wrapper,
)
from rocmfix.results import PatchStatus, StatusReport, Verdict

STATUS_SCHEMA = "rocmfix-status/1"


def _verdict(item: PatchStatus) -> str:
    scheme = f" ({item.scheme})" if item.scheme else ""
    return f"[{STYLE[item.verdict]}]{item.verdict.value}[/]{escape(scheme)}"


# checks.environment_warnings' code for a torch that is not a ROCm build: the one fact a
# newcomer on such a machine needs first, said once, as the lead line.
NOT_ROCM = "torch-not-rocm"


def lead(console: Console, env: Environment, warnings: Sequence[EnvWarning]) -> list[EnvWarning]:
    """The first thing to say on a machine whose torch is not a ROCm build, said in bold; the
    warnings left to show after it."""
    if env.torch is None or not any(w.code == NOT_ROCM for w in warnings):
        return list(warnings)
    line = (
        f"No ROCm torch here (torch {env.torch.version} is a {torch_build(env)} build): the "
        "kernel patches have nothing to fix on this machine; run `rocmfix doctor` on the ROCm "
        "machine"
    )
    console.print(wrapper(console)(line, "", "    "), style="bold")
    return [w for w in warnings if w.code != NOT_ROCM]


def group_label(patches: Sequence[Patch], what: str = "") -> str:
    """What one line about several patches names: one by its id, more by their count per
    distribution (``what``, a verdict say, follows the id or the count)."""
    if len(patches) == 1:
        return f"{patches[0].id}{what}"
    counts = Counter(p.distribution for p in patches)
    each = ", ".join(f"{name} {n}" for name, n in counts.items())
    return f"{len(patches)} patches{what} ({each})"


def status_table(report: StatusReport, *, verbose: bool = False) -> None:
    """What needs doing first, each patch with its reason and notes; then what does not,
    one line per reason (``verbose``: every patch in its distribution's block). In a terminal
    the text wraps at its width, never inside a word; piped, every reason stays one line."""
    console = out()
    wrap = wrapper(console)
    heading(console, "Environment", environment_line(report.environment))
    warnings = lead(console, report.environment, report.warnings)
    verdicts_block(console, report, verbose=verbose)
    runs_block(console, report)
    warnings_block(console, warnings)
    if report.state_problem:
        console.print(wrap(f"rocmfix's state: {report.state_problem}", "", "    "), style="red")
    if report.hint:
        hint(report.hint)


def _placements(report: StatusReport) -> tuple[Placement, ...]:
    applied = [i.patch.id for i in report.patches if i.verdict is Verdict.APPLIED]
    return placements(report.environment, applied)


def runs_block(console: Console, report: StatusReport) -> None:
    """Where each of MinerU's models runs here, and what would move it (issue 42)."""
    found, mineru = _placements(report), report.environment.mineru
    if not found or mineru is None:
        return
    wrap = wrapper(console)
    console.print(f"[bold]Where MinerU {escape(mineru.version)} runs[/]")
    for item in found:
        todo = f"; {item.todo}" if item.todo else ""
        console.print(wrap(f"{item.models}: {item.where}{todo}", "  ", "    "))


def _absent(item: PatchStatus) -> bool:
    """A patch of a distribution that is simply not there (not one uninstalled over a patch)."""
    return item.verdict is Verdict.NOT_INSTALLED and item.path is None and not item.notes


def verdicts_block(console: Console, report: StatusReport, *, verbose: bool = False) -> None:
    """What needs doing in full, then the rest one line per reason (doctor shows it too);
    ``verbose``: every patch in full, by distribution."""
    full = [i for i in report.patches if not (i.verdict.settled and (_absent(i) or not verbose))]
    if verbose:
        order = list(dict.fromkeys(i.patch.distribution for i in full))
        full.sort(key=lambda i: order.index(i.patch.distribution))
    _full_block(console, report, full, every_note=verbose)
    _settled_block(console, report, grouped=not verbose)


def _full_block(
    console: Console, report: StatusReport, items: Sequence[PatchStatus], *, every_note: bool
) -> None:
    """Each patch with its verdict, reason and notes; unsettled, it is what ``apply`` (or a
    person) has to do. That MinerU runs it is said on the patch's line; ``every_note``
    (``--verbose``) also says how rocmfix knows."""
    wrap = wrapper(console)
    mineru = report.environment.mineru
    runs = f"mineru {mineru.version} runs it" if mineru is not None else None
    width = max((len(i.patch.id) for i in items), default=0) + 2
    for item in items:
        where = f"{item.patch.distribution} {item.version or ''}".rstrip()
        notes = [n for n in item.notes if every_note or runs is None or not n.startswith(runs)]
        if len(notes) < len(item.notes) and mineru is not None:
            where += f" · MinerU {mineru.version} runs it"
        console.print(
            f"[bold]{escape(item.patch.id):<{width}}[/]{_verdict(item)}  [dim]{escape(where)}[/]"
        )
        console.print(wrap(item.reason, "    ", "    "))
        if len(notes) > 1 and not every_note:
            # A stack's general notes (vllm's run modes, say) would push the next patch off
            # the screen; one line says they are there.
            console.print(f"    [dim]{len(notes)} notes: rocmfix status --verbose[/]")
            continue
        for note in notes:
            console.print(wrap(f"note: {note}", "    ", "      "))


def _settled_key(item: PatchStatus) -> tuple[Any, ...]:
    if item.verdict is Verdict.NOT_NEEDED and item.path is None:
        # Files a release does not have read alike, whatever each patch calls its file.
        return (item.verdict, item.scheme, item.patch.distribution, item.version)
    return (item.verdict, item.scheme, item.reason)


def _settled_block(console: Console, report: StatusReport, *, grouped: bool) -> None:
    """What needs nothing: one line per reason (``grouped``; notes left to ``--verbose``),
    and the distributions that are not installed on one line."""
    wrap = wrapper(console)
    settled = [i for i in report.patches if i.verdict.settled]
    absent: dict[str, int] = {}
    groups: dict[tuple[Any, ...], list[PatchStatus]] = {}
    for item in settled:
        if _absent(item):
            absent[item.patch.distribution] = absent.get(item.patch.distribution, 0) + 1
        elif grouped:
            groups.setdefault(_settled_key(item), []).append(item)
    if groups:
        many = any(len(g) > 1 for g in groups.values())
        more = " (--verbose: each patch)" if many else ""
        console.print(f"[bold]Nothing to do[/]{more}")
    for group in groups.values():
        first = group[0]
        reason = first.reason
        # Files a release lacks, each reason naming its own: one line names what they share.
        missing = first.verdict is Verdict.NOT_NEEDED and first.path is None
        if missing and len({item.reason for item in group}) > 1:
            reason = f"{first.patch.distribution} {first.version} has none of these files"
        label = group_label([i.patch for i in group], f" {first.verdict.value}")
        console.print(wrap(f"{label}: {reason}", "  ", "    "))
    if absent:
        names = ", ".join(
            f"{name} ({n} patch{'es' if n > 1 else ''})" for name, n in absent.items()
        )
        console.print(wrap(f"not installed: {names}", "", "    "), style="dim")


def check_failures(report: StatusReport) -> None:
    """Why ``status --check`` exits 1: the patches left to do, and a tampered state."""
    console = err()
    for item in report.patches:
        if not item.verdict.settled:
            console.print(labelled(console, "check:", f"{item.patch.id} is {item.verdict.value}"))
    if report.state_problem:
        console.print(labelled(console, "check:", f"rocmfix's state: {report.state_problem}"))


def next_step(report: StatusReport) -> None:
    """The one command to run next, on stderr (wrapped between words in a terminal)."""
    verdicts = {item.verdict for item in report.patches}
    python = (
        "" if report.environment.in_process else f" --python {report.environment.python.executable}"
    )
    ready = [i.patch.id for i in report.patches if i.verdict in (Verdict.APPLICABLE, Verdict.STALE)]
    if Verdict.INTERRUPTED in verdicts:
        step = f"rocmfix revert{python} (or rocmfix apply{python}) finishes the interrupted run"
    elif ready and verdicts & {Verdict.CHANGED, Verdict.UNSUPPORTED}:
        # apply refuses the whole run for one file it may not touch: name the others.
        only = " ".join(f"--only {patch_id}" for patch_id in ready)
        step = (
            f"rocmfix apply --dry-run{python} {only} (a file above would refuse the whole "
            "run), then the same without --dry-run"
        )
    elif ready:
        step = f"rocmfix apply --dry-run{python}, then the same without --dry-run"
    elif Verdict.CHANGED in verdicts:
        step = (
            "someone else edited a file above: reinstall its package to get it back, or "
            f"rocmfix apply --force{python} to patch it anyway"
        )
    elif Verdict.UNSUPPORTED in verdicts:
        step = "read the reasons above; rocmfix leaves code it does not recognise alone"
    elif verdicts <= {Verdict.NOT_INSTALLED}:
        if report.hint:
            return  # the hint above already says where to point rocmfix
        step = "rocmfix status --python PATH (point it at the environment that runs MinerU)"
    elif Verdict.UNMEASURED in verdicts:
        step = f"rocmfix doctor{python} on the GPU (it measures the unmeasured patches above)"
    elif Verdict.APPLIED in verdicts:
        step = f"nothing to do; rocmfix revert{python} undoes the patches"
    else:
        step = "nothing to do"
    console = err()
    line = wrapper(console)(f"next: {step}", "", "    ")
    line.stylize("bold", 0, 5)
    console.print(line)


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


def warning_json(w: EnvWarning) -> dict[str, Any]:
    doc: dict[str, Any] = {"code": w.code, "message": w.message, "advice": w.advice}
    if w.confirmed is not None:
        # A trap status found, as its confirmation in the target interpreter showed it.
        doc["doctor"] = {"state": w.confirmed[0], "evidence": w.confirmed[1]}
    return doc


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
            "mineru": env.mineru.version if env.mineru is not None else None,
            "onnxruntime": None
            if env.system.onnxruntime is None
            else {
                "owner": env.system.onnxruntime.package,
                "version": env.system.onnxruntime.version,
                "claimants": list(env.system.onnxruntime.claimants),
            },
        },
        "busy": report.busy,
        "pending": None
        if pending is None
        else {"op": pending.op, "pid": pending.pid, "started_at": pending.started_at},
        "patches": [_patch_json(item) for item in report.patches],
        "warnings": [warning_json(w) for w in report.warnings],
        "summary": {
            "verdicts": dict(sorted(counts.items())),
            "settled": report.settled,
        },
        "hint": report.hint,
        "state_problem": report.state_problem,
        "runs": [
            {"models": p.models, "where": p.where, "todo": p.todo} for p in _placements(report)
        ],
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
        document({"schema": "rocmfix-list/1", "patches": doc})
        return
    console = out()
    wrap = wrapper(console)
    # A wrapped entry hangs two columns in from its first line, so the next entry (a known
    # shape, a scheme) still starts where the eye expects one.
    rest = " " * (2 + 9 + 2)
    for patch in patches:
        console.print(wrap(f"{patch.id}  {patch.summary}", "", "    ", bold=len(patch.id)))
        console.print(wrap(f"{patch.distribution}: {patch.path}", "  file     ", rest))
        for index, known in enumerate(patch.known):
            console.print(wrap(known, f"  {'knows' if index == 0 else '':<8} ", rest))
        for index, scheme in enumerate(patch.schemes):
            default = " (default)" if index == 0 else ""
            label = "schemes" if index == 0 else ""
            line = f"{scheme.name}{default}: {scheme.summary}"
            console.print(wrap(line, f"  {label:<8} ", rest))
        if not patch.schemes:
            console.print("  schemes  - (one fixed rewrite)")
        console.print()


def status_json(report: StatusReport) -> None:
    document(status_document(report))
