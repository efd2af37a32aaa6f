"""``rocmfix status`` at a real terminal: under a pseudo-terminal (``script``) of 80, 100 and
160 columns no line is wider than the terminal and no word (a version, a path, an id) is
broken; piped, every reason stays on one line."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable

import pytest

from conftest import PYTHONPATH, InstalledEnv, fake_torch

pytestmark = pytest.mark.network

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _at_terminal(columns: int, *args: str, raw: bool = False) -> str:
    """The CLI's output as a terminal of ``columns`` shows it (``raw``: with its escapes)."""
    assert shutil.which("script"), "util-linux's script(1) is needed for a pseudo-terminal"
    command = " ".join(shlex.quote(a) for a in (sys.executable, "-m", "rocmfix", *args))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update({"PYTHONPATH": PYTHONPATH, "TERM": "xterm-256color"})
    done = subprocess.run(
        ["script", "-qec", f"stty cols {columns} rows 60; {command}", "/dev/null"],
        capture_output=True,
        env=env,
        cwd="/",
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    screen = done.stdout.decode("utf-8", "replace").replace("\r", "")
    return screen if raw else ANSI.sub("", screen)


@pytest.fixture
def env(mineru_env: Callable[[str], InstalledEnv]) -> InstalledEnv:
    # A long reason, notes and a warning: the lines that wrap.
    made = mineru_env("0.1.13")
    fake_torch(made.site, "2.10.0+rocm7.1", hip="7.1.0")
    return made


@pytest.mark.parametrize("columns", [80, 100, 160])
def test_status_fits_the_terminal_and_breaks_no_word(env: InstalledEnv, columns: int) -> None:
    screen = _at_terminal(columns, "status", "--python", str(env.python))
    lines = screen.splitlines()
    assert lines and max(len(line) for line in lines) <= columns, screen
    document = env.cli("status", "--json").json()
    words = set(screen.split())
    for patch in document["patches"]:
        if patch["verdict"] == "not-installed":
            continue
        for text in (patch["reason"], *patch["notes"]):
            # Every word of the reason is on the screen whole.
            assert set(text.split()) <= words, (text, screen)
        assert patch["id"] in words and patch["version"] in words
    for warning in document["warnings"]:
        assert set(warning["message"].split()) <= words
    assert "not installed: vllm (3 patches)" in screen


def test_piped_status_keeps_each_reason_on_one_line(env: InstalledEnv) -> None:
    piped = env.cli("status")
    document = env.cli("status", "--json").json()
    mineru = next(p for p in document["patches"] if p["id"] == "mineru-tokenizer")
    assert any(line.strip() == mineru["reason"] for line in piped.stdout.splitlines())


def test_prose_is_coloured_only_where_rocmfix_styles_it(env: InstalledEnv) -> None:
    # rich's highlighter would colour "1", "file", "(s)" and the path each on its own.
    applied = _at_terminal(200, "apply", "--python", str(env.python), raw=True)
    summary = next(line for line in applied.splitlines() if "changed in" in line)
    assert "\x1b[" not in summary, repr(summary)
    # rocmfix's own styles stay: the patch id in green.
    assert "\x1b[32mmineru-tokenizer\x1b[0m: applied" in applied, repr(applied)
    status = _at_terminal(200, "status", "--python", str(env.python), raw=True)
    step = next(line for line in status.splitlines() if ANSI.sub("", line).startswith("next:"))
    assert "\x1b[" not in step.split("next:", 1)[1].removeprefix("\x1b[0m"), repr(step)
