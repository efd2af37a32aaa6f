"""Unified diffs of a run's changes, byte for byte, as ``patch -p1`` expects them.

Diffs are built from bytes, not text, so a latin-1 file, a BOM or CRLF line ends come out
exactly as they are on disk and ``patch`` applies them back exactly.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from .results import FileChange

_NO_NEWLINE = b"\\ No newline at end of file\n"


def _lines(data: bytes | None) -> list[bytes]:
    return data.splitlines(keepends=True) if data else []


def unified_diff(change: FileChange) -> bytes:
    old = b"/dev/null" if change.before is None else b"a/" + change.display.encode()
    new = b"/dev/null" if change.after is None else b"b/" + change.display.encode()
    lines = difflib.diff_bytes(
        difflib.unified_diff,
        _lines(change.before),
        _lines(change.after),
        fromfile=old,
        tofile=new,
        lineterm=b"\n",
        n=3,
    )
    out = []
    for line in lines:
        if line.startswith((b"---", b"+++")):
            out.append(line.rstrip(b"\n") + b"\n")
        elif line.endswith(b"\n"):
            out.append(line)
        else:
            # difflib leaves a last line without its newline; unified diff marks it instead.
            out.append(line + b"\n" + _NO_NEWLINE)
    return b"".join(out)


def unified_diffs(changes: Iterable[FileChange]) -> bytes:
    return b"".join(unified_diff(change) for change in changes)
