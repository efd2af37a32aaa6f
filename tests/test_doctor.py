"""``rocmfix doctor`` on a machine without a GPU, where CI runs: the kernels run in Triton's
CPU interpreter on small shapes, through the real CLI and the real worker subprocess.

What a CPU cannot show (a native op that blocks for seconds in MIOpen, a kernel that gives a
wrong answer, a worker that dies in a GPU library) is simulated through the worker's
test-only ``ROCMFIX_UNSAFE_TEST_HOOKS``. The verdict logic is tested on synthetic events.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from rocmfix import doctor, tuned_file, worker
from rocmfix.checks import EnvWarning
from rocmfix.environment import Environment, PythonInfo
from rocmfix.guest import protocol
from rocmfix.ops import OPS, PATCH_EMBED
from rocmfix.patch import TorchInfo
from rocmfix.registry import all_patches
from rocmfix.results import DoctorReport, PatchStatus, StatusReport, Verdict

import releases
from conftest import run_cli

HOOK = "ROCMFIX_UNSAFE_TEST_HOOKS"


def _by_impl(case: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["impl"]: m for m in [case["native"], *case["schemes"]]}


# What a CPU build of torch cannot run: vLLM's Triton kernel (no vLLM here), the AOTriton
# flag (ROCm torch's), SDPA's efficient kernel (CUDA and ROCm only).
ELSEWHERE = {("vit-attention", s) for s in ("triton-attn", "sdpa-aotriton", "sdpa-efficient")}


def test_json_report_without_a_gpu() -> None:
    result = run_cli("doctor", "--json", timeout=300)
    assert result.returncode == 0, result.stderr
    doc = result.json()
    assert doc["schema"] == "rocmfix-doctor/1"
    assert doc["tuned_archs"] == [] and doc["tuned_file"].endswith("rocmfix/tuned.json")
    assert doc["ok"] is True and doc["failures"] == []
    device = doc["device"]
    assert device["kind"] == "cpu" and device["interpreter"] is True and device["arch"] == "cpu"
    assert device["torch"] and device["triton"]
    assert {p["id"] for p in doc["patches"]} == {p.id for p in all_patches()}
    assert [op["op"] for op in doc["ops"]] == [op.name for op in OPS]
    embed, dilated = (next(o for o in doc["ops"] if o["op"] == name)
                      for name in ("patch-embed", "dilated-conv"))  # fmt: skip
    assert [c["id"] for c in embed["cases"]] == ["patch-embed"]
    assert [(c["shape"]["c"], c["shape"]["k"], c["shape"]["d"]) for c in dilated["cases"]] == [
        (8, 5, 1),
        (8, 5, 2),
        (8, 5, 3),
        (16, 3, 1),
        (16, 3, 3),
        (16, 3, 5),
    ]
    for each in OPS:
        cases = next(o for o in doc["ops"] if o["op"] == each.name)["cases"]
        assert [c["id"] for c in cases] == [c.id for c in each.cases]
        for case in cases:
            assert [m["impl"] for m in case["schemes"]] == list(each.scheme_names)
            for m in _by_impl(case).values():
                if (each.name, m["impl"]) in ELSEWHERE:
                    assert m["status"] == "unavailable", m
                    continue
                assert m["status"] == "ok", m
                assert m["rel_err"] is not None and m["first_ms"] > 0
                # Interpreted timings mean nothing, so no speed-up is claimed from them.
                assert m["speedup"] is None
            for m in case["schemes"]:
                if (each.name, m["impl"]) not in ELSEWHERE:
                    assert m["rel_err"] < m["tolerance"]
    gemm = _by_impl(embed["cases"][0])["gemm"]
    assert gemm["config"]["BLOCK_M"] > 0
    for op in doc["ops"]:
        assert op["needed"] is False and op["why"].startswith("not needed on this stack")
        assert "no GPU" in op["advice"]
    items = sum(len(op.cases) * (1 + len(op.schemes)) for op in OPS)
    assert f"doctor [{items}/{items}]" in result.stderr


def test_table_says_there_is_no_gpu(tmp_path: Path) -> None:
    tuned = tmp_path / "tuned.json"
    tuned.write_text('{"schema": 1, "kernels": {}}')
    result = run_cli("doctor", "--op", "dilated-conv", env={"ROCMFIX_TUNED_FILE": str(tuned)},
                     timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "no GPU visible to torch" in out and "Triton's CPU interpreter" in out
    assert f"{tuned} (not used without a GPU)" in out
    for text in (
        "act(bn(F.conv2d)) (CPU)",
        "gemm (Triton)",
        "linear (phase split)",
        "16ch 3x3 d=5",
    ):
        assert text in out
    assert "patch embed" not in out.split("Warnings")[0].split("dilated conv", 1)[1]
    assert "not needed on this stack" in out


def test_a_native_op_that_blocks_is_killed_at_the_time_limit(tmp_path: Path) -> None:
    pidfile = tmp_path / "blocked.pid"
    hooks = {"sleep": {"patch-embed/native": 300}, "pidfile": str(pidfile)}
    start = time.monotonic()
    result = run_cli(
        "doctor",
        "--json",
        "--op",
        "patch-embed",
        "--time-limit",
        "3",
        env={HOOK: json.dumps(hooks)},
        timeout=250,
    )
    elapsed = time.monotonic() - start
    assert result.returncode == 0, result.stderr
    assert elapsed < 120, f"doctor waited {elapsed:.0f} s for an op limited to 3 s"
    # The blocked worker was killed, not left sleeping behind a fresh one.
    pids = [int(line) for line in pidfile.read_text().split()]
    assert len(pids) == 1
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)
    case = result.json()["ops"][0]["cases"][0]
    native = case["native"]
    assert native["status"] == "timeout" and native["limit_s"] == 3
    assert native["ms"] is None
    # A fresh worker carried on with the schemes after the blocked one was killed.
    assert [m["status"] for m in case["schemes"]] == ["ok", "ok"]
    assert "no result within 3 s" in run_table(hooks)


def run_table(hooks: dict[str, Any]) -> str:
    result = run_cli(
        "doctor",
        "--op",
        "patch-embed",
        "--time-limit",
        "3",
        env={HOOK: json.dumps(hooks)},
        timeout=250,
    )
    return result.stdout


def test_a_wrong_or_crashing_kernel_fails_the_run() -> None:
    hooks = {"corrupt": ["patch-embed/gemm"], "crash": ["patch-embed/linear"]}
    result = run_cli(
        "doctor", "--json", "--op", "patch-embed", env={HOOK: json.dumps(hooks)}, timeout=300
    )
    assert result.returncode == 1
    doc = result.json()
    schemes = {m["impl"]: m for m in doc["ops"][0]["cases"][0]["schemes"]}
    assert schemes["gemm"]["status"] == "failed"
    assert schemes["gemm"]["rel_err"] > schemes["gemm"]["tolerance"]
    assert schemes["linear"]["status"] == "crashed"
    assert "exit status 70" in schemes["linear"]["message"]
    assert doc["ok"] is False
    assert set(doc["failures"]) == {"patch-embed gemm: failed", "patch-embed linear: crashed"}
    assert "failed patch-embed gemm: failed" in result.stderr


def test_a_target_without_torch_is_refused(tmp_path: Path) -> None:
    python = releases.make_venv(tmp_path / "bare")
    result = run_cli("doctor", "--python", str(python))
    assert result.returncode == 1
    assert "torch is not installed" in result.stderr
    tune = run_cli("tune", "--python", str(python))
    assert tune.returncode == 1 and "nothing to tune" in tune.stderr
    kernels = run_cli("kernels", "--python", str(python))
    assert kernels.returncode == 1 and "nothing to compile" in kernels.stderr


def test_usage_errors_exit_2() -> None:
    assert run_cli("doctor", "--op", "conv9d").returncode == 2
    assert run_cli("doctor", "--time-limit", "0").returncode == 2
    assert run_cli("doctor", "--bogus").returncode == 2


def test_a_corrupt_tuned_file_is_ignored_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "tuned.json"
    path.write_text("{not json")
    result = run_cli(
        "doctor", "--json", "--op", "patch-embed", env={"ROCMFIX_TUNED_FILE": str(path)}
    )
    assert result.returncode == 0, result.stderr
    doc = result.json()
    codes = {w["code"] for w in doc["warnings"]}
    assert "tuned-file-corrupt" in codes
    # The kernel itself said so too, and went on with its shipped config.
    kernel = [w["message"] for w in doc["warnings"] if w["code"] == "kernel-warning"]
    assert any(str(path) in message for message in kernel), doc["warnings"]
    assert all(m["status"] == "ok" for m in doc["ops"][0]["cases"][0]["schemes"])


# ------------------------------------------------------------------------- verdict logic


def _env(hip: str | None, cuda: str | None = None) -> Environment:
    return Environment(
        python=PythonInfo("/venv/bin/python", "3.12.3", Path("/venv"), None),
        distributions={},
        installed={},
        versions={"vllm": "0.11.0"},
        torch=TorchInfo("2.9.0", hip=hip, cuda=cuda),
        in_process=False,
    )


def _status(env: Environment, verdicts: dict[str, tuple[Verdict, str]]) -> StatusReport:
    patches = tuple(
        PatchStatus(
            patch=p,
            verdict=verdicts.get(p.id, (Verdict.NOT_INSTALLED, "not installed"))[0],
            reason=verdicts.get(p.id, (Verdict.NOT_INSTALLED, "not installed"))[1],
            version=None,
            path=None,
            scheme=None,
            editable=False,
            pristine=None,
        )
        for p in all_patches()
    )
    return StatusReport(environment=env, patches=patches, pending=None, busy=False)


def _run(items: dict[str, dict[str, Any]], kind: str = "gpu") -> worker.Answer:
    device = protocol.DeviceFacts(kind=kind, arch="gfx1100", torch="2.9.0")
    hello = protocol.Hello(pid=1, python="/usr/bin/python3", device=device)
    events = [protocol.Measured.parse({"id": key, **value}) for key, value in items.items()]
    return worker.Answer(hello=hello, events=(hello, *events))


def _embed(native: dict[str, Any], gemm_ms: float, linear_ms: float) -> dict[str, Any]:
    ok = {"status": "ok", "rel_err": 1e-3, "tolerance": 1e-2}
    return {
        "patch-embed/native": native,
        "patch-embed/gemm": {**ok, "ms": gemm_ms},
        "patch-embed/linear": {**ok, "ms": linear_ms},
    }


def _report(
    env: Environment, verdicts: dict[str, tuple[Verdict, str]], items: dict[str, Any]
) -> DoctorReport:
    return doctor.build_report(
        _status(env, verdicts),
        _run(items),
        ops=[PATCH_EMBED],
        time_limit=10.0,
        tuned_file="/nonexistent/tuned.json",
    )


def test_rocm_with_a_blocked_native_op_recommends_the_fastest_scheme() -> None:
    env = _env(hip="7.1")
    native = {"status": "timeout", "limit_s": 10.0}
    verdicts = {"vllm-qwen2-vl": (Verdict.APPLICABLE, "nn.Conv3d patch embed")}
    report = _report(env, verdicts, _embed(native, gemm_ms=0.05, linear_ms=0.04))
    op = report.ops[0]
    assert op.needed is True and op.why.startswith("needed: nn.Conv3d")
    assert "did not finish within 10 s" in op.why
    assert op.recommended == "linear" and op.speedup_at_least
    assert op.speedup == pytest.approx(10_000 / 0.04)
    assert "rocmfix apply --only vllm --scheme linear" in op.advice and "≥" in op.advice
    assert report.ok


def test_rocm_with_vllm_already_a_matmul_is_not_needed() -> None:
    env = _env(hip="7.1")
    reason = "Conv3dLayer runs a matmul in every mode here (torch 2.9.0 >= 2.9)"
    verdicts = {
        p.id: (Verdict.NOT_NEEDED, reason) for p in all_patches() if p.distribution == "vllm"
    }
    native = {"status": "ok", "ms": 0.2}
    op = _report(env, verdicts, _embed(native, gemm_ms=0.1, linear_ms=0.1)).ops[0]
    assert op.needed is False and "Conv3dLayer runs a matmul" in op.why
    assert "nothing to apply" in op.advice


def test_a_cuda_build_is_plainly_not_needed_and_a_slower_scheme_is_not_recommended() -> None:
    env = _env(hip=None, cuda="13.0")
    verdicts = {"vllm-qwen2-vl": (Verdict.APPLIED, "rocmfix rewrite (gemm) in place")}
    native = {"status": "ok", "ms": 0.04}
    op = _report(env, verdicts, _embed(native, gemm_ms=0.05, linear_ms=0.045)).ops[0]
    assert op.needed is False
    assert "CUDA 13.0 build" in op.why and "--force" in op.why
    assert "no scheme is worth a patch" in op.advice


def test_a_failed_kernel_is_not_recommended_and_fails_the_report() -> None:
    env = _env(hip="7.1")
    items = _embed({"status": "ok", "ms": 5.0}, gemm_ms=0.01, linear_ms=0.04)
    items["patch-embed/gemm"]["status"] = "failed"
    report = _report(env, {}, items)
    assert report.ops[0].recommended == "linear"
    assert not report.ok and report.failures == ("patch-embed gemm: failed",)


def test_tuned_file_warnings(tmp_path: Path) -> None:
    path = tmp_path / "tuned.json"
    assert tuned_file.file_warnings(tuned_file.read(path), "sm_90") == []
    path.write_text('{"schema": 2}')
    assert [w.code for w in tuned_file.file_warnings(tuned_file.read(path), "sm_90")] == [
        "tuned-file-corrupt"
    ]
    entry = {"BLOCK_M": 64}
    meta = {"gfx1100": {"torch": "2.9.0", "triton": "3.5.0"}}
    path.write_text(
        json.dumps({"schema": 1, "kernels": {"patch_embed_gemm": {"gfx1100": entry}}, "meta": meta})
    )
    foreign = tuned_file.file_warnings(tuned_file.read(path), "sm_90")
    assert [w.code for w in foreign] == ["tuned-file-foreign-arch"]
    assert "gfx1100" in foreign[0].message and "sm_90" in foreign[0].message
    same = tuned_file.file_warnings(tuned_file.read(path), "gfx1100", _Device("2.9.0", "3.5.0"))
    assert same == []
    stale = tuned_file.file_warnings(tuned_file.read(path), "gfx1100", _Device("2.9.0", "3.6.0"))
    assert [w.code for w in stale] == ["tuned-file-stale"]
    assert isinstance(stale[0], EnvWarning)


class _Device:
    def __init__(self, torch: str, triton: str) -> None:
        self.torch = torch
        self.triton = triton


def test_eager_and_kernel_times_side_by_side_and_launch_bound_marked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The advice follows the eager time (what MinerU gets), even where a scheme's kernel
    alone is faster: a launch-bound call is marked, and the JSON says so."""
    from rocmfix.render.doctor import doctor_document, doctor_table

    env = _env(hip="7.1")
    items = _embed({"status": "ok", "ms": 0.05, "kernel_ms": 0.045}, gemm_ms=0.04, linear_ms=0.06)
    items["patch-embed/gemm"]["kernel_ms"] = 0.01  # host-bound: 4x its kernel
    items["patch-embed/linear"]["kernel_ms"] = 0.055
    report = _report(env, {}, items)
    op = report.ops[0]
    assert op.recommended == "gemm"  # 40 us eager beats 60 us, whatever the kernels
    by_impl = {m.impl: m for m in (op.cases[0].native, *op.cases[0].schemes)}
    assert by_impl["gemm"].launch_bound and not by_impl["linear"].launch_bound
    assert not by_impl["native"].launch_bound
    doctor_table(report)
    text = capsys.readouterr().out
    assert "10.0 µs*" in text and "55.0 µs*" not in text and "* launch-bound" in text
    rows = doctor_document(report)["ops"][0]["cases"][0]
    gemm = next(m for m in rows["schemes"] if m["impl"] == "gemm")
    assert gemm["kernel_ms"] == 0.01 and gemm["launch_bound"] is True
    # The document's fields of a measurement (the event's case id and traceback are not).
    assert set(gemm) == {"impl", "status", "first_ms", "ms", "kernel_ms", "launch_bound",
                         "speedup", "rel_err", "tolerance", "config", "limit_s", "message",
                         "compiled"}  # fmt: skip
