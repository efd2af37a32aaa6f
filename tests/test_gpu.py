"""doctor, tune and the kernels' direct launches on a real GPU: the paths the CPU suite cannot
reach (CUDA-graph timing, the GPU's own arch in the tuned file, the ahead-of-time compile for
the device's arch, the compiled kernel's own launcher against Triton's launches).

They run where torch sees a GPU and skip elsewhere: CI has none by design. On the device:

    python -m pytest -n 0 tests/test_gpu.py    # -o addopts= where pytest-xdist is missing

(docs/performance-doctor.md records the run.)
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, load_template, run_cli

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU visible to torch")

# Undo conftest's NO_GPU for these runs only.
GPU = {k: os.environ.get(k, "") for k in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")}
GPU = {k: v for k, v in GPU.items() if v} or {"CUDA_VISIBLE_DEVICES": "0"}


def test_doctor_measures_checks_and_compiles_on_the_gpu(tmp_path: Path) -> None:
    env = {**GPU, "ROCMFIX_TUNED_FILE": str(tmp_path / "none.json")}
    result = run_cli("doctor", "--json", env=env, timeout=900)
    assert result.returncode == 0, result.stderr
    doc = result.json()
    device = doc["device"]
    assert device["kind"] == "gpu" and device["interpreter"] is False
    for op in doc["ops"]:
        for case in op["cases"]:
            assert case["native"]["status"] in ("ok", "timeout"), case["native"]
            for scheme in case["schemes"]:
                if scheme["status"] == "unavailable":
                    # A backend this stack lacks (vLLM's TRITON_ATTN without vllm, AOTriton's
                    # flag off ROCm) says why; every kernel rocmfix ships must run.
                    assert op["op"] == "vit-attention" and scheme["message"], scheme
                    continue
                assert scheme["status"] == "ok", (case["id"], scheme)
                assert scheme["ms"] > 0 and scheme["rel_err"] < scheme["tolerance"]
                if op["op"] != "vit-attention":  # attention is timed eagerly only
                    # The kernel alone, beside the eager time users get.
                    assert scheme["kernel_ms"] > 0, (case["id"], scheme)
                if scheme["compiled"] is not None:  # a Triton scheme: compiled for this GPU
                    compiled = scheme["compiled"]
                    assert compiled["arch"] == device["arch"]
                    assert compiled["registers"] > 0 and compiled["problems"] == []


def test_tune_screens_times_and_stores_for_this_gpu(tmp_path: Path) -> None:
    path = tmp_path / "tuned.json"
    env = {**GPU, "ROCMFIX_TUNED_FILE": str(path)}
    result = run_cli("tune", "--json", "--op", "patch-embed", "--budget", "120", env=env,
                     timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = result.json()
    kernel = doc["kernels"][0]
    assert kernel["status"] == "ok" and kernel["arch"] == doc["device"]["arch"]
    # Ranked by eager calls through the patched entry point, the kernel alone beside it.
    assert kernel["timing"] == "user"
    for candidate in kernel["candidates"]:
        assert candidate["compiled"]["arch"] == doc["device"]["arch"]
        if candidate["status"] == "rejected":
            assert candidate["ms"] is None
        if candidate["status"] == "ok":
            assert candidate["ms"] > 0 and candidate["kernel_ms"] > 0
    shipped = kernel["shipped"]
    # Back-to-back eager calls overlap host and GPU: never much under the kernel's own time.
    assert shipped["ms"] > 0.8 * shipped["kernel_ms"], shipped
    if kernel["tuned"]:
        assert kernel["verified"] is True
        stored = json.loads(path.read_text())
        assert doc["device"]["arch"] in stored["kernels"]["patch_embed_gemm"]


# ---------------------------------------------------------------------------- direct launches


class Counting:
    """A kernel that counts the launches made through ``kernel[grid]`` (Triton's own path)."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.runs = 0

    def __getitem__(self, grid: Any) -> Any:
        self.runs += 1
        return self.kernel[grid]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kernel, name)


