"""Where a rocmfix bug's traceback goes: a log file the error line points at, so that the
terminal shows one line and a report still has the whole story."""

from __future__ import annotations

import datetime
import os
import traceback
from pathlib import Path

from . import __version__


def _directory() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rocmfix" / "logs"


def write(exc: BaseException) -> str | None:
    try:
        directory = _directory()
        directory.mkdir(parents=True, exist_ok=True)
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        path = directory / f"rocmfix-{stamp}-{os.getpid()}.log"
        path.write_text(
            f"rocmfix {__version__}\n" + "".join(traceback.format_exception(exc)), encoding="utf-8"
        )
    except OSError:
        return None
    return str(path)
