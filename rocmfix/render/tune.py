"""``tune``: per kernel, the shipped config, the fastest candidate and what is stored."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.markup import escape

from rocmfix import __version__
from rocmfix.guest.protocol import CandidateRow
from rocmfix.render.console import (
    Cell,
    config_text,
    document,
    duration,
    environment_line,
    err,
    failures,
    grid,
    heading,
    out,
)
from rocmfix.results import KernelResult, TuneReport

SCHEMA = "rocmfix-tune/1"
HEADER = ("shipped", "fastest", "gain", "decision", "config")


def _rows(k: KernelResult) -> list[list[Cell]]:
    """A kernel's heading (a row of one cell) and its search: the shipped and the fastest
    time, the decision, and the config the kernels will use; a failed search says why."""
    head: list[Cell] = [(f"{k.id.split(':')[0]} {k.key or '-'} ({k.arch})", "bold")]
    if k.status != "ok":
        return [head, [("-", ""), ("-", ""), ("-", ""), (k.status, "red"), (k.message or "", "")]]
    read_back = {True: " ✓", False: " not read back", None: ""}[k.verified]
    style = "red" if k.verified is False else "green" if k.tuned else ""
    tried = sum(1 for c in k.candidates if c.status not in ("skipped", "rejected"))
    rejected = sum(1 for c in k.candidates if c.status == "rejected")
    counts = f"{tried} tried" + (f", {rejected} rejected: spills or LDS" if rejected else "")
    config = config_text(k.best.config if k.best else None)
    return [
        head,
        [
            (duration(k.shipped.ms if k.shipped else None), ""),
            (duration(k.fastest.ms if k.fastest else None), ""),
            ("-" if k.gain is None else f"{k.gain:.3f}x", ""),
            (f"{'tuned' if k.tuned else 'kept shipped'}{read_back}", style),
            (f"{config} ({counts})", ""),
        ],
    ]


def tune_table(report: TuneReport) -> None:
    console = out()
    heading(console, "Environment", environment_line(report.environment))
    d = report.device
    device = f"{d.name} ({d.arch})" if d.kind == "gpu" else "CPU (Triton interpreter)"
    heading(console, "Device", f"{device} · torch {d.torch} · triton {d.triton or '-'}")
    rows = [row for k in report.kernels for row in _rows(k)]
    grid(console, HEADER, rows, right=(True, True, True))
    if any(k.method == "user" for k in report.kernels):
        console.print(
            "Times: median per call of eager calls through the patched entry point (what "
            "MinerU gets); a candidate replaces the shipped config only when it is "
            f"≥ {report.min_gain:.0%} faster there and its kernel alone (CUDA-graph replay) "
            "is no slower."
        )
    else:
        timing = {"graph": "CUDA-graph replay", "eager": "eager launches", "host": "host clock"}
        methods = sorted({timing.get(k.method or "", "-") for k in report.kernels if k.method})
        console.print(
            f"Times: median time per call ({', '.join(methods) or '-'}); a candidate "
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
    failures(report.failures, report.worker_log)


def _candidate_json(c: CandidateRow | None) -> dict[str, Any] | None:
    if c is None:
        return None
    return {**dataclasses.asdict(c), "compiled": c.compiled or None}


def tune_document(report: TuneReport) -> dict[str, Any]:
    d = report.device
    return {
        "schema": SCHEMA,
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


def tune_json(report: TuneReport) -> None:
    document(tune_document(report))
    failures(report.failures, report.worker_log)


def tune_reset(path: str, removed: bool) -> None:
    if removed:
        err().print(f"Removed {escape(path)}: the kernels use their shipped configs again.")
    else:
        err().print(f"No tuned file at {escape(path)}; nothing to reset.")