def _count(launchers: Any) -> list[Any]:
    """Count, from now on, the Triton launches of every launcher not counted yet."""
    counted = []
    for launcher in launchers:
        if not isinstance(launcher.kernel, Counting):
            launcher.kernel = Counting(launcher.kernel)
            counted.append(launcher)
    return counted


def _gemm(tiles: str = "gfx942") -> Any:
    """The gemm template with the tiles of ``tiles``: gfx942's are the pointer kernel ROCm
    runs ("gfx942+persistent" walks the tiles with one program per SM); "shipped" is this
    GPU's own (the descriptor kernel on an H100/H200)."""
    module = load_template("patch_embed_gemm", interpret=False)
    if tiles == "shipped":
        return module
    arch, _, variant = tiles.partition("+")
    portable = module.CONFIG.shipped_config(arch, ("any", "f16"))
    if variant == "persistent":
        portable = {**portable, "persistent": True}
    os.environ[module.CONFIG_ENV] = json.dumps(portable)
    try:
        module._plan_for(torch.device("cuda", torch.cuda.current_device()), torch.bfloat16)
    finally:
        del os.environ[module.CONFIG_ENV]
    return module


@contextlib.contextmanager
def triton_only(module: Any) -> Iterator[None]:
    """Every launch through Triton's ``kernel[grid]`` while it holds (the launch path is
    one per process, shared by every import of the templates)."""
    module.rt._public_only.append(True)
    try:
        yield
    finally:
        module.rt._public_only.pop()


