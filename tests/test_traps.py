"""The engine traps of a first run on ROCm (issue 42, item 3), each reproduced with real
packages or real files: released wheels installed with ``--no-deps`` (vllm's RECORD read from
its real wheel), a ROCm torch's version file, the environment variable set, a KFD topology in
the kernel's own format. And where each MinerU model runs (item 4), in ``status``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_terminal80 import at_terminal, fits

from rocmfix import checks, environment
from rocmfix import system as machine
from rocmfix.registry import all_patches

import releases
from conftest import InstalledEnv, fake_torch, run_cli

ROCM_TORCH = ("2.9.1+rocm6.4", "6.4.43482")


def _venv(tmp_path: Path, *wheels: tuple[str, str], torch: tuple[str, str] | None) -> InstalledEnv:
    python = releases.make_venv(tmp_path / "env")
    if wheels:
        releases.pip_install(python, *(releases.wheel(p, v) for p, v in wheels))
    site = releases.site_packages(python)
    if torch is not None:
        fake_torch(site, torch[0], hip=torch[1])
    return InstalledEnv(tmp_path, python, site, site, b"")


def _warnings(env: InstalledEnv) -> dict[str, dict[str, str]]:
    done = env.cli("status", "--json")
    assert done.returncode == 0, done.stderr
    return {w["code"]: w for w in done.json()["warnings"]}


def test_every_fix_fits_80_columns_under_its_indent() -> None:
    assert len({t.code for t in checks.TRAPS}) == len(checks.TRAPS)
    for trap in checks.TRAPS:
        assert 4 + len(trap.fix) <= 80, trap.fix


@pytest.mark.network
def test_a_cuda_vllm_beside_a_rocm_torch(tmp_path: Path) -> None:
    python = releases.make_venv(tmp_path / "env")
    site = releases.partial_install(python, "vllm", "0.19.1", ["vllm/__init__.py"])
    fake_torch(site, *ROCM_TORCH)
    env = InstalledEnv(tmp_path, python, site, site, b"")
    found = _warnings(env)
    cuda = found["vllm-cuda-build"]
    assert cuda["message"].startswith("vllm 0.19.1 is a CUDA build (its RECORD has vllm/_C")
    assert "torch 2.9.1+rocm6.4 (ROCm 6.4.43482)" in cuda["message"]
    # No amdsmi and no /dev/kfd here: vllm's ROCm platform would not resolve either.
    assert "amdsmi" in found["rocm-platform"]["message"]
    assert "no /dev/kfd" in found["no-gpu-device"]["message"]
    screen = at_terminal(80, "status", "--python", str(python))
    fits(screen, 80)
    for code in ("vllm-cuda-build", "rocm-platform", "no-gpu-device"):
        fix = next(t.fix for t in checks.TRAPS if t.code == code)
        assert f"    {fix}\n" in screen, screen
    # A ROCm build's RECORD lists vllm/_rocm_C: no trap. (One line added to the real RECORD.)
    record = next(site.glob("vllm-0.19.1.dist-info/RECORD"))
    record.write_text(record.read_text() + "vllm/_rocm_C.abi3.so,,\n")
    assert "vllm-cuda-build" not in _warnings(env)


@pytest.mark.network
def test_amdsmi_installed_resolves_the_platform(tmp_path: Path) -> None:
    env = _venv(tmp_path, ("amdsmi", "7.0.2"), torch=ROCM_TORCH)
    releases.partial_install(env.python, "vllm", "0.19.1", ["vllm/__init__.py"])
    assert "rocm-platform" not in _warnings(env)


@pytest.mark.network
@pytest.mark.parametrize("torch", [ROCM_TORCH, None])
def test_the_dlpack_extension_with_its_cuda_build(tmp_path: Path, torch: tuple[str, str]) -> None:
    env = _venv(tmp_path, ("torch-c-dlpack-ext", "0.1.5"), torch=torch)
    found = _warnings(env)
    if torch is None:
        assert "dlpack-cuda" not in found
        return
    said = found["dlpack-cuda"]["message"]
    assert said.startswith("torch-c-dlpack-ext 0.1.5 ships CUDA and CPU addons only (")
    assert "-cuda.so" in said
    assert found["dlpack-cuda"]["advice"] == "pip uninstall torch-c-dlpack-ext"


def _kfd(root: Path, *versions: int) -> Path:
    """A KFD topology as the kernel lays it out: node 0 the CPU, then one node a GPU."""
    for number, version in enumerate((0, *versions)):
        node = root / str(number)
        node.mkdir(parents=True)
        (node / "properties").write_text(
            f"cpu_cores_count {0 if version else 16}\nsimd_count {0 if not version else 80}\n"
            f"gfx_target_version {version}\nvendor_id {4098 if version else 0}\n"
        )
    return root


def _probed(monkeypatch: pytest.MonkeyPatch, kfd: Path) -> environment.Environment:
    monkeypatch.setitem(machine.REQUEST, "kfd", str(kfd))
    return environment.discover(all_patches())


@pytest.mark.parametrize(
    ("override", "gpu", "says"),
    [
        ("11.0.0", 110501, "runs gfx1100's kernels on a gfx1151, which ROCm supports natively"),
        ("11.0.0", 120001, "asks for gfx1100 on a gfx1201: across majors"),
        ("11.0.0", 110000, None),
        ("10.3.0", 100305, None),  # gfx1035 has no kernels of its own: what the override is for
        (None, 110501, None),
    ],
)
def test_the_gfx_override(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    override: str | None,
    gpu: int,
    says: str | None,
) -> None:
    if override is None:
        monkeypatch.delenv("HSA_OVERRIDE_GFX_VERSION", raising=False)
    else:
        monkeypatch.setenv("HSA_OVERRIDE_GFX_VERSION", override)
    env = _probed(monkeypatch, _kfd(tmp_path / "nodes", gpu))
    assert env.system.gfx == (machine.gfx_name(gpu),)
    found = {w.code: w for w in checks.environment_warnings(env)}
    if says is None:
        assert "gfx-override" not in found
        return
    assert says in found["gfx-override"].message
    assert found["gfx-override"].advice == "unset HSA_OVERRIDE_GFX_VERSION"


def test_no_gpu_seen_no_override_verdict(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HSA_OVERRIDE_GFX_VERSION", "11.0.0")
    env = _probed(monkeypatch, tmp_path / "no-such-folder")
    assert env.system.gfx == ()
    assert "gfx-override" not in {w.code for w in checks.environment_warnings(env)}


@pytest.mark.network
def test_turbomind_on_rocm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = _venv(tmp_path, ("mineru", "4.0.12"), torch=ROCM_TORCH)
    releases.partial_install(env.python, "lmdeploy", "0.18.0", [])
    found = environment.discover(all_patches(), str(env.python))
    assert found.mineru is not None and "turbomind" in found.mineru.found.strings
    # On Linux MinerU picks lmdeploy's pytorch backend on every ROCm GPU (capability >= 8).
    assert "turbomind-rocm" not in {w.code for w in checks.environment_warnings(found)}
    # The probe's platform as a Windows interpreter answers it; the rest is the real probe's.
    windows = dataclasses.replace(found, system=dataclasses.replace(found.system, platform="win32"))
    trap = {w.code: w for w in checks.environment_warnings(windows)}["turbomind-rocm"]
    assert trap.message.startswith("mineru 4.0.12 picks lmdeploy's turbomind on Windows")
    assert trap.advice == "set MINERU_LMDEPLOY_BACKEND=pytorch"
    chosen = dataclasses.replace(
        windows.system, env={**windows.system.env, "MINERU_LMDEPLOY_BACKEND": "pytorch"}
    )
    assert "turbomind-rocm" not in {
        w.code for w in checks.environment_warnings(dataclasses.replace(windows, system=chosen))
    }


ORT = {"onnxruntime": "1.32.0", "onnxruntime-migraphx": "1.27.1"}


@pytest.mark.network
@pytest.mark.parametrize("last", ["onnxruntime", "onnxruntime-migraphx"])
def test_which_onnxruntime_owns_the_folder(tmp_path: Path, last: str) -> None:
    first = next(name for name in ORT if name != last)
    env = _venv(tmp_path, ("mineru", "4.0.12"), (first, ORT[first]), torch=ROCM_TORCH)
    releases.pip_install(env.python, releases.wheel(last, ORT[last]))
    done = env.cli("status", "--json")
    assert done.returncode == 0, done.stderr
    doc = done.json()
    owner = doc["environment"]["onnxruntime"]
    assert owner["owner"] == last
    assert sorted(owner["claimants"]) == sorted(ORT)
    shadowed = {w["code"]: w for w in doc["warnings"]}["onnxruntime-shadowed"]
    assert f"its files are {last}'s" in shadowed["message"]
    tables = next(r for r in doc["runs"] if r["models"] == "tables")
    if last == "onnxruntime":
        said = "the CPU: onnxruntime/ holds onnxruntime 1.32.0, not onnxruntime-migraphx"
        assert tables["where"] == said
        assert tables["todo"] == "pip install --force-reinstall onnxruntime-migraphx"
    else:
        said = (
            "the CPU: MinerU never asks onnxruntime-migraphx 1.27.1 for MIGraphXExecutionProvider"
        )
        assert tables["where"] == said
        assert tables["todo"] == "rocmfix apply"
        applied = env.cli("apply")
        assert applied.returncode == 0, applied.stderr
        runs = env.cli("status", "--json").json()["runs"]
        tables = next(r for r in runs if r["models"] == "tables")
        assert tables["where"] == (
            "MIGraphXExecutionProvider (onnxruntime-migraphx 1.27.1); slanet-plus on the CPU"
        )
    screen = at_terminal(80, "status", "--python", str(env.python))
    fits(screen, 80)
    assert "Where MinerU 4.0.12 runs" in screen
    assert "    pip uninstall every onnxruntime build, then install the one you want\n" in screen


@pytest.mark.network
def test_where_minerus_models_run(tmp_path: Path) -> None:
    env = _venv(tmp_path, ("mineru", "4.0.12"), torch=ROCM_TORCH)
    releases.partial_install(env.python, "vllm", "0.19.1", ["vllm/__init__.py"])
    runs = {r["models"]: r for r in env.cli("status", "--json").json()["runs"]}
    small = runs["layout, OCR, formulas"]
    # MinerU 4 lists what its torch path needs (runtime/device.py); torchvision is not here.
    assert small["where"] == "ONNX on the CPU" and "torchvision" in small["todo"]
    assert runs["tables"]["where"] == "nowhere: onnxruntime is not installed"
    assert runs["VLM"]["where"] == "vllm 0.19.1 (MinerU's pick on a Linux GPU)"
    assert run_cli("status", "--python", str(env.python)).returncode == 0


def test_a_hostile_system_answer_gives_less_evidence_and_says_so() -> None:
    found, notes = machine.parse(
        {
            "platform": "linux\x1b]0;owned\x07",
            "env": {"HSA_OVERRIDE_GFX_VERSION": "11.0.0\n; rm -rf ~", "OK": "1"},
            "gfx": [110000, "gfx1100"],
            "devices": {"/dev/kfd": "yes"},
            "modules": {"amdsmi": True},
            "listings": {"vllm": "vllm/_C.abi3.so", "torch-c-dlpack-ext": ["a\x00b"]},
            "owners": {"onnxruntime": {"package_name": ["onnxruntime"], "__version__": "1"}},
        }
    )
    assert found.platform == "" and found.env == {"OK": "1"}
    assert found.gfx == () and found.devices == {} and found.modules == {"amdsmi": True}
    assert found.listings == {}
    assert found.onnxruntime is not None and found.onnxruntime.package is None
    said = " ".join(notes)
    parts = ("platform", "env", "gfx", "devices", "listings.vllm", "listings.torch-c-dlpack-ext")
    for part in parts:
        assert f"system.{part} was not" in said
    assert machine.parse("nonsense")[1] == ("the probe's system facts are not an object; ignored",)
