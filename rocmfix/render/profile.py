"""``profile``: the report on stderr (the command's own stdout stays the command's), 80 columns;
``--json`` on stdout after the command has ended, and in ``--out``."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any, TextIO

from rocmfix import __version__
from rocmfix.profile.model import FLAG_SHARE, SCHEMA, OpStat, ProfileReport
from rocmfix.render.console import err, wrapper

WIDTH = 80
BAR = 10


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 1000:
        return f"{value / 1e3:.2f}s"
    if value >= 1:
        return f"{value:.2f}ms"
    return f"{value * 1e3:.0f}us"


def _shape(row: OpStat) -> str:
    parts = ["x".join(str(v) for v in row.shapes[0])] if row.shapes and row.shapes[0] else []
    if row.conv and len(row.shapes) > 1:
        k = "x".join(str(v) for v in row.shapes[1][2:])
        parts.append(f"k{k}")
        for name, tag, neutral in (("stride", "s", 1), ("dilation", "d", 1), ("groups", "g", 1)):
            value = row.conv[name]
            values = value if isinstance(value, list) else [value]
            if any(v != neutral for v in values):
                parts.append(tag + "x".join(str(v) for v in dict.fromkeys(values)))
    if row.dtypes:
        parts.append(
            {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(
                row.dtypes[0], row.dtypes[0]
            )
        )
    if row.layout == "channels-last":
        parts.append("NHWC")
    return " ".join(parts)


def _verdict(row: OpStat) -> str:
    if row.fix is not None and row.fix.kind == "patched":
        return "patched"
    if row.flagged:
        return "SLOW: " + (row.reason or "")
    if row.speedup is not None:
        return f"ok (best alt {row.speedup:.1f}x)"
    return "ok" if row.share >= FLAG_SHARE and row.forms else "-"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def summary(report: ProfileReport) -> str:
    kind = "device" if report.device == "cuda" else "CPU"
    hot = [r for r in report.ops if r.share >= FLAG_SHARE] or list(report.ops[:1])
    share = sum(r.share for r in hot)
    fixes = [r.fix for r in report.flagged if r.fix is not None and r.fix.kind != "none"]
    line = f"{len(hot)} op{'s' if len(hot) != 1 else ''} take {share:.0%} of {kind} time; "
    if not report.flagged:
        return line + "none is flagged."
    commands = list(dict.fromkeys(f.command for f in fixes if f.command))
    if not commands:
        return line + f"{len(report.flagged)} flagged, no fix yet (see each repro)."
    fixed = sum(1 for r in report.flagged if r.fix is not None and r.fix.kind != "none")
    verb = "has" if fixed == 1 else "have"
    return line + f"{fixed} {verb} a fix: " + "; ".join(commands)


def profile_table(report: ProfileReport, stream: TextIO | None = None) -> None:
    w = (stream or sys.stderr).write
    if not report.ops:
        # A note, not an error: the command ran; the first note says why nothing was recorded.
        console = err()
        for note in report.notes:
            console.print(wrapper(console)(f"note: {note}", "  ", "      "))
        return
    kind = "device" if report.device == "cuda" else "CPU"
    procs = len(report.processes)
    w("\n" + _clip(f"rocmfix profile · {procs} torch process{'es' if procs != 1 else ''} · "
                   f"{report.device_name or report.device} · {_ms(report.total_ms)} of {kind} time",
                   WIDTH) + "\n")  # fmt: skip
    cal = report.calibration
    if cal is not None:
        rates = ", ".join(
            f"{k.replace('float', 'fp')} {v:.2f}" for k, v in cal.matmul_tflops.items()
        )
        w(
            _clip(f"measured here: matmul TFLOP/s {rates} · copy {cal.copy_gbps:.1f} GB/s", WIDTH)
            + "\n"
        )
    w("\n share             op  call shape                          calls     mean\n")
    for row in report.ops:
        filled = round(row.share * BAR)
        bar = "█" * filled + "░" * (BAR - filled)
        what = _clip(row.op + "  " + _shape(row), 34)
        head = f"{row.share:6.1%} {bar}  {what:<34} {row.calls:>6} {_ms(row.mean_ms):>8}"
        w(head + "\n")
        where = " · ".join(
            x for x in ((row.modules[0] if row.modules else ""), row.source or "") if x
        )
        if where:
            w("        " + _clip(where, WIDTH - 8) + "\n")
        facts = []
        if row.kernels:
            facts.append(row.kernels[0])
        if row.tflops is not None:
            facts.append(f"{row.tflops:.2f} TFLOP/s, {row.gbps or 0:.0f} GB/s")
        if row.roofline is not None:
            facts.append(f"{row.roofline:.0%} of roofline")
        if row.calls > 1:
            facts.append(f"first {_ms(row.first_ms)}, then {_ms(row.steady_ms)}")
        if facts:
            w("        " + _clip(" · ".join(facts), WIDTH - 8) + "\n")
        w("        " + _clip(_verdict(row), WIDTH - 8) + "\n")
        fix = row.fix
        if fix is not None and fix.kind == "patch":
            w(
                "        "
                + _clip(f"fix: {fix.command} ({fix.speedup:.1f}x measured here)", WIDTH - 8)
                + "\n"
            )
        elif fix is not None and fix.kind in ("env", "setting"):
            w("        " + _clip(f"fix: {fix.command}", WIDTH - 8) + "\n")
            if fix.why:
                w("        " + _clip(fix.why, WIDTH - 8) + "\n")
        elif fix is not None and fix.kind == "none" and row.flagged:
            w(
                "        fix: none yet; repro"
                + (" in --out" if report.out_dir else " with --out DIR")
                + "\n"
            )
            if fix.driver:
                w("        " + fix.driver + "\n")
    w("\n" + summary(report) + "\n")
    if report.exit_code:
        w(f"the command exited with {report.exit_code}\n")
    for note in report.notes[:10]:
        w(_clip(f"note: {note}", WIDTH) + "\n")


def as_json(report: ProfileReport) -> dict[str, Any]:
    body = dataclasses.asdict(report)
    body["ops"] = [dict(dataclasses.asdict(r), mean_ms=r.mean_ms) for r in report.ops]
    return {"schema": SCHEMA, "rocmfix": __version__, **body, "summary": summary(report)}


def profile_json(report: ProfileReport, stream: TextIO | None = None) -> None:
    (stream or sys.stdout).write(json.dumps(as_json(report), indent=2) + "\n")


def write_out(report: ProfileReport, folder: Any) -> None:
    """profile.json and one repro snippet per flagged op without a fix, in ``--out``."""
    import io
    from pathlib import Path

    from rocmfix import fsops
    from rocmfix.profile import out_folder

    # Checked again and written beside, then renamed: nothing written through a link.
    base = out_folder(Path(folder))
    text = io.StringIO()
    profile_json(report, text)
    fsops.atomic_write(base / "profile.json", text.getvalue().encode("utf-8"))
    for n, row in enumerate(report.ops):
        if row.fix is not None and row.fix.kind == "none" and row.fix.repro:
            repro = row.fix.repro.encode("utf-8")
            fsops.atomic_write(base / f"repro-{n + 1}-{row.op}.py", repro)
