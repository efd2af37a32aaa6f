"""What every report shares: the two consoles, verdict colours, the environment line,
warnings, errors and progress. Reports a command was asked for (status, diffs, JSON) go to
stdout; progress, summaries, warnings and errors go to stderr."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TextIO

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
from rich.text import Text

from rocmfix.checks import EnvWarning
from rocmfix.environment import Environment
from rocmfix.errors import RocmfixError, printable
from rocmfix.results import Verdict

STYLE = {
    Verdict.APPLIED: "green",
    Verdict.NOT_NEEDED: "dim",
    Verdict.NOT_INSTALLED: "dim",
    Verdict.APPLICABLE: "yellow",
    Verdict.STALE: "yellow",
    Verdict.CHANGED: "red",
    Verdict.UNSUPPORTED: "red",
    Verdict.INTERRUPTED: "red",
    Verdict.UNMEASURED: "yellow",
}


def closed_pipe() -> None:
    """Whoever read the output has gone (``| head``): say nothing more. Python flushes the
    standard streams again at exit; pointed at /dev/null, that flush cannot fail too."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            os.dup2(devnull, stream.fileno())


def out() -> Console:
    console = Console(soft_wrap=False, highlight=False)
    if not console.is_terminal:
        # Piped output is read by people in logs and CI, not by an 80-column tty: tables get
        # room, and text is never wrapped (each reason stays one greppable line).
        console.width = max(console.width, 140)
        console.soft_wrap = True
    return console


Wrap = Callable[..., Text]


def wrapper(console: Console) -> Wrap:
    """Wrap plain text at the terminal's width, never inside a word (a version, a path);
    piped output is not wrapped at all, so each reason stays one greppable line. The text
    passes :func:`printable` first: what it quotes from a trace, the environment or the
    user's code reaches the terminal as text, never as a control sequence."""
    width = max(console.width, 60) if console.is_terminal else None

    def wrap(text: str, first: str, rest: str, bold: int = 0) -> Text:
        text = printable(text)
        if width:
            # A word too wide for the room the indent leaves (a long path) hangs less, rather
            # than have the terminal cut it in two.
            rest = rest[: max(0, width - max(map(len, text.split()), default=0))]
        lines = (
            textwrap.wrap(
                text,
                width,
                initial_indent=first,
                subsequent_indent=rest,
                break_long_words=False,
                break_on_hyphens=False,
            )
            if width
            else [first + text]
        )
        out = Text("\n".join(lines) or first.rstrip())
        if bold:
            out.stylize("bold", len(first), len(first) + bold)
        return out

    return wrap


def err() -> Console:
    # A terminal gets lines rich wraps between words (the terminal itself would cut a word
    # in two); piped, a line stays whole for grep and for logs pasted into an issue. rich's
    # highlighter would colour every number, path and bracket of the prose on its own.
    console = Console(stderr=True, highlight=False)
    console.soft_wrap = not console.is_terminal
    return console


def environment_line(env: Environment) -> str:
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
    if env.mineru is not None:
        parts.append(f"MinerU {env.mineru.version}")
    return " · ".join(parts)


def heading(console: Console, title: str, text: str) -> None:
    """A report's head line (``Environment ...``): the title in bold, padded to one width so
    the texts line up, the text wrapped under itself."""
    console.print(wrapper(console)(f"{title:<11} {text}", "", "    ", bold=len(title)))


def document(doc: Mapping[str, Any], stream: TextIO | None = None) -> None:
    """A report's JSON document, on stdout unless ``stream``."""
    (stream or sys.stdout).write(json.dumps(doc, indent=2) + "\n")


def warnings_block(console: Console, warnings: Sequence[EnvWarning]) -> None:
    if warnings:
        wrap = wrapper(console)
        console.print("[bold yellow]Warnings[/]")
        for warning in warnings:
            line = wrap(f"{warning.code}: {warning.message}", "  ", "    ")
            line.stylize("yellow", 2, 2 + len(warning.code))
            console.print(line)
            if warning.confirmed is not None:
                state, evidence = warning.confirmed
                console.print(wrap(f"doctor: {state}: {evidence}", "    ", "    ", len(state) + 8))
            console.print(wrap(warning.advice, "    ", "    "), style="dim")


def text(value: str) -> None:
    sys.stdout.write(value)


def labelled(console: Console, label: str, message: str, style: str = "") -> Text:
    """``label message`` as one line (an error, a hint, a warning), the label in ``style``;
    in a terminal a wrapped line hangs four columns in, so the next label stands out."""
    line = wrapper(console)(f"{label} {message}", "", "    ")
    if style:
        line.stylize(style, 0, len(label))
    return line


def waiting(message: str) -> None:
    """One line while a command waits on something slow (git, say): it is not stuck."""
    console = err()
    console.print(labelled(console, "rocmfix:", message))


def warning(message: str) -> None:
    console = err()
    console.print(labelled(console, "warning:", message, "yellow"))


def hint(message: str) -> None:
    console = err()
    console.print(labelled(console, "hint:", message))


def error(exc: RocmfixError) -> None:
    console = err()
    console.print(labelled(console, "error:", exc.message, "red"))
    if exc.hint:
        hint(exc.hint)


def internal_error(exc: BaseException, log: str | None) -> None:
    where = f"; the traceback is in {log}" if log else ""
    console = err()
    message = f"{type(exc).__name__}: {exc}{where}"
    console.print(labelled(console, "internal error:", message, "red"))
    console.print(
        wrapper(console)("This is a bug in rocmfix; please report it with that file.", "", "    ")
    )


