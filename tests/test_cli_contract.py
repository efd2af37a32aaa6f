"""The CLI's contract: exit codes, usage errors, --dry-run and --check, an internal error's
log, the probe's failure modes, the target interpreter's compile check, Python 3.8/3.9
targets and a torch version that is not PEP 440.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

import releases
from conftest import (
    DOCLAYOUT_TARGET,
    PYTHONPATH,
    ROOT,
    InstalledEnv,
    fake_torch,
    files_under,
    install_release,
    one_error_line,
    patch_p1,
    require,
    run_cli,
)

pytestmark = pytest.mark.network
ROCM_TORCH = ("2.9.1+rocm6.4", "6.4.43482")


def test_usage_errors_exit_2(env: InstalledEnv, tmp_path: Path) -> None:
    unknown = env.cli("apply", "--scheme", "nope")
    assert unknown.returncode == 2
    assert "unknown scheme 'nope'" in one_error_line(unknown.stderr)
    missing = run_cli("status", "--python", str(tmp_path / "no" / "python"))
    assert missing.returncode == 2
    assert "no such file" in one_error_line(missing.stderr)
    patch = env.cli("status", "--only", "no-such-patch")
    assert patch.returncode == 2
    assert "unknown patch" in one_error_line(patch.stderr)
    option = run_cli("apply", "--no-such-option")
    assert option.returncode == 2
    assert env.target.read_bytes() == env.original


def test_no_arguments_shows_status_and_next_step() -> None:
    result = run_cli()
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Environment ") and "not installed" in result.stdout
    # Nothing to patch here: the one next step is pointing rocmfix at MinerU's interpreter.
    assert "hint:" in result.stderr and "--python PATH" in result.stderr


def test_nothing_to_revert_is_a_friendly_no_op(env: InstalledEnv) -> None:
    result = env.cli("revert")
    assert result.returncode == 0
    assert "Nothing to revert" in result.stderr


def test_revert_of_a_patch_that_is_not_applied_names_what_is(env: InstalledEnv) -> None:
    """`revert --only vllm-qwen2-vl` said rocmfix had not patched the environment while
    another patch was applied there (issue 43)."""
    assert env.cli("apply").returncode == 0
    result = env.cli("revert", "--only", "vllm-qwen2-vl")
    assert result.returncode == 0, result.stderr
    assert "has not patched this environment" not in result.stderr
    said = " ".join(result.stderr.split())
    assert "vllm-qwen2-vl is not applied here; rocmfix has applied mineru-tokenizer" in said
    assert "rocmfix revert --only mineru-tokenizer" in said
    assert env.status("mineru-tokenizer")["verdict"] == "applied"


def test_next_mentions_revert_only_where_something_is_applied(
    mineru_env: Callable[[str], InstalledEnv],
) -> None:
    """A status with nothing applied ended `next: nothing to do; rocmfix revert ... undoes
    the patches` (issue 43)."""
    fixed = mineru_env("0.1.14")  # guarded upstream: not-needed
    result = fixed.cli("status")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[-1] == "next: nothing to do", result.stderr


def test_internal_error_points_to_a_log(env: InstalledEnv, tmp_path: Path) -> None:
    program = textwrap.dedent(
        """
        import rocmfix.write.commands
        def boom(*args, **kwargs):
            raise RuntimeError("boom")
        rocmfix.write.commands.status = boom
        from rocmfix.cli import main
        main()
        """
    )
    cache = tmp_path / "cache"
    done = subprocess.run(
        [sys.executable, "-c", program, "status", "--python", str(env.python)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": PYTHONPATH, "XDG_CACHE_HOME": str(cache)},
        check=False,
    )
    assert done.returncode == 3
    assert "internal error: RuntimeError: boom" in done.stderr
    logs = list((cache / "rocmfix" / "logs").glob("rocmfix-*.log"))
    assert len(logs) == 1
    assert str(logs[0]) in done.stderr.replace("\n", "")
    assert "Traceback" in logs[0].read_text()


# --------------------------------------------------------------- --dry-run and --check


def test_dry_run_writes_nothing_and_patch_reproduces_apply(
    env: InstalledEnv, tmp_path: Path
) -> None:
    before = files_under(env.root)
    dry = env.cli("apply", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert files_under(env.root) == before
    assert dry.stdout.startswith("--- a/mineru_vl_utils/vlm_client/vllm_async_engine_client.py")
    assert "would be applied" in dry.stderr
    assert "would be" not in dry.stdout, "summaries go to stderr, the diff alone to stdout"

    copy = tmp_path / "copy"
    shutil.copytree(env.site, copy)
    assert patch_p1(dry.stdout_bytes, copy) == 0
    assert env.cli("apply").returncode == 0
    assert (copy / env.target.relative_to(env.site)).read_bytes() == env.target.read_bytes()


def test_check_exit_codes(env: InstalledEnv) -> None:
    assert env.cli("apply", "--dry-run", "--check").returncode == 1
    assert env.cli("status", "--check").returncode == 1
    assert env.cli("apply").returncode == 0
    settled = env.cli("apply", "--dry-run", "--check")
    assert settled.returncode == 0
    assert settled.stdout == ""
    assert env.cli("status", "--check").returncode == 0


def test_apply_check_alone_is_a_dry_run_with_an_exit_code(
    doclayout_env: Callable[[str], InstalledEnv],
) -> None:
    env = doclayout_env("0.0.4")
    _rocm_stack(env.site)
    before = files_under(env.root)
    check = env.cli("apply", "--check")
    assert check.returncode == 1
    assert check.stdout.startswith("--- a/doclayout_yolo/nn/modules/g2l_crm.py")
    assert files_under(env.root) == before
    assert env.cli("apply").returncode == 0
    again = env.cli("apply", "--check")
    assert again.returncode == 0 and again.stdout == ""


def test_a_file_someone_else_edited_says_what_to_do_next(env: InstalledEnv) -> None:
    env.target.write_bytes(env.original + b"\n# my edit\n")
    status = env.cli("status")
    assert status.returncode == 0, status.stderr
    step = next(line for line in status.stderr.splitlines() if line.startswith("next:"))
    # What apply's refusal says too: reinstall, or --force.
    assert "reinstall its package" in step, step
    assert f"rocmfix apply --force --python {env.python} to patch it anyway" in step, step


def test_next_names_the_patches_apply_would_take_beside_a_file_it_refuses(
    env: InstalledEnv,
) -> None:
    """A file someone else edited (or one rocmfix does not recognise) refuses the whole
    apply: beside patches that are ready, `next:` named `apply --dry-run`, which then
    refused; it names the ready ones with --only instead, and that run goes through."""
    releases.pip_install(env.python, releases.wheel("doclayout-yolo", "0.0.4"))
    fake_torch(env.site, "2.5.0", hip="6.2")
    doclayout = env.site / DOCLAYOUT_TARGET
    doclayout.write_bytes(doclayout.read_bytes() + b"\n# my edit\n")
    status = env.cli("status")
    assert env.status("doclayout-dilated-conv")["verdict"] == "changed"
    assert env.status("mineru-tokenizer")["verdict"] == "applicable"
    step = " ".join(
        line.strip() for line in status.stderr.splitlines()[
            next(i for i, line in enumerate(status.stderr.splitlines())
                 if line.startswith("next:")):]
    )  # fmt: skip
    assert f"rocmfix apply --dry-run --python {env.python} --only mineru-tokenizer" in step, step
    assert env.cli("apply").returncode == 1  # what the plain command does
    assert env.cli("apply", "--only", "mineru-tokenizer").returncode == 0
    assert env.status("mineru-tokenizer")["verdict"] == "applied"


def _reader_gone(*args: str, stderr_too: bool = False) -> subprocess.CompletedProcess[bytes]:
    """The CLI with its stdout (and maybe stderr) a pipe whose reader has gone: `| head`."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "rocmfix", *args],
            stdout=write,
            stderr=write if stderr_too else subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": PYTHONPATH},
            cwd="/",
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)


