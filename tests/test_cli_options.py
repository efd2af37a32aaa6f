"""The command line's options and help, run as a user runs them (issue 32): typer's private
parts patched only where they exist, rocmfix's own overrides each with its flag, ``--only``
a filter, and the hints that point to the next command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import releases
from conftest import NO_GPU, PYTHONPATH, run_cli

_WITHOUT_DISPLAY_TYPE = """
import sys
import typer.core
for cls in typer.core.TyperOption.__mro__:
    if "display_type_rich" in vars(cls):
        delattr(cls, "display_type_rich")
assert not hasattr(typer.core.TyperOption, "display_type_rich")
from rocmfix.cli import main
sys.argv[0] = "rocmfix"
main()
"""


def _python(code: str, *args: str, path: str = PYTHONPATH) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **NO_GPU, "PYTHONPATH": path, "COLUMNS": "100"}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=120,
        check=False,
    )


# typer's own help calls the attribute, so a typer without it renders help its own way; what
# must work is everything else, and rocmfix's import above all.
@pytest.mark.parametrize("args", [["--version"], ["list"], ["list", "--json"]])
def test_cli_runs_with_a_typer_that_lacks_the_private_attribute(args: list[str]) -> None:
    done = _python(_WITHOUT_DISPLAY_TYPE, *args)
    assert done.returncode == 0, done.stderr
    assert "AttributeError" not in done.stderr
    assert "rocmfix" in done.stdout or "mineru-tokenizer" in done.stdout


@pytest.mark.network
def test_cli_runs_with_the_newest_typer_click_and_rich(tmp_path: Path) -> None:
    """What the next typer, click or rich release does to rocmfix, before users meet it."""
    target = tmp_path / "newest"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--upgrade"]
    done = subprocess.run(
        [*pip, "--target", str(target), "typer", "click", "rich"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    path = os.pathsep.join([str(target), PYTHONPATH])
    code = "import sys; from rocmfix.cli import main; sys.argv[0] = 'rocmfix'; main()"
    for args in (["--help"], ["apply", "--help"], ["list"], ["status"]):
        ran = _python(code, *args, path=path)
        assert ran.returncode == 0, (args, ran.stderr)
        assert "Traceback" not in ran.stderr and "internal error" not in ran.stderr


def test_flags_show_no_bool_type() -> None:
    shown = run_cli("apply", "--help", env={"COLUMNS": "100"}).stdout
    assert "--dry-run" in shown and "<bool>" not in shown and "BOOLEAN" not in shown


def _tokenizer_env(root: Path, vllm: str) -> Path:
    """mineru-vl-utils 0.1.13 (the unguarded call) beside vllm's tokenizer-group files of
    the release ``vllm`` (with its real RECORD), as MinerU 2.5.4 pins them."""
    from patches.mineru_tokenizer import TOKENIZER_GROUP

    python = releases.make_venv(root)
    releases.pip_install(python, releases.wheel("mineru-vl-utils", "0.1.13"))
    wanted = ["vllm/__init__.py"] + [rel.split(":", 1)[1] for rel in TOKENIZER_GROUP]
    there = releases.wheel_members("vllm", vllm, wanted)
    releases.partial_install(python, "vllm", vllm, [m for m in wanted if there[m] is not None])
    return python


@pytest.mark.network
@pytest.mark.parametrize(
    ("vllm", "verdict"), [("0.10.1.1", "not-needed"), ("0.11.0", "applicable")]
)
def test_tokenizer_verdict_reads_the_installed_vllm(
    tmp_path: Path, vllm: str, verdict: str
) -> None:
    python = _tokenizer_env(tmp_path / "env", vllm)
    document = run_cli("status", "--json", "--python", str(python)).json()
    patch = {p["id"]: p for p in document["patches"]}["mineru-tokenizer"]
    assert patch["verdict"] == verdict, patch
    check = run_cli("status", "--check", "--python", str(python))
    if verdict == "not-needed":
        # vllm 0.10's tokenizer group has the method: the environment cannot crash.
        assert f"vllm {vllm} still defines" in patch["reason"]
        assert check.returncode == 0, check.stderr
    else:
        assert any("defines no get_lora_tokenizer()" in n for n in patch["notes"]), patch
        assert check.returncode == 1 and "mineru-tokenizer" in check.stderr
