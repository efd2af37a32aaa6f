"""The README's walkthrough, run for real against a real mineru-vl-utils release.

Every ``console`` block in the README's walkthrough starts with ``$ rocmfix ...``; this test
runs those commands in order against a fresh environment and compares what they print with
what the README shows. After a deliberate change of output, refresh the README with
``python tests/test_readme.py``.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

import releases
from conftest import ROOT, run_cli

pytestmark = pytest.mark.network

README = ROOT / "README.md"
COMMANDS = ROOT / "docs" / "commands.md"
SHOWN = "~/mineru/.venv"
VERSION = "0.1.13"
_BLOCK = re.compile(r"```console\n(\$ rocmfix [^\n]*)\n(.*?)```", re.DOTALL)


def _section(text: str) -> tuple[int, int]:
    start = text.index("## Your first five minutes")
    end = text.index("\n## ", start + 1)
    return start, end


def _normalise(output: str, actual: Path) -> str:
    output = output.replace(str(actual), SHOWN)
    output = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", "2026-11-22T12:00:00+00:00", output)
    output = re.sub(r"\(Python \d+\.\d+\.\d+\)", "(Python 3.11.7)", output)
    return "\n".join(line.rstrip() for line in output.splitlines()).strip() + "\n"


def _run(command: str, actual: Path) -> str:
    words = shlex.split(command.removeprefix("$ rocmfix ").replace(SHOWN, str(actual)))
    redirected = ">" in words
    if redirected:
        words = words[: words.index(">")]
    # The width the README promises every command reads at.
    result = run_cli(*words, env={"COLUMNS": "80"})
    shown = result.stderr if redirected else result.stdout + result.stderr
    return _normalise(shown, actual)


def _fresh_environment(actual: Path) -> None:
    python = releases.make_venv(actual)
    releases.pip_install(python, releases.wheel("mineru-vl-utils", VERSION))


def walkthrough() -> list[tuple[str, str, str]]:
    """(command, shown in the README, printed now) for every block, in order."""
    text = README.read_text()
    start, end = _section(text)
    # A private folder per run: two runs at once must not share (or delete) one.
    scratch = Path(tempfile.mkdtemp(prefix="rocmfix-readme-"))
    actual = scratch / "mineru" / ".venv"
    _fresh_environment(actual)
    try:
        return [
            (m.group(1), m.group(2), _run(m.group(1), actual))
            for m in _BLOCK.finditer(text[start:end])
        ]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_readme_walkthrough_is_what_rocmfix_prints() -> None:
    steps = walkthrough()
    assert [c.split()[2] for c, _, _ in steps] == [
        "--help",
        "status",
        "apply",
        "apply",
        "status",
        "revert",
    ]
    for command, shown, printed in steps:
        assert printed == shown, f"{command}: run `python tests/test_readme.py` to refresh"


def _refresh() -> None:
    steps = walkthrough()
    text = README.read_text()
    start, end = _section(text)
    section = text[start:end]
    for command, shown, printed in steps:
        section = section.replace(f"{command}\n{shown}```", f"{command}\n{printed}```", 1)
    README.write_text(text[:start] + section + text[end:])


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    _refresh()


def test_the_test_command_installs_a_cpu_torch_with_triton() -> None:
    """The README's test command (what CI runs) takes PyTorch's CPU build where a user can
    reach its index, not 6 GB of CUDA packages; the CPU build brings no Triton, so the test
    extra names it, at the version the CUDA build pins (issue 32)."""
    text = README.read_text()
    command = next(
        line.strip()
        for line in text.split("Run the tests", 1)[1].splitlines()
        if line.startswith("    ")
    )
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in command
    extra = (ROOT / "pyproject.toml").read_text().split("test = [", 1)[1].split("]", 1)[0]
    pins = dict(re.findall(r'"(torch|torchvision|triton)==([0-9.]+)"', extra))
    assert set(pins) == {"torch", "torchvision", "triton"}, pins
    # What the skips need is said where the README sends a developer.
    assert "docs/development.md" in text
    assert "What the skips need" in (ROOT / "docs" / "development.md").read_text()


def test_the_schemes_table_is_the_op_registry() -> None:
    """One column per op, one row per scheme: a cell for each scheme the op offers (its
    default marked), `-` for each it does not."""
    from rocmfix.ops import OPS
    from rocmfix.registry import scheme_names

    text = COMMANDS.read_text()
    table = text.split("## Schemes", 1)[1].split("\n\n")[1].splitlines()
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table]
    header, body = rows[0], rows[2:]
    assert len(header) == len(OPS) + 1, header
    for op, title in zip(OPS, header[1:], strict=True):
        assert title.startswith(op.title), (op.name, title)
    assert [row[0] for row in body] == [f"`{name}`" for name in scheme_names()]
    for row in body:
        name = row[0].strip("`")
        for op, cell in zip(OPS, row[1:], strict=True):
            offered = name in op.scheme_names
            assert (cell != "-") == offered, (op.name, name, cell)
            assert cell.startswith("**default**") == (name == op.default_scheme.name), cell


def test_the_patch_table_and_only_name_every_distribution() -> None:
    """The first table has a row for each distribution's patches, and `--only`'s list of
    distributions is the registry's."""
    from rocmfix.registry import all_patches

    text = (ROOT / "docs" / "patches.md").read_text()
    table = text[text.index("| patch | target file |") :].split("\n\n", 1)[0]
    firsts = {line.split("|")[1] for line in table.splitlines()[2:]}
    distributions = list(dict.fromkeys(p.distribution for p in all_patches()))
    for name in distributions:
        ids = {p.id for p in all_patches() if p.distribution == name}
        assert any(f"`{i}`" in cell for i in ids for cell in firsts), name
    listed = COMMANDS.read_text().split("`--only` with a distribution (", 1)[1]
    only = " ".join(listed.split(")", 1)[0].split())
    assert only == ", ".join(f"`{name}`" for name in distributions), only


def test_what_the_readme_says_of_piped_help_holds() -> None:
    """Piped, rocmfix's own lines end in no space; typer's help pads its lines, and the
    README says so rather than promise otherwise."""
    shown = run_cli("apply", "--help").stdout.splitlines()
    padded = any(line != line.rstrip() for line in shown)
    text = " ".join(COMMANDS.read_text().split())
    assert ("`--help` is typer's own" in text and "padded" in text) == padded


def test_every_environment_variable_the_code_reads_is_documented() -> None:
    """docs/commands.md's table names every ``ROCMFIX_*`` variable that rocmfix, its patches or
    its dropped-in templates mention, and nothing they do not."""
    code = "".join(
        path.read_text(encoding="utf-8")
        for folder in ("rocmfix", "patches", "templates")
        for path in sorted((ROOT / folder).rglob("*.py"))
    )
    used = set(re.findall(r"\bROCMFIX_[A-Z0-9_]*[A-Z0-9]\b", code))
    table = COMMANDS.read_text().split("## Environment variables", 1)[1]
    documented = set(re.findall(r"`(ROCMFIX_[A-Z0-9_]+)", table))
    assert used == documented, (sorted(used - documented), sorted(documented - used))
