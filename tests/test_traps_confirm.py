"""``doctor`` confirming the engine traps ``status`` found (issue 42, item 3): each row's
:class:`rocmfix.checks.Confirm` run in the target interpreter, in a child of its own, from
``/``, bounded in time; each trap shown as confirmed, not confirmed or not checkable with one
line of evidence, at 80 columns. Real children throughout, and real released wheels."""

from __future__ import annotations

import dataclasses
import io
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console
from test_traps import ROCM_TORCH

from rocmfix import checks, doctor, environment
from rocmfix.ops import vit_attention
from rocmfix.registry import all_patches
from rocmfix.render.console import warnings_block
from rocmfix.render.status import warning_json
from rocmfix.write import commands as write

import releases
from conftest import fake_torch


def _ran(code: str, limit_s: float = 30.0) -> tuple[bool, str]:
    return doctor._run_confirm(sys.executable, checks.Confirm(code, "", ""), limit_s)


def test_the_child_runs_from_root_and_answers_one_line() -> None:
    assert _ran("import os\nprint('first')\nprint(os.getcwd())") == (True, "/")
    # What the code prints reaches the report as text, never as a control sequence.
    assert _ran("print('\\x1b]0;owned\\x07 said')") == (True, "?]0;owned? said")


def test_an_import_that_aborts_kills_only_its_child() -> None:
    assert _ran("import os\nos.abort()") == (True, "died of SIGABRT")


def test_an_exception_is_evidence_a_missing_package_is_not() -> None:
    assert _ran("raise OSError('libc10_cuda.so: cannot open')") == (
        True,
        "raised OSError: libc10_cuda.so: cannot open",
    )
    answered, line = _ran("import no_such_package_here")
    assert not answered
    assert line == "cannot run: ModuleNotFoundError: No module named 'no_such_package_here'"


def test_a_confirmation_that_hangs_is_cut_off() -> None:
    assert _ran("import time\ntime.sleep(60)", limit_s=1) == (False, "no answer within 1 s")


@pytest.mark.parametrize(
    ("answered", "line", "state"),
    [
        (True, "vllm's platform resolves to UnspecifiedPlatform (device type '')", "confirmed"),
        (True, "vllm's platform resolves to RocmPlatform (device type 'cuda')", "not confirmed"),
        (True, "raised RuntimeError: amdsmi_init failed", "not checkable"),
        (False, "no answer within 60 s", "not checkable"),
    ],
)
def test_the_platform_row_judges_its_line(answered: bool, line: str, state: str) -> None:
    assert checks.VLLM_PLATFORM.judge(answered, line) == (state, line)


def _rocm_env(
    tmp_path: Path, cuda: bool, *wheels: tuple[str, str], metadata: tuple[str, str] | None = None
) -> environment.Environment:
    """Real released wheels beside a stand-in for a ROCm torch: its version and build in the
    metadata the probe reads, and the three names the code under test asks of torch
    (``torch.cuda.is_available()`` answers as a ROCm torch does on a GPU, or without one)."""
    python = releases.make_venv(tmp_path / "env")
    releases.pip_install(python, *(releases.wheel(p, v) for p, v in wheels))
    if metadata is not None:  # a huge wheel's METADATA and RECORD only
        releases.partial_install(python, *metadata, [])
    site = releases.site_packages(python)
    fake_torch(site, *ROCM_TORCH)
    (site / "torch" / "__init__.py").write_text(
        f"__version__ = {ROCM_TORCH[0]!r}\n"
        "class Tensor:\n    pass\n"
        f"class cuda:\n    is_available = staticmethod(lambda: {cuda})\n"
    )
    return environment.discover(all_patches(), str(python))


@pytest.mark.network
@pytest.mark.parametrize("cuda", [True, False])
def test_the_dlpack_extension_loading_its_cuda_addon(tmp_path: Path, cuda: bool) -> None:
    env = _rocm_env(tmp_path, cuda, ("torch-c-dlpack-ext", "0.1.5"), ("packaging", "24.2"))
    found = checks.environment_warnings(env)
    assert "dlpack-cuda" in {w.code for w in found}
    confirmed = {w.code: w for w in doctor.confirm_traps(env, found)}
    state, evidence = confirmed["dlpack-cuda"].confirmed or ("", "")
    if cuda:
        # The extension's own loader picks the addon built for CUDA, which cannot load here.
        assert state == "confirmed"
        assert evidence.startswith("torch_c_dlpack_ext picks its CUDA addon: OSError: ")
    else:
        assert state == "not confirmed"
        assert evidence.startswith("torch_c_dlpack_ext picks its CPU addon")
    # Warnings that are not traps pass through as status gave them.
    assert all(w.confirmed is None for w in confirmed.values() if w.code not in doctor._CONFIRMS)


