"""The command line's options and help, run as a user runs them (issue 32): typer's private
parts patched only where they exist, rocmfix's own overrides each with its flag, ``--only``
a filter, and the hints that point to the next command."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import releases
from conftest import NO_GPU, PYTHONPATH, one_error_line, run_cli

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


def _help(*args: str, columns: int = 80) -> str:
    result = run_cli(*args, "--help", env={"COLUMNS": str(columns)})
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_help_names_every_target_and_keeps_choices_whole() -> None:
    assert "transformers" in " ".join(_help(columns=100).split())
    for command, choices in (
        ("kernels", ("gfx1100", "gfx1201", "gfx90a", "gfx942", "gfx950", "sm_90")),
        ("apply", ("gemm", "linear", "triton")),
        ("env", ("bash", "zsh", "fish", "powershell", "huggingface", "modelscope", "local")),
    ):
        shown = _help(command)
        words = {w.strip(",.:;()") for w in shown.split()}
        # At 80 columns every choice is a whole word, never "gfx9" + "42".
        assert set(choices) <= words, (command, shown)
        assert "<" not in shown and "|" not in shown.replace("│", ""), shown
    revert = " ".join(_help("revert", columns=100).split())
    assert "Restore a file" in revert and "Patch or restore" not in revert


def test_model_source_says_what_each_source_does(tmp_path: Path) -> None:
    python = releases.make_venv(tmp_path / "env")
    said = {}
    for source in ("huggingface", "modelscope", "local"):
        done = run_cli("env", "--model-source", source, "--python", str(python))
        assert done.returncode == 0, done.stderr
        said[source] = done.stdout
    assert "instead of the default" not in said["huggingface"]
    assert "its default" in said["huggingface"]
    assert "from local" not in said["local"] and "local paths" in said["local"]


def test_unknown_only_names_the_distributions_not_every_id() -> None:
    # `mineru` itself is a distribution rocmfix patches (its pytorchocr files).
    done = run_cli("status", "--only", "mineru-vl")
    assert done.returncode == 2
    hint = next(line for line in done.stderr.splitlines() if line.startswith("hint:"))
    for name in ("vllm", "transformers", "doclayout-yolo", "mineru-vl-utils", "mineru"):
        assert name in hint
    assert "transformers-glm4v" not in hint  # not every patch id on one line


@pytest.mark.parametrize("program", ["/bin/echo", "/bin/ls"])
def test_a_program_that_is_not_python_gets_a_hint_and_no_probe_code(program: str) -> None:
    done = run_cli("status", "--python", program)
    assert done.returncode == 1
    assert "hint: give --python the interpreter" in done.stderr
    assert "import importlib" not in done.stderr and "sys.path" not in done.stderr


@pytest.mark.network
def test_force_says_which_check_it_overrode(doclayout_env: Any) -> None:
    env = doclayout_env("0.0.4")
    mine = env.target.parent / "g2l_crm_triton.py"
    mine.write_bytes(b"# my own kernels\n")
    env.target.write_bytes(env.original + b"\n# my edit\n")
    refused = env.cli("apply", "--dry-run")
    assert refused.returncode == 1 and "use --force" in refused.stderr
    forced = env.cli("apply", "--dry-run", "--force")
    assert forced.returncode == 0, forced.stderr
    line = next(x for x in forced.stderr.splitlines() if "would be applied" in x)
    assert "--force overrode: someone else changed the file" in line
    assert "a file rocmfix did not drop was where a kernel goes" in line


def test_list_wraps_with_hanging_indents_at_80_columns() -> None:
    from test_terminal80 import at_terminal, fits

    screen = at_terminal(80, "list")
    fits(screen, 80)
    document = run_cli("list", "--json").json()
    ids = {p["id"] for p in document["patches"]}
    for line in screen.splitlines():
        assert line == line.rstrip(), repr(line)
        # Only a patch's own line starts at column 0: a wrapped line keeps its indent.
        if line and not line.startswith(" "):
            assert line.split()[0] in ids, line
    words = set(screen.split())
    assert all(p["file"] in words for p in document["patches"]), screen
    # Piped, every known shape stays on one line.
    piped = run_cli("list").stdout.splitlines()
    for patch in document["patches"]:
        for known in patch["known"]:
            assert any(line.endswith(f" {known}") for line in piped), known


COMMANDS = ("status", "apply", "revert", "list", "doctor", "tune", "kernels", "env", "profile")


@pytest.mark.parametrize("command", COMMANDS)
def test_help_paragraphs_reflow_at_80_columns(command: str) -> None:
    shown = _help(command)
    prose = shown.split("╭", 1)[0].splitlines()
    for line, after in itertools.pairwise(prose):
        if line.strip() and after.strip():
            # A line ends where the next word would not fit (rich pads one column each
            # side), never at a line break of the docstring's source.
            assert len(line.strip()) + 1 + len(after.split()[0]) > 78, (line, after)


def test_profile_usage_reads_as_a_command_line() -> None:
    shown = _help("profile")
    usage = next(line.strip() for line in shown.splitlines() if "Usage:" in line)
    assert usage == "Usage: rocmfix profile [OPTIONS] -- COMMAND [ARGS]...", usage
    assert "<list" not in shown and "{" not in shown, shown


def test_scheme_help_names_each_ops_own_default() -> None:
    from rocmfix.ops import OPS

    shown = " ".join(_help("apply", columns=400).replace("│", " ").split())
    for op in OPS:
        assert f"{op.title}: {op.default_scheme.name}" in shown, (op.name, shown)
    assert "keeps its default, gemm" not in shown


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("vllm-qwen2vl", "vllm-qwen2-vl"),
        ("mineru-tokeniser", "mineru-tokenizer"),
        ("transformer", "transformers"),
        ("hgnet", "transformers-hgnet-v2"),
    ],
)
def test_an_only_typo_suggests_the_closest_names(typed: str, meant: str) -> None:
    done = run_cli("status", "--only", typed)
    assert done.returncode == 2
    hint = next(line for line in done.stderr.splitlines() if line.startswith("hint:"))
    suggested = hint.split("did you mean ", 1)[1].split("?", 1)[0].split(", ")
    assert meant in suggested and len(suggested) <= 3, hint


LABELS = (
    "error:",
    "hint:",
    "next:",
    "Environment",
    "No ROCm torch here",
    "not installed:",
    "Warnings",
    "  ",
)


def test_errors_and_hints_hang_their_wrapped_lines_at_80_columns() -> None:
    from test_terminal80 import at_terminal, fits

    for args in (("status",), ("status", "--python", "/bin/echo"),
                 ("profile", "--", "sh", "-c", "exit 0")):  # fmt: skip
        screen = at_terminal(80, *args)
        fits(screen, 80)
        # A wrapped error or hint goes on indented: every line starts with a label.
        assert all(line.startswith(LABELS) for line in screen.splitlines() if line), screen
    piped = run_cli("profile", "--", "sh", "-c", "exit 0")
    assert piped.returncode == 0
    # A note, not an error: the command ran and succeeded (issue 43.5).
    assert "error:" not in piped.stderr, piped.stderr
    assert (
        "note: nothing to profile: rocmfix's profiler did not load in any process of `sh -c "
        "exit 0`" in " ".join(piped.stderr.split())
    ), piped.stderr


@pytest.mark.parametrize(
    ("args", "said", "choices"),
    [
        (("--shell", "tcsh"), "unknown shell tcsh", "bash, zsh, fish, powershell"),
        (("--model-source", "s3"), "unknown model source s3", "modelscope, huggingface, local"),
        (("--model-source", ""), "unknown model source ''", "modelscope, huggingface, local"),
    ],
)
def test_env_refuses_an_unknown_choice_as_other_options_do(
    args: tuple[str, ...], said: str, choices: str
) -> None:
    done = run_cli("env", *args)
    assert done.returncode == 2
    assert one_error_line(done.stderr) == f"error: {said}", done.stderr
    assert f"hint: choose from {choices}" in done.stderr.splitlines(), done.stderr


@pytest.mark.parametrize("command", ["status", "apply", "env"])
def test_an_option_without_its_value_points_to_its_commands_help(command: str) -> None:
    done = run_cli(command, "--python")
    assert done.returncode == 2
    assert "requires an argument" in one_error_line(done.stderr)
    assert f"hint: `rocmfix {command} --help` says more" in done.stderr.splitlines(), done.stderr
