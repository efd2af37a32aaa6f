"""Everything rocmfix shows. Reports a command was asked for (status, diffs, JSON) go to
stdout; progress, summaries, warnings and errors go to stderr."""

from __future__ import annotations

import contextlib
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from . import __version__, doctor
from . import tune as tune_mod
from .checks import EnvWarning
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
    _warnings(console, report.warnings)
    if report.hint:
        _err().print(f"hint: {escape(report.hint)}")


def _warnings(console: Console, warnings: Sequence[EnvWarning]) -> None:
    if warnings:
        console.print("[bold yellow]Warnings[/]")
        for warning in warnings:
            console.print(f"  [yellow]{warning.code}[/]: {escape(warning.message)}")
            console.print(f"    {escape(warning.advice)}", style="dim")


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


# ---------------------------------------------------------------------------- doctor, tune


@contextlib.contextmanager
def progress(title: str) -> Iterator[Callable[[int, int, str], None]]:
    """A progress bar on stderr (one plain line per step when stderr is not a terminal)."""
    console = _err()
    if console.is_terminal:
        columns = (
            SpinnerColumn(),
            TextColumn(f"[bold]{escape(title)}[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
        )
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task("starting", total=None)

            def update(done: int, total: int, label: str) -> None:
                bar.update(task, completed=done, total=total or None, description=escape(label))

            yield update
        return
    last = [-1]

    def plain(done: int, total: int, label: str) -> None:
        if done != last[0]:
            last[0] = done
            console.print(f"{title} [{done}/{total}] {escape(label)}", highlight=False)

    yield plain


def _duration(ms: float | None) -> str:
    if ms is None:
        return "-"
    if ms < 1.0:
        return f"{ms * 1e3:.1f} µs"
    if ms < 1000.0:
        return f"{ms:.2f} ms"
    return f"{ms / 1e3:.1f} s"


def _case_label(result: doctor.CaseResult) -> str:
    s = result.shape
    if result.case.op == doctor.PATCH_EMBED:
        k = s["c"] * s["t"] * s["p"] * s["p"]
        return f"{s['m']}x{k}→{s['n']} {_short_dtype(s['dtype'])}"
    return f"{s['c']}ch {s['k']}x{s['k']} d={s['d']} {s['h']}x{s['w']} {_short_dtype(s['dtype'])}"


def _short_dtype(name: str) -> str:
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(name, name)


def _impl_label(report: doctor.DoctorReport, op: str, impl: str) -> str:
    if impl == "native":
        library = (report.device.conv_library or "").split(" ")[0] or report.device.backend
        if report.device.interpreter:
            library = "CPU"
        return f"{doctor.NATIVE[op]} ({library})"
    if impl in doctor.TRITON_SCHEMES:
        also = " = direct" if op == doctor.DILATED_CONV else ""
        return f"{impl} (Triton{also})"
    return "linear (F.linear)" if op == doctor.PATCH_EMBED else "linear (phase split)"


def _check(m: doctor.Measurement) -> str:
    if m.status == "ok":
        if not m.checked:
            return "[dim]reference[/]"
        return "[green]ok[/]"
    if m.status == "failed":
        return f"[red]WRONG[/] (> {m.tolerance:.0e})" if m.tolerance else "[red]WRONG[/]"
    if m.status == "timeout":
        return f"[yellow]no result within {m.limit_s:g} s[/]" if m.limit_s else "[yellow]timeout[/]"
    if m.status == "unavailable":
        return f"[dim]unavailable: {escape(m.message or '')}[/]"
    return f"[red]{m.status}[/]: {escape(m.message or '')}"


def _err_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def _device_line(report: doctor.DoctorReport) -> str:
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


def _packages_line(report: doctor.DoctorReport) -> str:
    versions = report.environment.versions
    names = ("vllm", "mineru", "mineru-vl-utils", "doclayout-yolo", "triton", "pytorch-triton-rocm")
    return " · ".join(f"{n} {versions[n]}" for n in names if n in versions) or "-"


def _tuned_line(report: doctor.DoctorReport) -> str:
    arch = report.device.arch
    if report.device.interpreter:
        return f"{report.tuned_file} (not used without a GPU)"
    if arch in report.tuned_archs:
        return f"{report.tuned_file}: tuned configs for this GPU ({arch})"
    return f"no tuned configs for {arch} in {report.tuned_file}: the shipped ones apply"


def doctor_table(report: doctor.DoctorReport) -> None:
    console = _out()
    console.print(f"[bold]Environment[/] {escape(_environment_line(report.environment))}")
    console.print(f"[bold]Device[/]      {escape(_device_line(report))}")
    console.print(f"[bold]Packages[/]    {escape(_packages_line(report))}")
    console.print(f"[bold]Tuned[/]       {escape(_tuned_line(report))}")
    patches = Table(show_edge=False, pad_edge=False, title=None)
    patches.add_column("patch", no_wrap=True)
    patches.add_column("verdict", no_wrap=True)
    patches.add_column("scheme", no_wrap=True)
    patches.add_column("reason", overflow="fold", ratio=1)
    for item in report.status.patches:
        patches.add_row(
            item.patch.id,
            f"[{_STYLE[item.verdict]}]{item.verdict.value}[/]",
            item.scheme or "-",
            escape(item.reason),
        )
    console.print(patches)
    console.print()
    table = Table(show_edge=False, pad_edge=False)
    for name in ("op", "case", "implementation", "first call", "median", "vs native"):
        table.add_column(name, no_wrap=True, justify="right" if name != "op" else "left")
    table.columns[1].justify = table.columns[2].justify = "left"
    table.add_column("rel err", no_wrap=True, justify="right")
    table.add_column("check", overflow="fold")
    for op in report.ops:
        for index, result in enumerate(op.cases):
            for m in (result.native, *result.schemes):
                ratio = result.speedup(m) if m.checked else None
                table.add_row(
                    doctor.TITLES[op.op].split(" (")[0]
                    if index == 0 and m.impl == "native"
                    else "",
                    _case_label(result) if m.impl == "native" else "",
                    _impl_label(report, op.op, m.impl),
                    _duration(m.first_ms),
                    _duration(m.ms if result.timed else None),
                    "-" if ratio is None else f"{ratio:.1f}x",
                    _err_text(m.rel_err),
                    _check(m),
                )
        table.add_section()
    console.print(table)
    for op in report.ops:
        console.print(f"[bold]{escape(doctor.TITLES[op.op])}[/]")
        if len(op.cases) > 1 and not report.device.interpreter:
            totals = ", ".join(
                f"{_impl_label(report, op.op, impl).split(' (')[0]} {_duration(ms)}"
                for impl, ms in op.totals.items()
            )
            console.print(f"  all {len(op.cases)} shapes: {escape(totals)}")
        console.print(f"  {escape(op.why)}")
        console.print(f"  {escape(op.advice)}")
    _warnings(console, report.warnings)
    _failures(report.failures, report.worker_log)


def _failures(failures: Sequence[str], worker_log: str) -> None:
    """What went wrong in a doctor or tune run, with the end of the worker's own output."""
    if not failures:
        return
    console = _err()
    for line in failures:
        console.print(f"[red]failed[/] {escape(line)}", highlight=False)
    if worker_log.strip():
        console.print("worker output (last lines):", style="dim")
        console.print(escape(worker_log.strip()[-1500:]), style="dim", highlight=False)


def _measurement_json(m: doctor.Measurement, result: doctor.CaseResult) -> dict[str, Any]:
    return {
        "impl": m.impl,
        "status": m.status,
        "first_ms": m.first_ms,
        "ms": m.ms,
        "speedup": result.speedup(m) if m.checked else None,
        "rel_err": m.rel_err,
        "tolerance": m.tolerance,
        "config": dict(m.config) if m.config else None,
        "limit_s": m.limit_s,
        "message": m.message,
    }


def doctor_document(report: doctor.DoctorReport) -> dict[str, Any]:
    env = report.environment
    d = report.device
    return {
        "schema": doctor.SCHEMA,
        "rocmfix_version": __version__,
        "environment": status_document(report.status)["environment"],
        "device": {
            "kind": d.kind,
            "backend": d.backend,
            "name": d.name,
            "arch": d.arch,
            "count": d.count,
            "memory_gib": d.memory_gib,
            "torch": d.torch,
            "hip": d.hip,
            "cuda": d.cuda,
            "triton": d.triton,
            "triton_error": d.triton_error,
            "conv_library": d.conv_library,
            "interpreter": d.interpreter,
        },
        "versions": dict(sorted(env.versions.items())),
        "patches": [
            {"id": p.patch.id, "verdict": p.verdict.value, "scheme": p.scheme, "reason": p.reason}
            for p in report.status.patches
        ],
        "time_limit_s": report.time_limit_s,
        "tuned_file": report.tuned_file,
        "tuned_archs": list(report.tuned_archs),
        "ops": [
            {
                "op": op.op,
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
        "warnings": [
            {"code": w.code, "message": w.message, "advice": w.advice} for w in report.warnings
        ],
        "ok": report.ok,
        "failures": list(report.failures),
    }


def doctor_json(report: doctor.DoctorReport) -> None:
    sys.stdout.write(json.dumps(doctor_document(report), indent=2) + "\n")
    _failures(report.failures, report.worker_log)


_FLAGS = ("tma", "persistent", "flatten", "epilogue_subtile", "taps_inner", "nhwc", "w_kmajor")


def _config_text(config: Mapping[str, Any] | None) -> str:
    if not config:
        return "-"
    keys = ("BLOCK_M", "BLOCK_N", "BLOCK_K")
    tile = "x".join(str(config[k]) for k in keys if k in config)
    words = [tile, f"w{config.get('num_warps', '?')}", f"s{config.get('num_stages', '?')}"]
    words += sorted(k for k, v in config.items() if k in _FLAGS and v in (True, 1))
    if config.get("pack_weight") is False:
        words.append("unpacked")
    words += [
        f"{k}={v}"
        for k, v in sorted(config.items())
        if k in ("GROUP_M", "waves_per_eu", "matrix_instr_nonkdim", "kpack", "occupancy")
        and v not in (None, 0, 1, 8)
    ]
    return " ".join(words)


def tune_table(report: tune_mod.TuneReport) -> None:
    console = _out()
    console.print(f"[bold]Environment[/] {escape(_environment_line(report.environment))}")
    d = report.device
    device = f"{d.name} ({d.arch})" if d.kind == "gpu" else "CPU (Triton interpreter)"
    console.print(
        f"[bold]Device[/]      {escape(device)} · torch {escape(d.torch)} · "
        f"triton {escape(d.triton or '-')}"
    )
    table = Table(show_edge=False, pad_edge=False)
    for name in ("kernel", "arch", "key", "shipped", "fastest", "gain", "decision", "config"):
        table.add_column(name, no_wrap=name != "config", overflow="fold")
    for k in report.kernels:
        if k.status != "ok":
            table.add_row(k.id, k.arch, k.key, "-", "-", "-", f"[red]{k.status}[/]",
                          escape(k.message or ""))  # fmt: skip
            continue
        gain = "-" if k.gain is None else f"{k.gain:.3f}x"
        decision = "[green]tuned[/]" if k.tuned else "kept shipped"
        if k.verified is True:
            decision += " ✓"
        elif k.verified is False:
            decision += " [red]not read back[/]"
        tried = sum(1 for c in k.candidates if c.status != "skipped")
        table.add_row(
            k.id.split(":")[0],
            k.arch,
            k.key or "-",
            _duration(k.shipped.ms if k.shipped else None),
            _duration(k.fastest.ms if k.fastest else None),
            gain,
            f"{decision} ({tried} tried)",
            escape(_config_text(k.best.config if k.best else None)),
        )
    console.print(table)
    timing = {"graph": "CUDA-graph replay", "eager": "eager launches", "host": "host clock"}
    methods = sorted({timing.get(k.method or "", "-") for k in report.kernels if k.method})
    console.print(
        f"Times: median kernel time per call ({', '.join(methods) or '-'}); a candidate "
        f"replaces the shipped config only when it is ≥ {report.min_gain:.0%} faster."
    )
    stored = report.stored
    if stored is None:
        console.print(f"Nothing stored; {escape(report.path)} is unchanged.")
    elif stored.written:
        console.print(f"Stored in {escape(str(stored.path))}.")
    elif stored.removed:
        console.print(f"No tuned entries left; removed {escape(str(stored.path))}.")
    else:
        console.print(f"No tuned entries: the shipped configs stay ({escape(report.path)}).")
    if stored is not None and stored.replaced_corrupt:
        console.print(
            f"[yellow]warning[/]: the old file {escape(stored.replaced_corrupt)}; replaced"
        )
    if any(k.verified is not None for k in report.kernels):
        good = all(k.verified is not False for k in report.kernels)
        verdict = "[green]yes[/]" if good else "[red]no[/]"
        console.print(f"A fresh process's kernels resolve these configs: {verdict}")
    _failures(report.failures, report.worker_log)


def _candidate_json(c: tune_mod.Candidate | None) -> dict[str, Any] | None:
    if c is None:
        return None
    return {
        "config": dict(c.config),
        "role": c.role,
        "status": c.status,
        "ms": c.ms,
        "rel_err": c.rel_err,
        "message": c.message,
    }


def tune_document(report: tune_mod.TuneReport) -> dict[str, Any]:
    d = report.device
    return {
        "schema": tune_mod.SCHEMA,
        "rocmfix_version": __version__,
        "python": report.environment.python.executable,
        "device": {
            "kind": d.kind,
            "name": d.name,
            "arch": d.arch,
            "torch": d.torch,
            "triton": d.triton,
        },
        "tuned_file": report.path,
        "stored": None
        if report.stored is None
        else {"written": report.stored.written, "removed": report.stored.removed},
        "min_gain": report.min_gain,
        "budget_s": report.budget_s,
        "kernels": [
            {
                "id": k.id,
                "kernel": k.kernel,
                "arch": k.arch,
                "key": k.key,
                "precision": k.precision,
                "status": k.status,
                "message": k.message,
                "timing": k.method,
                "tuned": k.tuned,
                "gain": k.gain,
                "shipped": _candidate_json(k.shipped),
                "fastest": _candidate_json(k.fastest),
                "chosen": _candidate_json(k.best),
                "verified": k.verified,
                "resolved": dict(k.resolved) if k.resolved else None,
                "candidates": [_candidate_json(c) for c in k.candidates],
            }
            for k in report.kernels
        ],
        "ok": report.ok,
        "failures": list(report.failures),
    }


def tune_json(report: tune_mod.TuneReport) -> None:
    sys.stdout.write(json.dumps(tune_document(report), indent=2) + "\n")
    _failures(report.failures, report.worker_log)


def tune_reset(path: str, removed: bool) -> None:
    if removed:
        _err().print(f"Removed {escape(path)}: the kernels use their shipped configs again.")
    else:
        _err().print(f"No tuned file at {escape(path)}; nothing to reset.")