@pytest.mark.network
@pytest.mark.parametrize("cuda", [True, False])
def test_turbomind_follows_what_torch_says_of_cuda(tmp_path: Path, cuda: bool) -> None:
    env = _rocm_env(tmp_path, cuda, ("mineru", "4.0.12"), metadata=("lmdeploy", "0.18.0"))
    # The probe's platform as a Windows interpreter answers it (MinerU picks turbomind there
    # whenever torch.cuda.is_available()); the confirmation runs in the real interpreter.
    windows = dataclasses.replace(env, system=dataclasses.replace(env.system, platform="win32"))
    found = doctor.confirm_traps(windows, checks.environment_warnings(windows))
    seen = {w.code: w.confirmed for w in found}["turbomind-rocm"]
    said = f"torch.cuda.is_available() is {cuda}"
    assert seen == ("confirmed" if cuda else "not confirmed", said)


@pytest.mark.network
def test_the_vllm_traps_share_one_run_and_say_why_it_could_not_check(tmp_path: Path) -> None:
    python = releases.make_venv(tmp_path / "env")
    site = releases.partial_install(python, "vllm", "0.19.1", ["vllm/__init__.py"])
    fake_torch(site, *ROCM_TORCH)
    env = environment.discover(all_patches(), str(python))
    found = doctor.confirm_traps(env, checks.environment_warnings(env))
    seen = {w.code: w.confirmed for w in found if w.confirmed is not None}
    # Only vllm/__init__.py of the real wheel is here: its import stops at the first module
    # the partial install left out, and doctor says so instead of guessing.
    said = ("not checkable", "cannot run: ModuleNotFoundError: No module named 'vllm.version'")
    assert seen == {code: said for code in ("vllm-cuda-build", "rocm-platform", "no-gpu-device")}


def test_every_trap_reads_at_80_columns() -> None:
    """Each row as doctor shows it, with the longest evidence each state gives, wrapped
    inside 80 columns with its fix whole on one line."""
    warnings = [
        checks.EnvWarning(
            trap.code,
            f"what the metadata showed for {trap.code}",
            trap.fix,
            ("not checkable", "no answer within 60 s")
            if trap.confirm is None
            else trap.confirm.judge(True, "died of SIGABRT"),
        )
        for trap in checks.TRAPS
    ]
    buffer = io.StringIO()
    console = Console(file=buffer, width=80, force_terminal=True, color_system=None)
    warnings_block(console, warnings)
    screen = buffer.getvalue()
    assert max(len(line) for line in screen.splitlines()) <= 80, screen
    for trap in checks.TRAPS:
        assert f"\n    {trap.fix}\n" in screen
    assert "    doctor: confirmed: died of SIGABRT\n" in screen
    assert warning_json(warnings[0])["doctor"] == {
        "state": "not checkable",
        "evidence": "died of SIGABRT",
    }


def test_doctor_runs_the_confirmations_before_it_measures() -> None:
    """``rocmfix doctor``'s engine on this CPU, its real worker and all: a trap status found
    (here handed in: this machine's torch is not a ROCm build) comes back confirmed or not."""
    env = environment.discover(all_patches())
    status = write.status(env, all_patches())
    trap = checks.EnvWarning("dlpack-cuda", "what the metadata showed", "pip uninstall it")
    status = dataclasses.replace(status, warnings=(*status.warnings, trap))
    report = doctor.run(status, ops=[vit_attention.OP])
    said = {w.code: w.confirmed for w in report.warnings}
    missing = "cannot run: ModuleNotFoundError: No module named 'torch_c_dlpack_ext'"
    assert said["dlpack-cuda"] == ("not checkable", missing)
    assert {op.op.name for op in report.ops} == {"vit-attention"}


# What ``from vllm.platforms import current_platform`` imports of vllm 0.19.1 (the rest of
# the 400 MB wheel stays on PyPI).
PLATFORM_CHAIN = [
    f"vllm/{name}.py"
    for name in (
        "__init__", "_version", "version", "env_override", "envs", "logger",
        "logging_utils/__init__", "logging_utils/access_log_filter", "logging_utils/formatter",
        "logging_utils/lazy", "logging_utils/log_time", "platforms/__init__",
        "platforms/interface", "plugins/__init__", "utils/__init__", "utils/import_utils",
        "utils/torch_utils", "v1/__init__", "v1/attention/__init__",
        "v1/attention/backends/__init__", "v1/attention/backends/registry",
    )
]  # fmt: skip


@pytest.mark.network
def test_vllms_own_platform_code_does_not_resolve_to_rocm_here(tmp_path: Path) -> None:
    """vllm 0.19.1's real platform code over a real torch (this CPU build: the test runner's,
    seen through a .pth), with no amdsmi and no pynvml: vllm resolves no platform, the state
    that ends in 'Device string must not be empty' (MinerU#4655)."""
    python = releases.make_venv(tmp_path / "env")
    site = releases.partial_install(python, "vllm", "0.19.1", PLATFORM_CHAIN)
    (site / "runner.pth").write_text(str(Path(torch.__file__).parents[1]) + "\n")
    env = environment.discover(all_patches(), str(python))
    trap = checks.EnvWarning("rocm-platform", "what the metadata showed", "install amdsmi")
    (seen,) = doctor.confirm_traps(env, [trap])
    said = "vllm's platform resolves to UnspecifiedPlatform (device type '')"
    assert seen.confirmed == ("confirmed", said)
