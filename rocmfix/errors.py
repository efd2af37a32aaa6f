"""Errors that end a command, each with the exit code the README documents.

Exit codes: 0 ok or nothing to do; 1 a patch failed, a refusal, ``--check`` found work, or
the output was closed (``| head``: quietly); 2 the command line is wrong; 3 an internal error
(a bug; the traceback goes to a log file); 130 interrupted (Ctrl-C), with one line that says
what state the environment is in.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130


class RocmfixError(Exception):
    """A failure rocmfix anticipated: one clear line for the user, then an exit code."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(RocmfixError):
    """The command line asks for something that cannot exist (unknown scheme, missing file)."""

    exit_code = EXIT_USAGE


class ProbeError(RocmfixError):
    """The target interpreter could not be asked what it holds."""


class RefusedError(RocmfixError):
    """rocmfix will not touch the environment in its current state; nothing was written."""


class LockBusyError(RefusedError):
    """Another rocmfix run holds this environment's lock."""


class ManifestError(RefusedError):
    """rocmfix's own record of an environment is unreadable or was tampered with."""


class AnchorNotFoundError(RocmfixError):
    """A rewrite did not find the code it anchors on; it never silently does nothing."""


class WriteError(RocmfixError):
    """Writing failed part-way; the run rolled back what it had written."""


def printable(text: str, limit: int | None = None) -> str:
    """``text`` as one line a terminal shows as it is: every character that is not printable
    (control characters: ESC, BEL, the C1 block, newlines; line separators, bidi overrides)
    as ``?``, so nothing from a trace, the target environment or the user's code reaches the
    terminal as a control sequence. The one escaping function of every renderer (through
    render/console.py) and of the probe's answers; with ``limit``, clipped to it *after*
    the escaping, so a clip never cuts a sequence in half."""
    line = "".join(c if c.isprintable() else "?" for c in text.strip())
    return line if limit is None or len(line) <= limit else line[: limit - 1] + "…"


class Interrupted(RocmfixError):
    """The user interrupted the run (Ctrl-C); the message says what state it left."""

    exit_code = EXIT_INTERRUPTED
