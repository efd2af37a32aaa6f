"""CPU tests of the dilated-conv templates (templates/dilated_conv_triton.py, _phase.py).

The Triton kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1 while the template is
imported).  The interpreter costs ~3 ms of Python per loop step and program, so shapes are tiny
and BLOCK_M large enough that most cases are one or two programs.
"""

from __future__ import annotations

import itertools
import json
import warnings
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import load_template, require

# Small tiles so several programs and channel blocks run even on tiny shapes.
TEST_CFG = {"BLOCK_M": 64, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 4, "num_stages": 1}


pytestmark = pytest.mark.usefixtures("no_kernel_config")


@pytest.fixture(scope="module")
def tri() -> ModuleType:
    pytest.importorskip("triton")
    mod = load_template("dilated_conv_triton", interpret=True)
    assert mod.INTERPRETING, "the template did not pick up TRITON_INTERPRET=1"
    return mod


@pytest.fixture(scope="module")
def tri_jit() -> ModuleType:
    pytest.importorskip("triton")
    mod = load_template("dilated_conv_triton", interpret=False)
    assert not mod.INTERPRETING
    return mod


@pytest.fixture(scope="module")
def phase() -> ModuleType:
    return load_template("dilated_conv_phase", interpret=None)


def _ref(x: torch.Tensor, w: torch.Tensor, d: int, p: int | tuple[int, int]) -> torch.Tensor:
    return F.conv2d(x.double(), w.double(), None, 1, p, d)


def _run_poisoned(
    mod: ModuleType, x: torch.Tensor, w: torch.Tensor, d: int, p: int, cfg: dict
) -> torch.Tensor:
    """Launch into a NaN-filled output, so any element the kernel skips fails the comparison."""
    full = mod.resolve_config("cpu", x.shape[1], w.shape[0], w.shape[-1], x.dtype)
    full.update(cfg)
    kh, kw = w.shape[-2:]
    oh, ow = x.shape[2] + 2 * p - d * (kh - 1), x.shape[3] + 2 * p - d * (kw - 1)
    out = torch.full((x.shape[0], w.shape[0], oh, ow), float("nan"), dtype=x.dtype)
    kernel, grid, args, kwargs, out = mod.dk.prepare_launch(x, w, d, p, full, out=out)
    kernel[grid](*args, **kwargs)
    return out


def _check(y: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert y.shape == ref.shape
    assert y.dtype == dtype
    assert torch.isfinite(y).all(), "unwritten (NaN-poisoned) or non-finite outputs"
    scale = ref.abs().max().item()
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol * scale)


