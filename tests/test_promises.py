"""README promises and CLI paths that no other test reaches, each with a test that fails when
the promise breaks: all or nothing when one patch of a run is refused, the target
interpreter's compile check, Python 3.8/3.9 targets, `apply --check` alone, a repeated
`--only`, the probe's failure modes, and a torch version that is not PEP 440.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

import releases
from conftest import (
    DOCLAYOUT_TARGET,
    ROOT,
    VLLM_TARGETS,
    InstalledEnv,
    fake_torch,
    files_under,
    install_release,
    require,
    run_cli,
)

pytestmark = pytest.mark.network

ROCM_TORCH = ("2.9.1+rocm6.4", "6.4.43482")


def _pyenv(version: str) -> Path | None:
    found = sorted(Path("/root/.pyenv/versions").glob(f"{version}.*/bin/python"))
    if found:
        return found[-1]
    on_path = shutil.which(f"python{version}")
    return Path(on_path) if on_path else None


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
    import subprocess

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
    require(python is not None, f"Python {version} is not installed")
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
    require(python is not None, "Python 3.8 is not installed")
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


def test_one_refused_patch_refuses_the_whole_run(
    vllm_env: Callable[..., InstalledEnv],
) -> None:
    env = vllm_env("0.11.0", torch="2.9.1+rocm6.4", hip="6.4.43482")
    # qwen2.5-vl's file becomes a patch embed rocmfix does not know (kernel != stride).
    other = env.site / VLLM_TARGETS[1]
    other.write_text((ROOT / "tests" / "golden" / "vllm_stride.py").read_text())
    before = files_under(env.root)
    verdicts = {p["id"]: p["verdict"] for p in env.cli("status", "--json").json()["patches"]}
    assert verdicts["vllm-qwen2-vl"] == "applicable" and verdicts["vllm-qwen3-vl"] == "applicable"
    # Edited since pip installed it: refused unless forced, and forced, its shape is unknown.
    assert verdicts["vllm-qwen2.5-vl"] == "changed"
    for forced in ((), ("--force",)):
        refused = env.cli("apply", *forced)
        assert refused.returncode == 1, forced
        assert "nothing was changed" in refused.stderr and "vllm-qwen2.5-vl" in refused.stderr
        # Forced, the rewrite finds no patch embed it knows in the edited file.
        assert ("cannot rewrite" in refused.stderr) == bool(forced), refused.stderr
        assert files_under(env.root) == before
    # Named alone, the others apply; repeated --only selects both.
    both = env.cli(
        "apply", "--scheme", "linear", "--only", "vllm-qwen2-vl", "--only", "vllm-qwen3-vl"
    )
    assert both.returncode == 0, both.stderr
    after = {p["id"]: p["verdict"] for p in env.cli("status", "--json").json()["patches"]}
    assert after["vllm-qwen2-vl"] == after["vllm-qwen3-vl"] == "applied"
    assert other.read_text() == (ROOT / "tests" / "golden" / "vllm_stride.py").read_text()


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
