"""``profile``: the report on stderr (the command's own stdout stays the command's), laid out
for the terminal's width and never cut;
``--json`` on stdout after the command has ended, and in ``--out``."""

from __future__ import annotations

import dataclasses
import re
import sys
from typing import Any, TextIO

from rocmfix import __version__
from rocmfix.errors import printable
from rocmfix.ops.base import DTYPES
from rocmfix.profile.model import FLAG_SHARE, SCHEMA, OpStat, ProfileReport
from rocmfix.render.console import document, err, wrapper

BAR = 10
SHAPE = 34  # the op and call shape column
INDENT = " " * 8
HANG = " " * 10


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 1000:
        return f"{value / 1e3:.2f}s"
    if value >= 1:
        return f"{value:.2f}ms"
    return f"{value * 1e3:.0f}us"


def _rate(per_s: float, unit: str) -> str:
    """A rate with the prefix that shows its digits: 41.2 GFLOP/s, not 0.04 TFLOP/s."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if per_s >= scale:
            return f"{per_s / scale:.3g} {prefix}{unit}"
    return f"{per_s:.3g} {unit}"


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
        parts.append(DTYPES.get(row.dtypes[0], row.dtypes[0]))
    if row.layout == "channels-last":
        parts.append("NHWC")
    return " ".join(parts)


def _verdict(row: OpStat) -> str:
    if row.fix is not None and row.fix.kind == "patched":
        return "patched"
    if row.flagged:
        return "SLOW: " + (row.reason or "")
    if row.replay_note:
        return "no verdict: " + row.replay_note
    if row.speedup is not None:
        return f"ok (best alt {row.speedup:.1f}x)"
    return "ok" if row.share >= FLAG_SHARE and row.forms else "-"


def _pieces(word: str, room: int) -> list[str]:
    """A word wider than the room (a long path) in pieces that each end at a ``/``, so the
    terminal never cuts it where it likes; a piece still too wide is cut at the room."""
    pieces: list[str] = []
    for part in re.split("(?<=/)", word):
        if pieces and len(pieces[-1]) + len(part) <= room:
            pieces[-1] += part
        else:
            pieces += [part[i : i + room] for i in range(0, len(part), room)] or [""]
    return [p for p in pieces if p]


def _wrap(text: str, width: int | None, first: str, rest: str) -> list[str]:
    """``text`` after :func:`printable`, as lines of at most ``width`` columns broken between
    words (a word too wide, at its ``/``s), each piece whole; piped (no width), one line."""
    text = printable(text)
    if width is None:
        return [first + text]
    lines: list[str] = []
    line, joiner = first, ""
    for word in text.split(" "):
        room = width - len(rest)
        for n, piece in enumerate(_pieces(word, room) if len(word) > room else [word]):
            glue = joiner if n == 0 else ""
            if line.strip() and len(line) + len(glue) + len(piece) > width:
                lines.append(line)
                line, glue = rest, ""
            line += glue + piece
        joiner = " "
    return [text.rstrip() for text in [*lines, line]]


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


def _head(row: OpStat, width: int | None) -> list[str]:
    """The row's first line: share, bar, op and call shape, calls, mean. At a terminal the
    shape wraps under its own column rather than push the numbers past the edge (the op's
    name is the trace's: :func:`_wrap` escapes it)."""
    filled = round(row.share * BAR)
    bar = "█" * filled + "░" * (BAR - filled)
    left = f"{row.share:6.1%} {bar}  "
    numbers = f" {row.calls:>6} {_ms(row.mean_ms):>8}"
    # At a terminal the column takes what the numbers leave (45 at 80 columns); a longer op
    # and shape go on under it. Numbers stay under their headers unless the shape is wider.
    column = None if width is None else max(12, width - len(left) - len(numbers))
    what = _wrap(row.op + "  " + _shape(row), column, "", "")
    return [left + what[0].ljust(SHAPE) + numbers, *(" " * len(left) + w for w in what[1:])]


def _fix_lines(row: OpStat, report: ProfileReport) -> list[str]:
    fix = row.fix
    if fix is None:
        return []
    lines = []
    if fix.kind == "patch":
        lines.append(f"fix: {fix.command} ({fix.speedup or 0:.1f}x measured here)")
    elif fix.kind in ("env", "setting"):
        lines.append(f"fix: {fix.command}")
        if fix.why:
            lines.append(fix.why)
    elif fix.kind == "none" and row.flagged:
        lines.append(
            "fix: none yet; repro" + (" in --out" if report.out_dir else " with --out DIR")
        )
        if fix.driver:
            lines.append(fix.driver)
    if fix.kind == "none" and fix.patch_id and fix.why:
        # A patch routes this op but is not the fix here: say what it does and why not.
        lines.append(f"patch {fix.patch_id}: {fix.why}")
    return lines


def profile_table(report: ProfileReport, stream: TextIO | None = None) -> None:
    """The report, on stderr: at a terminal every line fits its width (wrapped between words,
    never cut); piped, one line per item, nothing wrapped or cut. Every string from the trace,
    the environment or the user's code passes :func:`printable` before it is laid out."""
    if not report.ops:
        # A note, not an error: the command ran; the first note says why nothing was recorded.
        console = err()
        for note in report.notes:
            console.print(wrapper(console)(f"note: {note}", "  ", "      "))
        return
    console = err()
    width = max(console.width, 60) if stream is None and console.is_terminal else None
    out: list[str] = [""]

    def item(text: str, first: str = "", rest: str = "    ") -> None:
        out.extend(_wrap(text, width, first, rest))

    kind = "device" if report.device == "cuda" else "CPU"
    procs = len(report.processes)
    plural = "es" if procs != 1 else ""
    device = report.device_name or report.device
    item(f"rocmfix profile · {procs} torch process{plural} · {device} · "
         f"{_ms(report.total_ms)} of {kind} time")  # fmt: skip
    cal = report.calibration
    if cal is not None:
        rates = ", ".join(
            f"{DTYPES.get(k, k)} {_rate(v * 1e12, 'FLOP/s')}" for k, v in cal.matmul_tflops.items()
        )
        item(f"measured here: matmul {rates} · copy {_rate(cal.copy_gbps * 1e9, 'B/s')}")
    out += ["", " share             op  call shape                          calls     mean"]
    for row in report.ops:
        out.extend(_head(row, width))
        where = " · ".join(x for x in ((row.modules[0] if row.modules else ""), row.source) if x)
        if where:
            item(where, INDENT, HANG)
        facts = []
        if row.kernels:
            facts.append(row.kernels[0])
        if row.tflops is not None:
            rate = _rate(row.tflops * 1e12, "FLOP/s")
            facts.append(f"{rate}, {_rate((row.gbps or 0) * 1e9, 'B/s')}")
        if row.roofline is not None:
            facts.append(f"{row.roofline:.0%} of roofline")
        if row.calls > 1:
            facts.append(f"first {_ms(row.first_ms)}, then {_ms(row.steady_ms)}")
        if facts:
            item(" · ".join(facts), INDENT, HANG)
        item(_verdict(row), INDENT, HANG)
        for line in _fix_lines(row, report):
            item(line, INDENT, HANG)
    out += ["", *_wrap(summary(report), width, "", "    ")]
    if report.exit_code:
        out.append(f"the command exited with {report.exit_code}")
    for note in report.notes[:10]:
        item(f"note: {note}", "", "      ")
    (stream or sys.stderr).write("\n".join(out) + "\n")


def as_json(report: ProfileReport) -> dict[str, Any]:
    body = dataclasses.asdict(report)
    body["ops"] = [dict(dataclasses.asdict(r), mean_ms=r.mean_ms) for r in report.ops]
    return {"schema": SCHEMA, "rocmfix": __version__, **body, "summary": summary(report)}


def profile_json(report: ProfileReport, stream: TextIO | None = None) -> None:
    document(as_json(report), stream)


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