@pytest.mark.parametrize(
    ("tiles", "m"),
    [
        *(("gfx942", m) for m in (1, 7, 64, 1000, 5476)),
        *(("gfx942+persistent", m) for m in (7, 1000, 5476)),
        ("shipped", 7),
        ("shipped", 5476),
    ],
)
@pytest.mark.parametrize("misaligned", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_direct_launches_match_triton_launches(
    tiles: str, m: int, misaligned: bool, bias: bool
) -> None:
    """The cached launcher gives the bytes Triton's own launch gives, for every M and
    alignment, on every call after the first; a weight changed in place is read. The
    shipped tiles take the descriptor kernel where x is 16-byte aligned and has its
    tma_min_m rows (5476 here), the persistent pointer kernel otherwise."""
    direct, plain = _gemm(tiles), _gemm(tiles)
    counted: list[Any] = []
    gen = torch.Generator(device="cuda").manual_seed(m)
    weight = torch.randn(1280, 3, 2, 14, 14, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(1280, device="cuda", dtype=torch.bfloat16, generator=gen) if bias else None
    for step in range(4):
        buffer = torch.randn(m * 1176 + 1, device="cuda", dtype=torch.bfloat16, generator=gen)
        x = buffer[1 if misaligned else 0 :][: m * 1176].view(m, 3, 2, 14, 14)
        if step == 2:
            with torch.no_grad():
                weight.mul_(-0.5)
        got = direct.triton_conv3d_patchify(x, weight, b)
        counted += _count(call.launcher for call in direct._calls.values())
        with triton_only(plain):
            want = plain.triton_conv3d_patchify(x, weight, b)
        assert torch.equal(got, want), (m, misaligned, bias, step)
        # Both ran the same kernel: check that kernel against the vendor GEMM too.
        ref = torch.nn.functional.linear(
            x.flatten(1).float(), weight.flatten(1).float(), None if b is None else b.float()
        )
        assert float((got.float() - ref).norm() / ref.norm()) < 1e-2, (m, misaligned, bias)
    # One launch for every call: the first through kernel[grid], the rest direct.
    # (The weight update of step 2 keeps the key: the packed weight is read per call.)
    assert len(direct._calls) == 1 and len(counted) == 1
    assert all(c.kernel.runs == 0 and c.runner is not None for c in counted)


def test_direct_launches_pick_the_kernel_triton_picks() -> None:
    module = _gemm()
    weight = torch.randn(1280, 1176, device="cuda", dtype=torch.bfloat16)
    for m in (1, 16, 17, 5476):
        a = torch.randn(m, 1176, device="cuda", dtype=torch.bfloat16)
        module._cached_call(a, weight, None)
        module._cached_call(a, weight, None)
    plan = module._plan_for(a.device, a.dtype)
    for key, call in module._calls.items():
        launcher = call.launcher
        m = key[0][0][0]  # the layout key of x: its shape first
        a = torch.randn(m, 1176, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, 1280, device="cuda", dtype=torch.bfloat16)
        kernel, grid, args, kwargs = module.prepare_launch(a, module._packed_weight(weight), None,
                                                           out, plan)  # fmt: skip
        assert kernel[grid](*args, **kwargs) is launcher.compiled, m


@pytest.mark.parametrize("tiles", ["gfx942", "shipped"])
def test_direct_launches_replay_in_a_cuda_graph(tiles: str) -> None:
    module = _gemm(tiles)
    weight = torch.randn(1280, 3, 2, 14, 14, device="cuda", dtype=torch.bfloat16)
    # MinerU's page: the shipped tiles run the descriptor kernel there.
    x = torch.randn(5476, 3, 2, 14, 14, device="cuda", dtype=torch.bfloat16)
    module.triton_conv3d_patchify(x, weight)  # the first call compiles; the next are direct
    module.triton_conv3d_patchify(x, weight)
    (call,) = module._calls.values()
    hopper = torch.cuda.get_device_capability()[0] >= 9 and module._HAS_HOST_TMA
    want_tma = tiles == "shipped" and hopper and torch.version.hip is None
    assert (call.launcher.kernel is module._gemm_tma_kernel) == want_tma
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        out = module.triton_conv3d_patchify(x, weight)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    want = torch.nn.functional.linear(x.flatten(1).float(), weight.flatten(1).float())
    assert ((out.float() - want).abs().max() / want.abs().max()).item() < 1e-2


# Run in a fresh interpreter: conftest's TRITON_INTERPRET=1 default, read when triton is first
# imported, makes triton.language's helpers interpreted, and Inductor's own kernels then fail
# to compile in this process.
_COMPILED_EMBED = """
import json, sys
import torch
from torch._inductor.utils import run_and_get_code
from rocmfix.guest import templates

module = templates.load(sys.argv[1], "patch_embed_gemm", fresh=True)
if type(getattr(module.rop.rt.process_holder(), module.OP_NAME)).__name__ != "CustomOpDef":
    print(json.dumps({"skip": "this torch defines the opaque op"}))
    raise SystemExit
weight = torch.randn(1280, 3, 2, 14, 14, device="cuda", dtype=torch.bfloat16)
bias = torch.randn(1280, device="cuda", dtype=torch.bfloat16)

def embed(x):
    return module.triton_conv3d_patchify(x, weight, bias)

def want(x):
    return torch.nn.functional.linear(x.flatten(1).float(), weight.flatten(1).float(),
                                      bias.float())

def rel(a, b):
    return ((a.float() - b).norm() / b.norm()).item()

x = torch.randn(5476, 3, 2, 14, 14, device="cuda", dtype=torch.bfloat16)
out, code = run_and_get_code(torch.compile(embed, fullgraph=True), x)
source = "\\n".join(code)
graphed = torch.compile(embed, fullgraph=True, mode="reduce-overhead")
for _ in range(3):
    graphed(x)
fresh = torch.randn_like(x)
print(json.dumps({
    "kernel": "_gemm_ptr_kernel" in source, "op_call": "torch.ops.rocmfix." in source,
    "err": rel(out, want(x)), "replay_err": rel(graphed(fresh), want(fresh)),
    "fresh_vs_x": rel(want(fresh), want(x)),
}))
"""


def test_the_compiled_patch_embed_launches_its_kernel_from_inductors_code() -> None:
    """Graph mode (issue 33): compiled, the patch embed is a triton op whose pointer kernel
    Inductor launches from its own code, with no call back into rocmfix's op, and the compiled
    embed equals F.linear, in the default mode and captured (``reduce-overhead``) on a fresh
    input."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "0", **GPU, "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", _COMPILED_EMBED, str(ROOT / "templates")],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(got["skip"])
    assert got["kernel"] and not got["op_call"], got
    assert got["err"] < 1e-2 and got["replay_err"] < 1e-2, got
    assert got["fresh_vs_x"] > 0.5, got  # a stale replay would fail


def test_dilated_direct_launches_match_triton_launches() -> None:
    direct = load_template("dilated_conv_triton", interpret=False)
    plain = load_template("dilated_conv_triton", interpret=False)
    counted: list[Any] = []
    for c, k, d, h, w in ((96, 5, 2, 160, 116), (192, 3, 5, 80, 58), (96, 5, 3, 9, 7)):
        weight = torch.randn(c, c, k, k, device="cuda")
        for step in range(4):
            x = torch.randn(1, c, h, w, device="cuda")
            if step == 2:
                with torch.no_grad():
                    weight.mul_(-0.5)
            pad = d * (k - 1) // 2
            got = direct.dilated_conv2d(x, weight, d, pad)
            counted += _count(plan[0] for plan in direct._PLANS.values())
            with triton_only(plain):
                want = plain.dilated_conv2d(x, weight, d, pad)
            assert torch.equal(got, want), (c, k, d, step)
    # One plan a shape, made at its first call; every later call through the runner, the
    # weight's update (step 2) included: its packed copy is read per call.
    assert len(counted) == 3
    assert all(ln.kernel.runs == 0 and ln.runner is not None for ln in counted)


def test_dilated_bn_and_act_in_the_store_on_the_gpu() -> None:
    """The rewrite's call with the block's modules: the kernel's store applies the eval
    BatchNorm and SiLU, on the first and the cached launches, a CUDA-graph replay included."""
    module = load_template("dilated_conv_triton", interpret=False)
    for c, k, d, h, w in ((96, 5, 2, 160, 116), (192, 3, 5, 80, 58)):
        weight = torch.randn(c, c, k, k, device="cuda") / (c * k)
        bn = torch.nn.BatchNorm2d(c).cuda().eval()
        with torch.no_grad():
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 1.5)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
        act = torch.nn.SiLU()
        pad = d * (k - 1) // 2
        with torch.inference_mode():
            for _ in range(3):
                x = torch.randn(1, c, h, w, device="cuda")
                got = module.dilated_conv2d(x, weight, d, pad, bn=bn, act=act)
                want = act(bn(module.dilated_conv2d(x, weight, d, pad)))
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            graph = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), torch.cuda.graph(graph):
                out = module.dilated_conv2d(x, weight, d, pad, bn=bn, act=act)
            x.copy_(torch.randn_like(x))
            graph.replay()
            torch.cuda.synchronize()
            want = act(bn(module.dilated_conv2d(x, weight, d, pad)))
            torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
        assert {plan[0].kwargs["EPILOGUE"] for plan in module._PLANS.values()} == {0, 2}


def test_depthwise_repeat_calls_through_the_compiled_runner_match_the_stock_layer() -> None:
    """The depthwise entry's repeat calls on a real Triton go through the compiled kernel's
    ``[grid]`` runner, never ``kernel[grid]`` again, with the stock layer's result on every
    call, new inputs each, the fused BatchNorm and activation included."""
    module = load_template("depthwise_conv_triton", interpret=False)
    conv = torch.nn.Conv2d(64, 64, 5, 1, 2, groups=64, bias=False).cuda().eval()
    alone = torch.nn.Conv2d(64, 64, 3, 2, 1, groups=64, bias=True).cuda().eval()
    bn = torch.nn.BatchNorm2d(64).cuda().eval()
    with torch.no_grad():
        bn.running_var.uniform_(0.5, 1.5)
        bn.running_mean.normal_()
    act = torch.nn.Hardswish()
    counted: list[Any] = []
    with torch.inference_mode():
        for _ in range(4):
            x = torch.randn(2, 64, 30, 21, device="cuda")
            want = act(bn(conv(x)))
            torch.testing.assert_close(module.depthwise_conv2d(x, conv, bn, act), want)
            torch.testing.assert_close(module.depthwise_conv2d(x, alone), alone(x))
            counted += _count(plan[0] for plan in module._plans.values())
    # One plan a layer, made at its first call; every later call through the runner.
    assert len(module._plans) == 2 and len(counted) == 2
    assert all(ln.kernel.runs == 0 and ln.runner is not None for ln in counted)
