"""Run the user's command, unmodified, with the profiling shim first on its PYTHONPATH.

The shim lives in a folder rocmfix creates (mode 0700, under the system's temp folder, never
the cwd); nothing is written into the target environment. The command inherits this process's
stdin, stdout and stderr, so its output passes through untouched, and its exit code is kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from rocmfix import supervise
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


def run(command: Sequence[str], folder: Path, window: Window, trace: bool) -> supervise.Ran:
    """How the command ended (its exit code: 128 + N for a signal, as a shell reports it);
    ``command`` is not empty (:func:`rocmfix.profile.run` refuses that first)."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(folder) + (os.pathsep + path if path else "")
    env["ROCMFIX_PROFILE_DIR"] = str(folder)
    env["ROCMFIX_PROFILE_WINDOW"] = json.dumps(window.as_json())
    if trace:
        env["ROCMFIX_PROFILE_TRACE"] = "1"
    else:
        env.pop("ROCMFIX_PROFILE_TRACE", None)
    try:
        return supervise.run_passing_signals(command, env)
    except FileNotFoundError:
        raise UsageError(f"command not found: {command[0]}") from None
    except PermissionError:
        raise UsageError(f"cannot run {command[0]}: permission denied") from None


_PYTHON = re.compile(r"python[0-9.]*")
_WHY = {"I": "ignores PYTHONPATH (isolated mode)", "E": "ignores PYTHONPATH", "S": "skips site"}
_ENV_TAKES = ("-u", "--unset", "-C", "--chdir", "-S", "--split-string")


def shim_blockers(command: Sequence[str]) -> list[str]:
    """Why rocmfix's profiler will not load in the command's Python, where its command line
    says so: an ``env`` that sets or clears PYTHONPATH, a ``python`` run with -I, -E or -S.
    (A script that does the same inside is found only afterwards: no process loaded it.)"""
    found: list[str] = []
    argv = list(command)
    if argv and os.path.basename(argv[0]) == "env":
        at, options = 1, True
        while at < len(argv):
            word = argv[at]
            if "=" in word and not word.startswith("-"):
                options = False  # options come before the first NAME=VALUE
            elif not options or not word.startswith("-"):
                break
            if word in ("-i", "--ignore-environment", "-"):
                found.append("`env -i` clears the environment, rocmfix's PYTHONPATH with it")
            elif word in ("-uPYTHONPATH", "--unset=PYTHONPATH") or (
                word in ("-u", "--unset") and argv[at + 1 : at + 2] == ["PYTHONPATH"]
            ):
                found.append("`env -u PYTHONPATH` removes rocmfix's PYTHONPATH")
            elif word.split("=", 1)[0] == "PYTHONPATH" and "=" in word:
                found.append(
                    "`env PYTHONPATH=...` replaces rocmfix's PYTHONPATH (set PYTHONPATH "
                    "before `rocmfix profile` instead: it keeps yours after its own)"
                )
            elif word in ("-S", "--split-string") or word.startswith("--split-string="):
                break
            at += 2 if word in _ENV_TAKES else 1
        argv = argv[at:]
    if argv and _PYTHON.fullmatch(os.path.basename(argv[0])):
        at = 1
        while at < len(argv) and argv[at].startswith("-") and argv[at] not in ("-", "--"):
            word = argv[at]
            at += 1
            for n, letter in enumerate("" if word.startswith("--") else word[1:]):
                if letter in "IES":
                    found.append(f"`python -{letter}` {_WHY[letter]}")
                if letter in "cm":  # the rest is the program and its arguments
                    return found
                if letter in "WX":  # its value: the rest of the word, or the next one
                    at += n + 2 == len(word)
                    break
    return found
