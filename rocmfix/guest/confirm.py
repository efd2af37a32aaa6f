"""One trap's confirmation for ``doctor`` (``rocmfix.checks.Confirm``), started in the target
interpreter as ``python -c BOOT FOLDER confirm CODE`` in a child of its own: the import it
makes may abort the process, and then only this child dies (the host words a death by a
signal). It prints one line: what the code printed last, or ``raised TYPE: MESSAGE``; a
package that is not there to import exits 3 (nothing to confirm)."""

from __future__ import annotations

import io
from contextlib import redirect_stdout

from .context import one_line


def main(argv: list[str]) -> int:
    said = io.StringIO()
    try:
        with redirect_stdout(said):
            exec(compile(argv[1], "<rocmfix confirm>", "exec"), {"__name__": "_rocmfix_confirm"})
    except ModuleNotFoundError as exc:
        print("cannot run: " + one_line(exc))
        return 3
    except Exception as exc:  # noqa: BLE001 - what the import raised is the evidence
        print("raised " + one_line(exc))
        return 0
    lines = said.getvalue().strip().splitlines()
    print(lines[-1] if lines else "it printed nothing")
    return 0
