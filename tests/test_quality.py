"""The project's own rules, checked where CI runs them: lint, types, docs that match code."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from rocmfix import errors

from conftest import ROOT


def _tool(name: str) -> list[str]:
    found = shutil.which(name, path=str(ROOT / ".venv" / "bin")) or shutil.which(name)
    if found is None:
        return [sys.executable, "-m", name]
    return [found]


@pytest.mark.parametrize(
    "command",
    [["ruff", "check", "."], ["ruff", "format", "--check", "."], ["mypy"]],
    ids=["ruff-check", "ruff-format", "mypy-strict"],
)
def test_tool_is_clean(command: list[str]) -> None:
    done = subprocess.run(
        [*_tool(command[0]), *command[1:]], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_readme_documents_every_exit_code() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}
    defined = {value for name, value in vars(errors).items() if name.startswith("EXIT_")}
    assert documented == defined


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    lines = readme.split("Run the tests", 1)[1].splitlines()
    command = next(line.strip() for line in lines if line.startswith("    "))
    assert "pytest" in command
    extracted = subprocess.run(
        ["bash", "-c", "source <(sed -n '/^command=/p' .ci/run) && echo \"$command\""],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert extracted == command


def test_readme_starts_with_install_and_test_commands() -> None:
    readme = (ROOT / "README.md").read_text().split("---", 1)[0]
    commands = [line.strip() for line in readme.splitlines() if line.startswith("    ")]
    assert len(commands) == 2
    assert "pip install" in commands[0] and "rocmfix" in commands[0]
    assert "pytest" in commands[1]
