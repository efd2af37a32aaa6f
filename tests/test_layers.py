"""docs/architecture.md's arrows: render reads results, never an engine module."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINE = (
    "rocmfix.doctor",
    "rocmfix.kernels",
    "rocmfix.tune",
    "rocmfix.worker",
    "rocmfix.write.commands",
)
# render/profile.py reads rocmfix.profile.model, whose package imports the profiler.
RENDERERS = ("console", "doctor", "kernels", "run", "status", "tune")


def test_the_renderers_import_no_engine_module() -> None:
    program = (
        "import importlib, json, sys\n"
        f"for name in {RENDERERS!r}:\n"
        "    importlib.import_module('rocmfix.render.' + name)\n"
        f"print(json.dumps(sorted(m for m in {ENGINE!r} if m in sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout) == [], done.stdout