def test_a_reader_that_left_ends_the_run_quietly(env: InstalledEnv) -> None:
    python = ("--python", str(env.python))
    for args in (("list", "--json"), ("list",), ("status", "--json", *python),
                 ("apply", "--dry-run", *python), ("env", *python)):  # fmt: skip
        done = _reader_gone(*args)
        assert (done.returncode, done.stderr) == (1, b""), (args, done.stderr)
    # apply writes before it prints: with nowhere to print its summary, the files stand.
    assert _reader_gone("apply", *python, stderr_too=True).returncode == 1
    assert env.status("mineru-tokenizer")["verdict"] == "applied"
    assert env.cli("revert").returncode == 0
    assert env.target.read_bytes() == env.original


# -------------------------------------------------------------- the target interpreter


def test_broken_interpreter_is_a_clear_error(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho broken >&2\nexit 7\n")
    fake.chmod(0o755)
    result = run_cli("status", "--python", str(fake))
    assert result.returncode == 1
    line = one_error_line(result.stderr)
    assert "does not look like a Python interpreter" in line and "(exit 7): broken" in line


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("echo not-json", "answered the probe with something that is not JSON"),
        ("echo '{\"probe\": 999}'", "answered with an unknown probe format"),
        ("sleep 30", "did not answer within 2 s"),
    ],
    ids=["not-json", "unknown-format", "timeout"],
)
def test_a_probe_that_answers_wrongly_is_one_line(
    tmp_path: Path, script: str, message: str
) -> None:
    # An interpreter that runs Python (the version check) but answers the probe wrongly.
    fake = tmp_path / "python"
    fake.write_text(
        '#!/bin/sh\ncase "$2" in *version_info*) exec python3 "$@";; esac\n' + script + "\n"
    )
    fake.chmod(0o755)
    result = run_cli("status", "--python", str(fake), env={"ROCMFIX_PROBE_TIMEOUT": "2"})
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_a_torch_version_that_is_not_pep_440_is_read_not_fatal(
    vllm_env: Callable[..., InstalledEnv],
) -> None:
    env = vllm_env("0.11.0", torch="2.9.1-custom_build", hip="6.4.43482")
    result = env.cli("status", "--json")
    assert result.returncode == 0, result.stderr
    doc = result.json()
    assert {w["code"] for w in doc["warnings"]}.isdisjoint({"mixed-torch"})
    assert {p["id"] for p in doc["patches"]} >= {"vllm-qwen2-vl"}