# Grid: every kernel size, dilation, dtype and batch; H x W, C and C_out rotate so odd sizes,
# C < 16, C not a multiple of BLOCK_K (20 with BLOCK_K 16) and C_out != C all appear.
_SIZES = [(7, 9), (13, 5), (9, 14)]
_CHANS = [(3, 8), (8, 8), (20, 12)]
_GRID = [
    (k, d, dt, n, _SIZES[i % 3], _CHANS[(i // 3) % 3], (i // 2) % 2)
    for i, (k, d, dt, n) in enumerate(
        itertools.product((3, 5), (1, 2, 3, 4, 5), (torch.float32, torch.float16), (1, 2))
    )
]


def _ids(case: tuple) -> str:
    k, d, dt, n, (h, w), (c, co), nhwc = case
    return f"k{k}-d{d}-{str(dt)[6:]}-n{n}-{h}x{w}-c{c}to{co}-{'nhwc' if nhwc else 'strided'}"


@pytest.mark.parametrize("case", _GRID, ids=_ids)
def test_triton_gemm_matches_conv2d(tri: ModuleType, case: tuple) -> None:
    k, d, dt, n, (h, w), (c, co), nhwc = case
    p = d * (k // 2)
    if h + 2 * p - d * (k - 1) < 1 or w + 2 * p - d * (k - 1) < 1:
        pytest.skip("empty output")
    x = torch.randn(n, c, h, w).to(dt)
    wt = torch.randn(co, c, k, k).to(dt)
    y = _run_poisoned(tri, x, wt, d, p, {**TEST_CFG, "nhwc": nhwc})
    _check(y, _ref(x, wt, d, p), dt)


# The tensor-descriptor (TMA) route: one program per output row, so few and tiny cases.  C=6
# in fp32 breaks the 16-byte stride rule and must fall back to the pointer kernel.
@pytest.mark.parametrize(
    ("k", "d", "dt", "c"),
    [
        (3, 2, torch.float32, 8),
        (5, 1, torch.float16, 8),
        (3, 5, torch.float32, 12),
        (3, 3, torch.float32, 6),
    ],
)
def test_triton_tma_route(tri: ModuleType, k: int, d: int, dt: torch.dtype, c: int) -> None:
    x = torch.randn(2, c, 5, 9).to(dt)
    wt = torch.randn(16, c, k, k).to(dt)
    cfg = {**TEST_CFG, "BLOCK_M": 16, "tma": 1}
    full = {**tri.resolve_config("cpu", c, 16, k, dt), **cfg}
    kind = tri.dk.prepare_launch(x, wt, d, d * (k // 2), full)[3]["KIND"]
    assert (kind == "tma") == (c * x.element_size() % 16 == 0)
    y = _run_poisoned(tri, x, wt, d, d * (k // 2), cfg)
    _check(y, _ref(x, wt, d, d * (k // 2)), dt)


@pytest.mark.parametrize("taps_inner", [0, 1])
@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
def test_triton_public_function(tri: ModuleType, dt: torch.dtype, taps_inner: int) -> None:
    # bf16 goes through the interpreter-only upcast; taps_inner flips the loop order.
    x = torch.randn(2, 12, 9, 7).to(dt)
    wt = torch.randn(8, 12, 3, 3).to(dt)
    y = tri.dilated_conv2d(x, wt, 3, 3, config={**TEST_CFG, "taps_inner": taps_inner})
    _check(y, _ref(x, wt, 3, 3), dt)
    assert y.is_contiguous()


@pytest.mark.parametrize("nhwc", [0, 1])
@pytest.mark.parametrize("layout", ["channel_slice", "channels_last", "w_strided", "batch_slice"])
def test_triton_non_contiguous_input(tri: ModuleType, layout: str, nhwc: int) -> None:
    c, k, d = 10, 5, 2
    if layout == "channel_slice":
        x = torch.randn(2, c + 7, 11, 6)[:, 4 : 4 + c]
    elif layout == "channels_last":
        x = torch.randn(2, c, 11, 6).to(memory_format=torch.channels_last)
    elif layout == "w_strided":
        x = torch.randn(2, c, 11, 12)[..., ::2]
    else:
        x = torch.randn(5, c, 11, 6)[1:5:2]
    assert not x.is_contiguous()
    wt = torch.randn(c, c, k, k)
    y = _run_poisoned(tri, x, wt, d, d * (k // 2), {**TEST_CFG, "nhwc": nhwc})
    _check(y, _ref(x, wt, d, d * (k // 2)), torch.float32)


@pytest.mark.parametrize("padding", [0, 1, (3, 0)])
def test_triton_other_padding(tri: ModuleType, padding: int | tuple[int, int]) -> None:
    x = torch.randn(1, 6, 13, 11)
    wt = torch.randn(6, 6, 3, 3)
    y = tri.dilated_conv2d(x, wt, 4, padding, config=TEST_CFG)
    _check(y, _ref(x, wt, 4, padding), torch.float32)


def test_triton_batch_zero_and_cpu_without_interpreter(
    tri: ModuleType, tri_jit: ModuleType
) -> None:
    wt = torch.randn(4, 3, 3, 3)
    assert tri.dilated_conv2d(torch.randn(0, 3, 5, 5), wt, 2, 2).shape == (0, 4, 5, 5)
    # Without the interpreter, CPU tensors take F.conv2d (which keeps autograd).
    x = torch.randn(1, 3, 8, 6, requires_grad=True)
    y = tri_jit.dilated_conv2d(x, wt, 2, 2)
    torch.testing.assert_close(y, F.conv2d(x, wt, None, 1, 2, 2))
    y.sum().backward()


def test_grad_enabled_raises(tri: ModuleType) -> None:
    x = torch.randn(1, 4, 6, 6)
    w = torch.nn.Parameter(torch.randn(4, 4, 3, 3))
    with pytest.raises(RuntimeError, match=r"no backward pass.*torch\.no_grad\(\)"):
        tri.dilated_conv2d(x, w, 2, 2, config=TEST_CFG)
    with pytest.raises(RuntimeError, match="no backward pass"):
        tri.dilated_conv2d(x.requires_grad_(), w.detach(), 2, 2, config=TEST_CFG)
    ref = _ref(x.detach(), w.detach(), 2, 2)
    with torch.no_grad():
        _check(tri.dilated_conv2d(x, w, 2, 2, config=TEST_CFG), ref, torch.float32)
    with torch.inference_mode():
        _check(tri.dilated_conv2d(x, w, 2, 2, config=TEST_CFG), ref, torch.float32)


def test_weight_pack_cache_sees_in_place_updates(tri: ModuleType) -> None:
    x = torch.randn(1, 4, 6, 7)
    w = torch.nn.Parameter(torch.randn(4, 4, 3, 3))
    with torch.no_grad():
        tri.dilated_conv2d(x, w, 2, 2, config=TEST_CFG)
        w.mul_(-2.0)  # bumps the version counter: the cached pack must not be reused
        y = tri.dilated_conv2d(x, w, 2, 2, config=TEST_CFG)
    _check(y, _ref(x, w.detach(), 2, 2), torch.float32)


def test_triton_plan_cache(tri: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    # Calls without an explicit config reuse a cached launch plan: it must stay right for
    # fresh inputs, react to in-place weight updates and to a new shape or config.
    monkeypatch.setenv("ROCMFIX_DILATED_CONV_CONFIG", json.dumps(TEST_CFG))
    tri.clear_config_cache()
    w = torch.nn.Parameter(torch.randn(8, 8, 3, 3))
    with torch.no_grad():
        for step in range(4):
            x = torch.randn(2, 8, 7 + (step == 3), 9)
            if step == 2:
                w.mul_(0.5)
            _check(tri.dilated_conv2d(x, w, 2, 2), _ref(x, w.detach(), 2, 2), torch.float32)
        assert len(tri._PLANS) == 2  # one a layout: the new shape (the update repacks)
        # The environment is read when a key is first seen, and again after a clear.
        monkeypatch.setenv("ROCMFIX_DILATED_CONV_CONFIG", json.dumps({**TEST_CFG, "nhwc": 0}))
        x = torch.randn(2, 8, 7, 9)
        _check(tri.dilated_conv2d(x, w, 2, 2), _ref(x, w.detach(), 2, 2), torch.float32)
        assert len(tri._PLANS) == 2
        assert all(plan[0].kwargs["NHWC"] for plan in tri._PLANS.values())
        tri.clear_config_cache()
        assert not tri._PLANS
        _check(tri.dilated_conv2d(x, w, 2, 2), _ref(x, w.detach(), 2, 2), torch.float32)
        ((launcher, to_channels_last, *_),) = tri._PLANS.values()
        assert launcher.kwargs["NHWC"] is False and not to_channels_last
        # A list is no key: such calls run, uncached.
        _check(tri.dilated_conv2d(x, w, 2, [2, 2]), _ref(x, w.detach(), 2, 2), torch.float32)
        assert len(tri._PLANS) == 1


def _bn(c: int, seed: int) -> torch.nn.BatchNorm2d:
    gen = torch.Generator().manual_seed(seed)
    bn = torch.nn.BatchNorm2d(c, eps=1e-3).eval()
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(c, generator=gen))
        bn.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
        bn.weight.copy_(torch.randn(c, generator=gen))
        bn.bias.copy_(torch.randn(c, generator=gen))
    return bn


@pytest.mark.parametrize("dt", [torch.float32, torch.float16])
@pytest.mark.parametrize("act", ["silu", "identity", None])
def test_bn_and_act_run_in_the_store(
    tri: ModuleType, monkeypatch: pytest.MonkeyPatch, dt: torch.dtype, act: str | None
) -> None:
    """act(bn(conv)) from the kernel's store matches the modules called on F.conv2d, on the
    cached plan too, and follows the BatchNorm's statistics when they are updated in place."""
    monkeypatch.setenv("ROCMFIX_DILATED_CONV_CONFIG", json.dumps(TEST_CFG))
    tri.clear_config_cache()
    module = {"silu": torch.nn.SiLU(), "identity": torch.nn.Identity(), None: None}[act]
    bn = _bn(12, 0).to(dt)
    w = torch.randn(12, 8, 3, 3, dtype=dt)

    def want(x: torch.Tensor) -> torch.Tensor:
        y = bn.double()(F.conv2d(x.double(), w.double(), None, 1, 2, 2))
        bn.to(dt)
        return y if module is None else module(y)

    with torch.no_grad():
        for step in range(3):
            x = torch.randn(2, 8, 7, 9, dtype=dt)
            if step == 2:
                bn.running_var.mul_(2.0)
                bn.bias.add_(1.0)
            _check(tri.dilated_conv2d(x, w, 2, 2, bn=bn, act=module), want(x), dt)
    (launcher,) = (plan[0] for plan in tri._PLANS.values())
    assert launcher.kwargs["EPILOGUE"] == (2 if act == "silu" else 1)
    assert len(tri.ks._folds) == 1


def test_other_modules_are_called_as_the_block_calls_them(
    tri: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A BatchNorm in train mode, a hooked or subclassed module, another activation or
    dilation 1: no fold; the modules see the plain conv and their hooks fire."""
    monkeypatch.setenv("ROCMFIX_DILATED_CONV_CONFIG", json.dumps(TEST_CFG))
    tri.clear_config_cache()
    w = torch.randn(12, 8, 3, 3)
    x = torch.randn(1, 8, 7, 9)
    seen: list[str] = []
    hooked = _bn(12, 1)
    hooked.register_forward_hook(lambda *_: seen.append("bn"))

    class Swish(torch.nn.SiLU):
        pass

    with torch.inference_mode():
        built_in_inference = _bn(12, 6)  # its buffers are inference tensors: no versions

    cases = [
        (built_in_inference, torch.nn.SiLU(), 2),
        (_bn(12, 2).train(), torch.nn.SiLU(), 2),
        (hooked, torch.nn.SiLU(), 2),
        (_bn(12, 3), torch.nn.ReLU(), 3),
        (_bn(12, 4), Swish(), 2),
        (_bn(12, 5), torch.nn.SiLU(), 1),
    ]
    with torch.no_grad():
        for bn, act, d in cases:
            ref = act(bn(F.conv2d(x, w, None, 1, d, d)))
            _check(tri.dilated_conv2d(x, w, d, d, bn=bn, act=act), ref.double(), torch.float32)
    assert seen == ["bn", "bn"]  # the reference call, then ours
    assert not tri.ks._folds
    assert all(plan[0].kwargs["EPILOGUE"] == 0 for plan in tri._PLANS.values())


def test_bn_recording_gradients_is_called_not_folded(
    tri: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With autograd on and the BatchNorm's parameters requiring grad (the conv's input and
    weight not), the fold would be a constant to autograd: the module runs, its grads flow."""
    monkeypatch.setenv("ROCMFIX_DILATED_CONV_CONFIG", json.dumps(TEST_CFG))
    tri.clear_config_cache()
    x, w = torch.randn(1, 8, 7, 9), torch.randn(12, 8, 3, 3)
    bn, act = _bn(12, 8), torch.nn.SiLU()
    y = tri.dilated_conv2d(x, w, 2, 2, bn=bn, act=act)
    y.sum().backward()
    assert bn.weight.grad is not None and bn.weight.grad.abs().sum() > 0
    assert not tri.ks._folds
    with torch.no_grad():
        _check(y.detach(), act(bn(F.conv2d(x, w, None, 1, 2, 2))).double(), torch.float32)


def test_inference_tensor_weight_runs_uncached(
    tri: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A weight made under inference_mode has no version counter: each call packs it afresh
    (no cached pack could see an in-place update), and an update is seen."""
    monkeypatch.setenv("ROCMFIX_DILATED_CONV_CONFIG", json.dumps(TEST_CFG))
    tri.clear_config_cache()
    with torch.inference_mode():
        x, w = torch.randn(1, 8, 7, 9), torch.randn(12, 8, 3, 3)
        first = tri.dilated_conv2d(x, w, 2, 2)
        w.mul_(-2.0)
        second = tri.dilated_conv2d(x, w, 2, 2)
    assert not tri.dk._PACKS
    _check(second, -2.0 * first.double(), torch.float32)


def test_triton_missing_falls_back_with_one_warning() -> None:
    mod = load_template("dilated_conv_triton", interpret=True, block_triton=True)
    assert mod.triton is None
    x, w = torch.randn(1, 3, 7, 5), torch.randn(3, 3, 3, 3)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        y1 = mod.dilated_conv2d(x, w, 2, 2)
        mod.dilated_conv2d(x, w, 3, 3)
    assert [str(r.message) for r in rec if "triton is not importable" in str(r.message)]
    assert len(rec) == 1
    torch.testing.assert_close(y1, F.conv2d(x, w, None, 1, 2, 2))


# ---------------------------------------------------------------------------------------------
# Specialisation: a new page size must not compile a new kernel
# ---------------------------------------------------------------------------------------------


def _binder_keys(mod: ModuleType, target: object, calls: list[tuple]) -> set:
    """The kernel-cache keys Triton computes for each launch (JITFunction.run: binder +
    compute_cache_key input).  Equal keys mean one compiled kernel serves all these calls."""
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(target)
    keys = set()
    for x, w, d, p in calls:
        cfg = mod.resolve_config("cpu", x.shape[1], w.shape[0], w.shape[-1], x.dtype)
        kernel, _grid, args, kwargs, _out = mod.dk.prepare_launch(x, w, d, p, cfg)
        binder = create_function_from_signature(kernel.signature, kernel.params, backend)
        _bound, specialization, options = binder(*args, **kwargs)
        keys.add((kernel.fn.__name__, tuple(specialization), str(options)))
    return keys


def _page_calls(c: int, k: int, dilations: tuple[int, ...]) -> list[tuple]:
    w = torch.randn(c, c, k, k)
    calls = []
    # Batch 1-4, and H x W with every divisibility by 16 (or not), and 1.
    for (n, h, wd), d in itertools.product(
        [(1, 160, 116), (4, 160, 116), (1, 160, 160), (2, 97, 61), (3, 8, 33), (1, 128, 96)],
        dilations,
    ):
        calls.append((torch.randn(n, c, h, wd), w, d, d * (k // 2)))
    return calls


def _targets() -> list:
    from triton.backends.compiler import GPUTarget

    return [
        GPUTarget("cuda", 90, 32),
        GPUTarget("hip", "gfx1100", 32),
        GPUTarget("hip", "gfx942", 64),
    ]


@pytest.mark.parametrize("target_index", [0, 1, 2], ids=["sm_90", "gfx1100", "gfx942"])
def test_no_recompile_across_page_sizes(tri_jit: ModuleType, target_index: int) -> None:
    target = _targets()[target_index]
    try:
        keys = _binder_keys(tri_jit, target, _page_calls(16, 5, (1, 2, 3)))
    except Exception as exc:  # a Triton build without this backend
        require(False, f"no backend for {target}: {exc}")
        raise
    assert len(keys) == 1, f"page size or dilation changed the kernel key: {len(keys)} variants"
    # The probe can fail: a different channel count must be a different kernel.
    other = _binder_keys(
        tri_jit, target, _page_calls(16, 5, (1,))[:1] + _page_calls(24, 5, (1,))[:1]
    )
    assert len(other) == 2


def test_shipped_configs_validate(tri: ModuleType) -> None:
    for arch, entry in tri.dc.SHIPPED_CONFIGS.items():
        for cfg in entry.values():
            tri.CONFIG.validate(cfg)
        cfg = tri.resolve_config(arch=arch, c_in=96, c_out=96, k=5)
        assert {
            "BLOCK_M",
            "BLOCK_N",
            "BLOCK_K",
            "num_warps",
            "num_stages",
            "input_precision",
        } <= cfg.keys(), arch


def test_config_lookup_order(
    tri: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tri.clear_config_cache()
    base = tri.resolve_config(arch="gfx1100", c_in=96, c_out=96, k=5)
    assert base["num_stages"] == 1 and base["BLOCK_K"] == 16  # shipped RDNA3 data, fp32 class
    assert base["input_precision"] == "ieee"

    tuned = tmp_path / "tuned.json"
    tuned.write_text(
        json.dumps(
            {
                "schema": 1,
                "kernels": {
                    "dilated_conv": {
                        "gfx1100": {
                            "any": {"BLOCK_M": 32, "num_warps": 8},
                            "c96_k5": {"BLOCK_N": 32},
                            "c96_k5_fp32": {"BLOCK_K": 32},
                        }
                    }
                },
            }
        )
    )
    monkeypatch.setenv("ROCMFIX_TUNED_FILE", str(tuned))
    tri.clear_config_cache()
    cfg = tri.resolve_config(arch="gfx1100", c_in=96, c_out=96, k=5)
    assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["num_warps"]) == (32, 32, 32, 8)
    assert cfg["num_stages"] == 1  # fields the file does not set come from the shipped data
    other = tri.resolve_config(arch="gfx1100", c_in=192, c_out=192, k=3)
    assert (other["BLOCK_M"], other["BLOCK_N"], other["BLOCK_K"]) == (32, 64, 16)

    monkeypatch.setenv("ROCMFIX_DILATED_CONV_CONFIG", json.dumps({"BLOCK_M": 16}))
    cfg = tri.resolve_config(arch="gfx1100", c_in=96, c_out=96, k=5)
    assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]) == (16, 32, 32)  # env > file

    # The env may be keyed by shape class as well.
    monkeypatch.setenv("ROCMFIX_DILATED_CONV_CONFIG", json.dumps({"c192_k3": {"BLOCK_N": 128}}))
    assert tri.resolve_config(arch="gfx1100", c_in=192, c_out=192, k=3)["BLOCK_N"] == 128
    assert tri.resolve_config(arch="gfx1100", c_in=96, c_out=96, k=5)["BLOCK_N"] == 32


def test_config_xdg_path_and_corrupt_file(
    tri: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tri.clear_config_cache()
    shipped = tri.resolve_config(arch="sm_90", c_in=96, c_out=96, k=5)  # no file, no env
    monkeypatch.delenv("ROCMFIX_TUNED_FILE")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    path = tmp_path / "rocmfix" / "tuned.json"
    assert Path(tri.kc.tuned_file_path()) == path
    path.parent.mkdir()
    path.write_text('{"schema": 1, "kernels": {"dilated_conv": {"sm_90": {"any": {"BLOCK_M": ')
    tri.clear_config_cache()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        a = tri.resolve_config(arch="sm_90", c_in=96, c_out=96, k=5)
        b = tri.resolve_config(arch="sm_90", c_in=192, c_out=192, k=3)
    msgs = [str(r.message) for r in rec]
    assert len(msgs) == 1 and "cannot read tuned file" in msgs[0], msgs
    assert a == shipped
    assert b["BLOCK_M"] > 0

    for bad, says in (
        ({"schema": 2, "kernels": {}}, "not a schema 1 rocmfix file"),
        ({"schema": 1, "kernels": {"dilated_conv": [1]}}, "must map arch -> config"),
    ):
        path.write_text(json.dumps(bad))
        tri.clear_config_cache()
        with pytest.warns(RuntimeWarning, match=says):
            tri.resolve_config(arch="sm_90", c_in=96, c_out=96, k=5)

    path.write_text(
        json.dumps({"schema": 1, "kernels": {"dilated_conv": {"sm_90": {"any": {"BLOCK_M": 48}}}}})
    )
    tri.clear_config_cache()
    with pytest.warns(RuntimeWarning, match="BLOCK_M=48 .must be a power of two"):
        cfg = tri.resolve_config(arch="sm_90", c_in=96, c_out=96, k=5)
    assert cfg == shipped


def test_config_bad_env_and_precision(tri: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    tri.clear_config_cache()
    shipped = tri.resolve_config(arch="sm_90", c_in=96, c_out=96, k=5)
    monkeypatch.setenv("ROCMFIX_DILATED_CONV_CONFIG", "{not json")
    with pytest.warns(RuntimeWarning, match="ROCMFIX_DILATED_CONV_CONFIG"):
        cfg = tri.resolve_config(arch="sm_90", c_in=96, c_out=96, k=5)
    assert cfg == shipped
    monkeypatch.delenv("ROCMFIX_DILATED_CONV_CONFIG")

    # fp32 follows torch's cuDNN TF32 switch, and only where the arch has TF32. (torch >= 2.9
    # has the switch's getter, which the template reads directly: every fp32 call asks.)
    assert tri.dc._read_conv_precision is not None, torch.__version__
    prec = torch.backends.cudnn.conv.fp32_precision
    try:
        torch.backends.cudnn.conv.fp32_precision = "tf32"
        assert tri.resolve_config(arch="sm_90", c_in=8, c_out=8, k=3)["input_precision"] == "tf32"
        assert tri.resolve_config(arch="gfx942", c_in=8, c_out=8, k=3)["input_precision"] == "tf32"
        assert tri.resolve_config(arch="gfx1100", c_in=8, c_out=8, k=3)["input_precision"] == "ieee"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        assert tri.resolve_config(arch="sm_90", c_in=8, c_out=8, k=3)["input_precision"] == "ieee"
    finally:
        torch.backends.cudnn.conv.fp32_precision = prec
    assert (
        tri.resolve_config(arch="sm_90", c_in=8, c_out=8, k=3, dtype=torch.bfloat16)[
            "input_precision"
        ]
        == "ieee"
    )


# ---------------------------------------------------------------------------------------------
# Phase split (float64, exact up to summation order)
# ---------------------------------------------------------------------------------------------

_PHASE_GRID = list(
    itertools.product((3, 5), (1, 2, 3, 4, 5), (1, 2), ((7, 9), (13, 5), (1, 1), (6, 30)))
)


@pytest.mark.parametrize(("k", "d", "n", "hw"), _PHASE_GRID)
def test_phase_matches_conv2d_float64(
    phase: ModuleType, k: int, d: int, n: int, hw: tuple[int, int]
) -> None:
    h, w = hw
    for p, c, co in ((d * (k // 2), 5, 7), (d * (k // 2) + 1, 12, 3), (0, 16, 16)):
        if h + 2 * p - d * (k - 1) < 1 or w + 2 * p - d * (k - 1) < 1:
            continue
        x = torch.randn(n, c, h, w, dtype=torch.float64)
        wt = torch.randn(co, c, k, k, dtype=torch.float64)
        y = phase.dilated_conv2d(x, wt, d, p)
        ref = F.conv2d(x, wt, None, 1, p, d)
        assert y.shape == ref.shape
        assert (y - ref).abs().max().item() <= 1e-12


@pytest.mark.parametrize("layout", ["channel_slice", "channels_last", "w_strided"])
def test_phase_non_contiguous_and_pairs(phase: ModuleType, layout: str) -> None:
    if layout == "channel_slice":
        x = torch.randn(2, 9, 11, 6, dtype=torch.float64)[:, 2:8]
    elif layout == "channels_last":
        x = torch.randn(2, 6, 11, 6, dtype=torch.float64).to(memory_format=torch.channels_last)
    else:
        x = torch.randn(2, 6, 11, 12, dtype=torch.float64)[..., ::2]
    wt = torch.randn(4, 6, 5, 3, dtype=torch.float64)
    for d, p in ((3, (6, 3)), (2, (1, 4))):
        y = phase.dilated_conv2d(x, wt, d, p)
        ref = F.conv2d(x, wt, None, 1, p, d)
        assert (y - ref).abs().max().item() <= 1e-12


class _ConvDilationSpy(TorchDispatchMode):
    """Records the dilation argument of every aten.convolution that actually runs."""

    def __init__(self) -> None:
        super().__init__()
        self.dilations: list[list[int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.convolution.default, torch.ops.aten.conv2d.default):
            self.dilations.append(list(args[5]) if len(args) > 5 else [1, 1])
        return func(*args, **(kwargs or {}))


def test_phase_issues_no_dilated_conv(phase: ModuleType) -> None:
    x, wt = torch.randn(1, 4, 10, 9), torch.randn(4, 4, 5, 5)
    with _ConvDilationSpy() as spy:
        y = phase.dilated_conv2d(x, wt, 3, 6)
    assert spy.dilations == [[1, 1]]
    with _ConvDilationSpy() as spy:  # the probe can fail: the stock conv is seen as dilated
        ref = F.conv2d(x, wt, None, 1, 6, 3)
    assert spy.dilations == [[3, 3]]
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-4)


def test_phase_grad_flows(phase: ModuleType) -> None:
    x = torch.randn(1, 2, 6, 5, dtype=torch.float64, requires_grad=True)
    wt = torch.randn(2, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda a, b: phase.dilated_conv2d(a, b, 2, 2), (x, wt))