@contextlib.contextmanager
def progress(title: str) -> Iterator[Callable[[int, int, str], None]]:
    """A progress bar on stderr (one plain line per step when stderr is not a terminal)."""
    console = err()
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
                label = escape(printable(label))
                bar.update(task, completed=done, total=total or None, description=label)

            yield update
        return
    last = [-1]

    def plain(done: int, total: int, label: str) -> None:
        if done != last[0]:
            last[0] = done
            console.print(f"{title} [{done}/{total}] {escape(printable(label))}")

    yield plain


def failures(failures: Sequence[str], worker_log: str) -> None:
    """What went wrong in a doctor or tune run, with the end of the worker's own output."""
    if not failures:
        return
    console = err()
    for line in failures:
        console.print(labelled(console, "failed", line, "red"))
    if worker_log.strip():
        console.print("worker output (last lines):", style="dim")
        tail = worker_log.strip()[-1500:].splitlines()
        shown = (" " * (len(line) - len(line.lstrip(" "))) + printable(line) for line in tail)
        console.print(Text("\n".join(shown)), style="dim")


def duration(ms: float | None) -> str:
    if ms is None:
        return "-"
    if ms < 1.0:
        return f"{ms * 1e3:.1f} µs"
    if ms < 1000.0:
        return f"{ms:.2f} ms"
    return f"{ms / 1e3:.1f} s"


_FLAGS = ("tma", "persistent", "flatten", "epilogue_subtile", "taps_inner", "nhwc", "w_kmajor")


def config_text(config: Mapping[str, Any] | None) -> str:
    """A tile config, or a compiled launch's (its constexprs and options), in a few words; the
    docs' kernel table (bench/kernels_table.py) writes the same words."""
    if not config:
        return "-"
    warps = f"w{config.get('num_warps', '?')}"
    if "BLOCK_M" in config:
        keys = ("BLOCK_M", "BLOCK_N", "BLOCK_K")
        tile = "x".join(str(config[k]) for k in keys if k in config)
        words = [tile, warps, f"s{config.get('num_stages', '?')}"]
        # A launch names its flags as the kernel's constexprs (PERSISTENT), a config in lower
        # case.
        flags = {k.lower() for k, v in config.items() if k.lower() in _FLAGS and v in (True, 1)}
        words += sorted(flags)
        if config.get("pack_weight") is False:
            words.append("unpacked")
    else:
        # A kernel of other tiles (the depthwise conv's) by their own names.
        words = [
            f"{k}={v}"
            for k, v in config.items()
            if k.startswith("BLOCK") or (k == "ROWS" and v != 1)
        ]
        words.append(warps)
    words += [
        f"{k}={v}"
        for k, v in sorted(config.items())
        if k in ("GROUP_M", "waves_per_eu", "matrix_instr_nonkdim", "kpack", "occupancy")
        and v not in (None, 0, 1, 8)
    ]
    return " ".join(words)


Cell = tuple[str, str]  # text and its rich style ("" for none)


def grid(
    console: Console,
    header: Sequence[str],
    rows: Sequence[Sequence[Cell]],
    *,
    indent: int = 2,
    right: Sequence[bool] = (),
) -> None:
    """Rows of columns sized to their widest cell, every cell whole (no ellipsis, never a
    verdict or an arch name cut); a row of one cell heads the rows below it. The last column
    takes what is left of the terminal and wraps between words under itself, or starts a
    line of its own where too little is left. Piped, no line is wrapped or ends in spaces."""
    fixed = len(header) - 1
    rows = [[(printable(value), style) for value, style in row] for row in rows]
    cells = [row for row in rows if len(row) == len(header)]
    widths = [max([len(header[i]), *(len(row[i][0]) for row in cells)]) for i in range(fixed)]
    start = indent + sum(w + 2 for w in widths)
    limit = console.width if console.is_terminal else None
    room = None if limit is None else limit - start
    hanging = room is not None and room < 16

    def line(cells: Sequence[Cell], bold: bool = False) -> None:
        text = Text(" " * indent)
        for i, (value, style) in enumerate(cells[:fixed]):
            cell = value.rjust(widths[i]) if i < len(right) and right[i] else value.ljust(widths[i])
            text.append(cell + "  ", style=style or ("bold" if bold else ""))
        last, style = cells[fixed]
        # A word wider than the room left (a long config key) starts a line of its own.
        hang = hanging or (room is not None and max(map(len, last.split()), default=0) > room)
        if hang and last:
            text.rstrip()
            console.print(text)
            text = Text(" " * (indent + 4))
            wrapped = textwrap.wrap(last, (limit or 80) - indent - 4, break_long_words=False)
        else:
            wrapped = (
                textwrap.wrap(last, room, break_long_words=False, break_on_hyphens=False)
                if room
                else [last]
            ) or [""]
        for index, part in enumerate(wrapped or [""]):
            if index:
                text = Text(" " * (start if not hang else indent + 4))
            text.append(part, style=style or ("bold" if bold else ""))
            text.rstrip()
            console.print(text)

    line([(h, "") for h in header], bold=True)
    for row in rows:
        if len(row) == 1:  # a heading of the rows below it (a shape, a case)
            console.print(Text(" " * (indent - 1) + row[0][0], style=row[0][1] or "bold"))
        else:
            line(row)
