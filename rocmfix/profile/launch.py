"""Run the user's command, unmodified, with the profiling shim first on its PYTHONPATH.

The shim lives in a folder rocmfix creates (mode 0700, under the system's temp folder, never
the cwd); nothing is written into the target environment. The command inherits this process's
stdin, stdout and stderr, so its output passes through untouched, and its exit code is kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from rocmfix.errors import UsageError

from .model import Window

SHIM = Path(__file__).resolve().parents[1] / "guest" / "profile_shim.py"


@contextlib.contextmanager
def workspace() -> Iterator[Path]:
    """A private folder for the shim and the events, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="rocmfix-profile-"))
    try:
        cwd = Path.cwd().resolve()
        if folder.resolve() == cwd or cwd in folder.resolve().parents:
            # TMPDIR points into the cwd: a folder there could be read as the project's own.
            shutil.rmtree(folder)
            folder = Path(tempfile.mkdtemp(prefix="rocmfix-profile-", dir="/tmp"))
        os.chmod(folder, 0o700)
        shutil.copyfile(SHIM, folder / "sitecustomize.py")
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run(command: Sequence[str], folder: Path, window: Window, trace: bool) -> int:
    """The command's exit code (128 + N for a signal, as a shell reports it)."""
    if not command:
        raise UsageError("no command to profile", hint="rocmfix profile -- python my_script.py")
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(folder) + (os.pathsep + path if path else "")
    env["ROCMFIX_PROFILE_DIR"] = str(folder)
    env["ROCMFIX_PROFILE_WINDOW"] = json.dumps(window.as_json())
    if trace:
        env["ROCMFIX_PROFILE_TRACE"] = "1"
    else:
        env.pop("ROCMFIX_PROFILE_TRACE", None)
    # Ctrl-C reaches the command (same process group); rocmfix waits for it and reports.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        try:
            proc = subprocess.Popen(list(command), env=env)
        except FileNotFoundError:
            raise UsageError(f"command not found: {command[0]}") from None
        except PermissionError:
            raise UsageError(f"cannot run {command[0]}: permission denied") from None
        code = proc.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
    return 128 - code if code < 0 else code
