"""The vision tower's attention (issue 42, item 1): doctor times each backend this stack has
at MinerU's shapes and stores each one's speed-up per arch and build; ``env`` exports the
AOTriton flag only where it measured faster. On a CPU the real worker runs SDPA's paths at
the interpreter's shapes; what a GPU decides is fed to the verdict logic as events."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rocmfix import doctor, measured, worker
from rocmfix.environment import Environment, PythonInfo
from rocmfix.guest import protocol
from rocmfix.ops import vit_attention
from rocmfix.patch import TorchInfo
from rocmfix.registry import all_patches
from rocmfix.results import PatchStatus, StatusReport, Verdict

import releases
from conftest import fake_torch, measured_vit, run_cli

OP = vit_attention.OP
FLAG = vit_attention.AOTRITON_ENV
TORCH, HIP = "2.9.1+rocm7.2", "7.2.26015-fc0010cf6a"
ON_GFX1100 = {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}


def test_shapes_are_the_towers_at_minerus_page_sizes() -> None:
    page, blocks = (case.gpu for case in OP.cases)
    # 1036 px / 14 px patches = 74 a side; head_dim 80 = 1280 / 16 heads.
    assert page["seqlens"] == [74 * 74] and (page["heads"], page["head_dim"]) == (16, 80)
    assert len(blocks["seqlens"]) == 5 and all(n % 4 == 0 for n in blocks["seqlens"])


def test_the_aotriton_scheme_runs_in_a_worker_of_its_own() -> None:
    items = doctor._items([OP])
    runs = doctor._runs([OP], items, {"PATH": "/bin", FLAG: "1"})
    assert len(runs) == 2
    (stock, plain), (flagged, aotriton) = runs
    # The user's own flag does not reach the stock measurement: that is what vLLM runs.
    assert FLAG not in stock and stock["PATH"] == "/bin"
    assert flagged[FLAG] == "1" and flagged["PATH"] == "/bin"
    assert {i.impl for i in aotriton} == {"sdpa-aotriton"}
    assert "sdpa-aotriton" not in {i.impl for i in plain} and len(plain) + len(aotriton) == len(
        items
    )


def test_doctor_runs_each_backend_on_a_cpu(tmp_path: Path) -> None:
    result = run_cli("doctor", "--json", "--op", OP.name, timeout=300)
    assert result.returncode == 0, result.stderr
    (op,) = result.json()["ops"]
    for case in op["cases"]:
        found = {m["impl"]: m for m in [case["native"], *case["schemes"]]}
        for impl in ("native", "sdpa-math", "sdpa-flash"):
            assert found[impl]["status"] == "ok", found[impl]
            assert found[impl]["rel_err"] < 1e-4
        # Measured in a worker started with the flag (it says so first when it was not).
        assert found["sdpa-aotriton"]["status"] == "unavailable"
        assert "not a ROCm build" in found["sdpa-aotriton"]["message"]
        assert found["triton-attn"]["status"] == "unavailable"  # no vLLM here
    # Nothing the interpreter timed is remembered.
    assert not (Path(os.environ["XDG_CONFIG_HOME"]) / "rocmfix" / "measured.json").exists()


def _env(hip: str | None) -> Environment:
    return Environment(
        python=PythonInfo("/venv/bin/python", "3.12.3", Path("/venv"), None),
        distributions={},
        installed={},
        versions={},
        torch=TorchInfo(TORCH, hip=hip, cuda=None),
        in_process=False,
    )


def _report(ms: dict[str, float | None]) -> doctor.DoctorReport:
    device = protocol.DeviceFacts(kind="gpu", arch="gfx1100", torch=TORCH, hip=HIP)
    hello = protocol.Hello(pid=1, python="/usr/bin/python3", device=device)
    events: list[protocol.AnyEvent] = [hello]
    for case in OP.cases:
        for impl, each in ms.items():
            item: dict[str, Any] = {"id": protocol.item_id(case.id, impl), "status": "ok"}
            if each is None:
                item = {**item, "status": "unavailable", "message": "not here"}
            else:
                item = {**item, "ms": each, "rel_err": 1e-3, "tolerance": 2e-2}
            events.append(protocol.Measured.parse(item))
    patch = next(p for p in all_patches() if p.id == "mineru-vit-attention")
    seen = PatchStatus(patch, Verdict.APPLICABLE, "TORCH_SDPA", None, None, None, False, None)
    status = StatusReport(environment=_env(HIP), patches=(seen,), pending=None, busy=False)
    answer = worker.Answer(hello=hello, events=tuple(events))
    return doctor.build_report(status, answer, ops=[OP], time_limit=10, tuned_file="/none.json")


# Times in ms per call: SDPA's math path as RDNA runs it without the flag, AOTriton's flash
# kernel with it, vLLM's Triton kernel (the ratios of unsloth#8821 and vllm#32944).
RDNA = {
    "native": 40.0,
    "triton-attn": 8.0,
    "sdpa-aotriton": 10.0,
    "sdpa-flash": None,
    "sdpa-efficient": None,
    "sdpa-math": 40.0,
}


def test_each_schemes_speedup_is_stored_and_read_per_scheme(tmp_path: Path) -> None:
    report = _report(RDNA)
    (op,) = report.ops
    assert op.recommended == "triton-attn" and op.speedup == pytest.approx(5.0)
    assert op.needed is True and op.patches[0].patch.realizes == "triton-attn"
    assert op.advice.endswith("5.0x faster than vLLM's TORCH_SDPA here; "
                              "`rocmfix apply --only mineru-vit-attention`")  # fmt: skip
    file = tmp_path / "measured.json"
    assert doctor.remember(report, file) == file
    stored = json.loads(file.read_text())["ops"][OP.name]
    (entry,) = stored.values()
    assert entry["speedups"] == {"triton-attn": 5.0, "sdpa-aotriton": 4.0, "sdpa-math": 1.0}
    torch = TorchInfo(TORCH, HIP, None)

    def read(scheme: str | None, archs: frozenset[str] = frozenset({"gfx1100"})) -> Any:
        return measured.reading(OP, torch, file, archs, scheme=scheme)

    assert read("sdpa-aotriton").faster is True
    assert read("sdpa-aotriton").reason.startswith("sdpa-aotriton measured 4.0x faster on gfx1100")
    assert read("sdpa-math").faster is False
    assert read("sdpa-flash").faster is None  # it never ran correctly here
    assert read("triton-attn", frozenset({"gfx942"})).faster is None  # another GPU's result


def test_a_malformed_per_scheme_entry_reads_as_no_measurement(tmp_path: Path) -> None:
    file = tmp_path / "measured.json"
    entry = {"arch": "gfx1100", "torch": TORCH, "hip": HIP, "scheme": "triton-attn",
             "speedup": 5.0, "measured_at": "2026-11-27"}  # fmt: skip
    for bad in ({"sdpa-aotriton": "fast"}, {"sdpa-aotriton": float("inf")}, ["x"], {"a b": 2.0}):
        raw = {"schema": 1, "ops": {OP.name: {"k": {**entry, "speedups": bad}}}}
        file.write_text(json.dumps(raw))
        assert measured.read(file) == (), bad
    file.write_text(json.dumps({"schema": 1, "ops": {OP.name: {"k": entry}}}))
    (m,) = measured.read(file)
    assert m.of("triton-attn") == 5.0 and m.of("sdpa-aotriton") is None


def _rocm_venv(tmp_path: Path, torch: str = TORCH, hip: str | None = HIP) -> Path:
    python = releases.make_venv(tmp_path / "venv")
    fake_torch(releases.site_packages(python), torch, hip=hip)
    return python


def _store(speedups: dict[str, float]) -> None:
    measured_vit(TORCH, HIP, speedups)


def _exported(script: str) -> str:
    shown = subprocess.run(
        ["bash", "-c", f'eval "$1"; printf %s "${FLAG}"', "bash", script],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != FLAG},
    )
    return shown.stdout


def test_env_exports_the_flag_only_where_it_measured_faster(tmp_path: Path) -> None:
    python = _rocm_venv(tmp_path)
    out = run_cli("env", "--python", str(python), env=ON_GFX1100)
    assert out.returncode == 0, out.stderr
    assert _exported(out.stdout) == ""
    assert f"# not exported: {FLAG}: whether" in out.stdout
    assert "rocmfix doctor --op vit-attention" in out.stdout

    _store({"triton-attn": 5.0, "sdpa-aotriton": 1.02})
    out = run_cli("env", "--python", str(python), env=ON_GFX1100)
    assert _exported(out.stdout) == ""
    assert "sdpa-aotriton measured no faster here (1.02x on gfx1100" in out.stdout

    _store({"triton-attn": 5.0, "sdpa-aotriton": 4.0})
    out = run_cli("env", "--python", str(python), env=ON_GFX1100)
    assert _exported(out.stdout) == "1"
    assert "sdpa-aotriton measured 4.0x faster on gfx1100, ROCm 7.2" in out.stdout
    # Another GPU in the same home folder: that result says nothing here.
    out = run_cli("env", "--python", str(python), env={"HSA_OVERRIDE_GFX_VERSION": "12.0.1"})
    assert _exported(out.stdout) == ""
    assert "not measured on this GPU (gfx1201)" in out.stdout


def test_profile_names_the_towers_attention_its_kernel_and_the_patch() -> None:
    from rocmfix.profile import analyse
    from rocmfix.profile.model import OpStat

    patches = all_patches()
    sdpa = {"name": "aten::scaled_dot_product_attention", "shapes": [[1, 16, 5476, 80]] * 3}
    wrapper = "vllm/v1/attention/ops/vit_attn_wrappers.py:202 apply_sdpa"
    patch, routed = analyse.patch_for(sdpa, wrapper, patches)
    assert patch is not None and patch.id == "mineru-vit-attention" and not routed
    # SDPA called from anywhere else (a text model, the user's code) is no tower's.
    elsewhere = "transformers/integrations/sdpa_attention.py:96 sdpa_attention_forward"
    assert analyse.patch_for(sdpa, elsewhere, patches) == (None, False)

    row = OpStat(key="k", op="scaled_dot_product_attention", shapes=((1, 16, 5476, 80),) * 3,
                 dtypes=("bfloat16",), layout="contiguous", conv=None, calls=32, total_ms=900.0,
                 first_ms=40.0, steady_ms=28.0, share=0.6, flops=None, bytes=None, tflops=None,
                 gbps=None, roofline=None, modules=(), source=wrapper, kernels=(),
                 pids=(1,))  # fmt: skip
    math = ("aten::_scaled_dot_product_attention_math",)
    found = analyse.verdict(row, None, patch, False, "cuda", True, {}, total_ms=1500.0,
                            callees=math)  # fmt: skip
    assert found["flagged"]
    assert found["reason"] == "vision attention: vLLM's TORCH_SDPA ran SDPA's math kernel"
    fix = found["fix"]
    assert (fix.kind, fix.patch_id) == ("patch", "mineru-vit-attention")
    assert fix.command == (
        "rocmfix doctor --op vit-attention && rocmfix apply --only mineru-vit-attention"
    )
    # The same call elsewhere keeps the flag's fix; a fused kernel is nothing to fix.
    other = analyse.verdict(row, None, None, False, "cuda", True, {}, total_ms=1500.0,
                            callees=math)  # fmt: skip
    assert other["fix"].command == 'eval "$(rocmfix env)"'
    flash = ("aten::_scaled_dot_product_flash_attention",)
    assert not analyse.verdict(row, None, patch, False, "cuda", True, {}, total_ms=1500.0,
                               callees=flash)["flagged"]  # fmt: skip