def _pyenv_root() -> Path | None:
    if os.environ.get("PYENV_ROOT"):
        return Path(os.environ["PYENV_ROOT"])
    pyenv = shutil.which("pyenv")
    if pyenv is None:
        return None
    done = subprocess.run([pyenv, "root"], capture_output=True, text=True, timeout=30, check=False)
    return Path(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else None


def _patch_level(python: Path) -> int:
    patch = python.parents[1].name.split(".")[2]
    return int(patch) if patch.isdigit() else -1


def _pyenv(version: str) -> Path | None:
    """Python ``version`` from pyenv's versions, or else ``python3.X`` on PATH.

    pyenv's own interpreter first: on PATH ``python3.8`` is often pyenv's shim, which runs
    only when that version is the one selected.
    """
    root = _pyenv_root()
    if root is not None:
        found = sorted(root.glob(f"versions/{version}.*/bin/python"), key=_patch_level)
        if found:
            return found[-1]
    on_path = shutil.which(f"python{version}")
    return Path(on_path) if on_path else None


def _missing(version: str) -> str:
    return f"Python {version} is not installed (no pyenv version, no python{version} on PATH)"


def _rocm_stack(site: Path) -> None:
    """A ROCm torch 2.9 and the Triton it pins, as metadata only (what the probe reads)."""
    fake_torch(site, ROCM_TORCH[0], hip=ROCM_TORCH[1])
    info = site / "pytorch_triton_rocm-3.5.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: pytorch-triton-rocm\nVersion: 3.5.1\n"
    )
    (info / "RECORD").write_text("")


def _doclayout_on(python: Path, root: Path) -> InstalledEnv:
    """doclayout-yolo 0.0.4 installed by pip into a venv of ``python``, with a ROCm torch's
    metadata: what a Python 3.8/3.9 MinerU 2.x environment holds."""
    subprocess.run([str(python), "-m", "venv", "--without-pip", str(root)], check=True)
    target = root / "bin" / "python"
    releases.pip_install(target, releases.wheel("doclayout-yolo", "0.0.4"))
    site = releases.site_packages(target)
    _rocm_stack(site)
    path = site / DOCLAYOUT_TARGET
    return InstalledEnv(root, target, site, path, path.read_bytes())


@pytest.mark.parametrize("version", ["3.8", "3.9"])
def test_python_38_and_39_targets_round_trip(tmp_path: Path, version: str) -> None:
    python = _pyenv(version)
    require(python is not None, _missing(version))
    assert python is not None
    env = _doclayout_on(python, tmp_path / f"py{version}")
    before = files_under(env.root)
    status = env.status("doclayout-dilated-conv")
    assert status["verdict"] == "applicable", status
    applied = env.cli("apply", "--scheme", "gemm")
    assert applied.returncode == 0, applied.stderr
    assert env.status("doclayout-dilated-conv")["verdict"] == "applied"
    # The dropped kernel and the rewritten file compile in the target's own Python.
    assert (env.site / "doclayout_yolo/nn/modules/g2l_crm_triton.py").is_file()
    reverted = env.cli("revert")
    assert reverted.returncode == 0, reverted.stderr
    assert files_under(env.root) == before


# Our own block in DocLayout-YOLO's shape, with a statement Python 3.8 cannot compile.
NEEDS_310 = (ROOT / "tests" / "golden" / "doclayout_block.py").read_text() + (
    "\n\ndef _mode(x):\n    match x:\n        case _:\n            return x\n"
)


def test_a_rewrite_the_target_cannot_compile_writes_nothing(tmp_path: Path) -> None:
    python = _pyenv("3.8")
    require(python is not None, _missing("3.8"))
    assert python is not None
    old = _doclayout_on(python, tmp_path / "py38")
    old.target.write_text(NEEDS_310)
    before = files_under(old.root)
    refused = old.cli("apply", "--force")
    assert refused.returncode == 1
    assert "does not compile" in refused.stderr and "nothing was changed" in refused.stderr
    assert files_under(old.root) == before  # not a byte, not the state folder
    # The same bytes in an interpreter that can compile them: the check ran in the target.
    new = install_release(tmp_path / "py-host", "doclayout-yolo", "0.0.4", DOCLAYOUT_TARGET)
    _rocm_stack(new.site)
    new.target.write_text(NEEDS_310)
    assert new.cli("apply", "--force").returncode == 0
