"""CPU tests of the depthwise conv templates (templates/depthwise_conv_{triton,vendor}.py).

The Triton kernel runs in Triton's CPU interpreter (``TRITON_INTERPRET=1`` while the template
is imported). Every check draws fresh random inputs; shapes are MinerU's (rocmfix/ops/
depthwise_conv.py) scaled down, and odd sizes. The GPU proof is bench/depthwise_conv.py.
"""

from __future__ import annotations

import contextlib
import inspect
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import warnings
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from rocmfix.ops import op

from conftest import load_template

triton = pytest.importorskip("triton")

TOL = {torch.float32: 1e-5, torch.float16: 2e-3}
ACTS: dict[str, Any] = {
    "none": None,
    "identity": torch.nn.Identity,
    "relu": torch.nn.ReLU,
    "silu": torch.nn.SiLU,
    "gelu": torch.nn.GELU,
    "hardswish": torch.nn.Hardswish,
}


pytestmark = pytest.mark.usefixtures("no_kernel_config")


@pytest.fixture(scope="module")
def tri() -> ModuleType:
    return load_template("depthwise_conv_triton")


@pytest.fixture(scope="module")
def vendor() -> ModuleType:
    return load_template("depthwise_conv_vendor")


def _layer(
    c: int, k: tuple[int, int], s: int, dtype: torch.dtype, act: str, bias: bool = False
) -> tuple[torch.nn.Conv2d, torch.nn.BatchNorm2d, Any]:
    kh, kw = k
    conv = torch.nn.Conv2d(c, c, k, s, ((kh - 1) // 2, (kw - 1) // 2), groups=c, bias=bias)
    bn = torch.nn.BatchNorm2d(c)
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 1.5)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    make = ACTS[act]
    return conv.to(dtype).eval(), bn.to(dtype).eval(), (make() if make else None)


def _want(x: torch.Tensor, conv: Any, bn: Any, act: Any) -> torch.Tensor:
    """The stock layer in fp32 (fp16's CPU conv is the thing under test's peer, not a truth)."""
    y = F.conv2d(x.float(), conv.weight.float(), None if conv.bias is None else conv.bias.float(),
                 conv.stride, conv.padding, 1, conv.groups)  # fmt: skip
    if bn is not None:
        y = F.batch_norm(y, bn.running_mean.float(), bn.running_var.float(), bn.weight.float(),
                         bn.bias.float(), False, 0.0, bn.eps)  # fmt: skip
    return act.float()(y) if act is not None else y


def _check(y: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    assert y.dtype == dtype and y.shape == want.shape and y.is_contiguous()
    # A ReLU can zero nearly all of a small random output (CI drew 7 zeros of 8 and a 3e-4
    # survivor), so the norm is floored at an RMS of 0.1: these layers' outputs run near 0.5.
    floor = 0.1 * want.numel() ** 0.5
    err = float((y.float() - want).norm() / want.norm().clamp_min(floor))
    assert err < TOL[dtype], err


CASES = [
    # MinerU's shapes, scaled down: layout 5x5, the stride-2 downsample, OCR 3x3/5x5 with
    # Hardswish, recognition 1x7 in fp16, formula 5x5 fp16 at batch 2; odd sizes throughout.
    (6, (5, 5), 1, 1, 11, 9, torch.float32, "relu"),
    (4, (3, 3), 2, 1, 13, 10, torch.float32, "none"),
    (3, (3, 3), 2, 2, 7, 7, torch.float32, "identity"),
    (5, (3, 3), 1, 1, 24, 17, torch.float32, "hardswish"),
    (6, (1, 7), 1, 2, 3, 17, torch.float16, "hardswish"),
    (4, (5, 5), 1, 2, 6, 6, torch.float16, "relu"),
    (7, (7, 7), 1, 1, 9, 12, torch.float32, "silu"),
    (3, (3, 3), 1, 1, 5, 8, torch.float32, "gelu"),
    (2, (5, 5), 2, 1, 4, 3, torch.float32, "relu"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"c{c[0]}k{c[1][0]}x{c[1][1]}s{c[2]}"
                         f"n{c[3]}-{c[4]}x{c[5]}-{str(c[6])[6:]}-{c[7]}")  # fmt: skip
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_entry_matches_the_stock_layer(tri: ModuleType, case: tuple, layout: str) -> None:
    c, k, s, n, h, w, dtype, act_name = case
    conv, bn, act = _layer(c, k, s, dtype, act_name)
    x = torch.randn(n, c, h, w).to(dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    tri.clear_config_cache()
    with torch.no_grad():
        y = tri.depthwise_conv2d(x, conv, bn, act)
        _check(y, _want(x, conv, bn, act), dtype)
        # The kernel ran (a plan for this layout), not the stock modules.
        assert len(tri._plans) == 1
        # Without the BatchNorm, and with neither.
        _check(tri.depthwise_conv2d(x, conv, None, act), _want(x, conv, None, act), dtype)
        _check(tri.depthwise_conv2d(x, conv), _want(x, conv, None, None), dtype)


def test_the_kernel_ran_and_a_layers_next_call_replays_its_plan(tri: ModuleType) -> None:
    conv, bn, act = _layer(4, (3, 3), 1, torch.float32, "relu", bias=True)
    tri.clear_config_cache()
    calls = []
    real = tri.dk.KERNEL
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 4, 9, 7)
            y = tri.depthwise_conv2d(x, conv, bn, act)
            _check(y, _want(x, conv, bn, act), torch.float32)
            calls.append(len(tri._plans))
        # An in-place update of the weight, the bias or the statistics is seen.
        conv.weight.mul_(2.0)
        conv.bias.add_(1.0)
        bn.running_var.mul_(3.0)
        x = torch.randn(2, 4, 9, 7)
        _check(tri.depthwise_conv2d(x, conv, bn, act), _want(x, conv, bn, act), torch.float32)
        # So is a BatchNorm put back into training mode: the modules run themselves (with no
        # momentum, so that both calls see the same statistics).
        bn.train()
        bn.momentum = 0.0
        want = act(bn(conv(x)))
        got = tri.depthwise_conv2d(x, conv, bn, act)
        torch.testing.assert_close(got, want)
    assert calls == [1, 1, 1] and tri.dk.KERNEL is real


def test_unknown_activations_and_bn_run_as_modules(tri: ModuleType) -> None:
    class Custom(torch.nn.Module):
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return t * 0.5 + 1.0

    conv, bn, _ = _layer(4, (3, 3), 1, torch.float32, "none")
    seen: list[str] = []
    tanh_gelu = torch.nn.GELU(approximate="tanh")
    hooked = torch.nn.ReLU()
    hooked.register_forward_hook(lambda *_: seen.append("act"))
    x = torch.randn(1, 4, 8, 6)
    with torch.no_grad():
        for act in (Custom(), tanh_gelu, hooked):
            _check(tri.depthwise_conv2d(x, conv, bn, act), act(bn(conv(x))), torch.float32)

        # A subclassed BatchNorm is called, then the activation after it.
        class MyBN(torch.nn.BatchNorm2d):
            pass

        mine = MyBN(4).eval()
        mine.register_forward_hook(lambda *_: seen.append("bn"))
        relu = torch.nn.ReLU()
        _check(tri.depthwise_conv2d(x, conv, mine, relu), relu(mine(conv(x))), torch.float32)
    assert seen == ["act", "act", "bn", "bn"]


def test_a_frozen_batchnorm_without_eps_runs_after_the_kernel(tri: ModuleType) -> None:
    """transformers' PP-DocLayoutV2 swaps its BatchNorms for a frozen one with buffers and no
    ``eps`` attribute; the kernel runs the conv and the module after it, on the first call and
    on the replayed ones, with no warning (the H100 run of 2026-11-25 fell back on all 27)."""

    class Frozen(torch.nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            for name, fill in (("weight", 1.5), ("bias", 0.25), ("running_mean", 0.1),
                               ("running_var", 2.0)):  # fmt: skip
                self.register_buffer(name, torch.full((c,), fill))

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            scale = self.weight * (self.running_var + 1e-5).rsqrt()
            shift = self.bias - self.running_mean * scale
            return t * scale[None, :, None, None] + shift[None, :, None, None]

    conv, _, act = _layer(4, (3, 3), 1, torch.float32, "relu")
    frozen = Frozen(4).eval()
    tri.clear_config_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            for _ in range(3):
                x = torch.randn(1, 4, 9, 7)
                _check(tri.depthwise_conv2d(x, conv, frozen, act), act(frozen(conv(x))),
                       torch.float32)  # fmt: skip
    assert len(tri._plans), "the kernel never ran"


@pytest.mark.parametrize(
    "why",
    ["not-depthwise", "dilation", "groups", "grad", "cpu-no-interpreter", "padding-mode",
     "hook", "float64", "string-padding"],
)  # fmt: skip
def test_what_it_does_not_handle_runs_the_stock_modules(tri: ModuleType, why: str) -> None:
    c = 4
    conv = torch.nn.Conv2d(c, c, 3, 1, 1, groups=c, bias=False)
    x = torch.randn(1, c, 7, 6)
    bn, act = torch.nn.BatchNorm2d(c).eval(), torch.nn.ReLU()
    module = tri
    calls: list[int] = []
    if why == "not-depthwise":
        conv = torch.nn.Conv2d(c, c, 3, 1, 1, bias=False)
    elif why == "dilation":
        conv = torch.nn.Conv2d(c, c, 3, 1, 2, dilation=2, groups=c, bias=False)
    elif why == "groups":
        conv = torch.nn.Conv2d(c, 2 * c, 3, 1, 1, groups=c, bias=False)
        bn = torch.nn.BatchNorm2d(2 * c).eval()
    elif why == "cpu-no-interpreter":
        module = load_template("depthwise_conv_triton", interpret=False)
    elif why == "padding-mode":
        conv = torch.nn.Conv2d(c, c, 3, 1, 1, groups=c, bias=False, padding_mode="reflect")
    elif why == "hook":
        conv.register_forward_hook(lambda *_: calls.append(1))
    elif why == "float64":
        conv, bn, x = conv.double(), bn.double(), x.double()
    elif why == "string-padding":
        conv = torch.nn.Conv2d(c, c, 3, 1, "same", groups=c, bias=False)
    launches = []
    original = module.dk.KERNEL
    module.dk.KERNEL = _Spy(original, launches)
    try:
        if why == "grad":
            y = module.depthwise_conv2d(x, conv, bn, act)  # the weight requires grad
            y.sum().backward()
            assert conv.weight.grad is not None
        else:
            with torch.no_grad():
                y = module.depthwise_conv2d(x, conv, bn, act)
    finally:
        module.dk.KERNEL = original
    with torch.no_grad():
        torch.testing.assert_close(y, act(bn(conv(x))))
    assert launches == []
    assert calls == ([1, 1] if why == "hook" else [])


class _Spy:
    """Records that the kernel was prepared; the launch goes through ``kernel[grid]``."""

    def __init__(self, kernel: Any, seen: list[int]) -> None:
        self.kernel, self.seen = kernel, seen

    def __getitem__(self, grid: Any) -> Any:
        self.seen.append(1)
        return self.kernel[grid]


def test_a_failing_kernel_warns_once_and_runs_the_stock_modules(tri: ModuleType) -> None:
    module = load_template("depthwise_conv_triton")

    class Broken:
        def __getitem__(self, grid: Any) -> Any:
            raise RuntimeError("simulated compiler failure")

    module.dk.KERNEL = Broken()
    conv, bn, act = _layer(4, (5, 5), 1, torch.float32, "silu")
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for _ in range(3):
            x = torch.randn(1, 4, 9, 9)
            torch.testing.assert_close(module.depthwise_conv2d(x, conv, bn, act), act(bn(conv(x))))
    messages = [str(w.message) for w in caught if "depthwise" in str(w.message)]
    assert len(messages) == 1 and "simulated compiler failure" in messages[0]


def test_triton_missing_runs_the_stock_modules() -> None:
    module = load_template("depthwise_conv_triton", block_triton=True)
    assert module.triton is None
    conv, bn, act = _layer(3, (3, 3), 1, torch.float32, "relu")
    x = torch.randn(1, 3, 6, 5)
    with torch.no_grad():
        torch.testing.assert_close(module.depthwise_conv2d(x, conv, bn, act), act(bn(conv(x))))


def test_vendor_scheme_matches_and_keeps_cpu_inputs_stock(vendor: ModuleType) -> None:
    conv, bn, act = _layer(5, (5, 5), 1, torch.float32, "hardswish")
    x = torch.randn(2, 5, 9, 8)
    with torch.no_grad():
        want = act(bn(conv(x)))
        assert torch.equal(vendor.depthwise_conv2d(x, conv, bn, act), want)
        assert not vendor._handled(x, conv)  # CPU tensors: the stock modules, bit for bit


def test_the_kernel_alone_at_every_tune_target_and_grid_tile(tri: ModuleType) -> None:
    depthwise = op("depthwise-conv")
    for target in depthwise.tune:
        s = target.cpu
        dtype = {"float32": torch.float32, "float16": torch.float16}[s["dtype"]]
        conv = _layer(s["c"], (s["kh"], s["kw"]), s["s"], dtype, s["act"])[0]
        x = torch.randn(s["n"], s["c"], s["h"], s["w"]).to(dtype)
        for group in depthwise.grid:
            if group.when != ("cpu",):
                continue
            for config in group.configs:
                y = tri.conv(
                    x, conv.weight.detach(), conv.stride, conv.padding, config=dict(config)
                )
                _check(y, _want(x, conv, None, None), dtype)


def test_shipped_configs_validate(tri: ModuleType) -> None:
    for arch, layers in tri.SHIPPED_CONFIGS.items():
        for layer in layers.values():
            tri.CONFIG.validate(layer)
        if arch != "default":
            cfg = tri.resolve_config(None, 5, 5, 1, torch.float16, arch=arch)
            assert {"BLOCK_P", "BLOCK_C", "num_warps", "num_stages"} <= set(cfg)


def test_registered_op_under_torch_compile_fullgraph(tri: ModuleType) -> None:
    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            conv, bn, act = _layer(4, (3, 3), 1, torch.float32, "hardswish", bias=True)
            self.conv, self.bn, self.act = conv, bn, act

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return tri.depthwise_conv2d(x, self.conv, self.bn, self.act)  # type: ignore[no-any-return]

    layer = Layer().eval()
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 4, 9, 7)
    with torch.no_grad():
        got = compiled(x)
        _check(got, _want(x, layer.conv, layer.bn, layer.act), torch.float32)
    opcheck = getattr(torch.library, "opcheck", None)
    if opcheck is not None:
        opdef = getattr(torch.ops.rocmfix, tri.OP_NAME).default
        scale, shift = torch.rand(4) + 0.5, torch.randn(4)
        opcheck(opdef, (x, layer.conv.weight.detach(), scale, shift, [1, 1], [1, 1], 4),
                test_utils=("test_schema", "test_faketensor"))  # fmt: skip


MUTATIONS = [
    "weight-inplace", "weight-replaced", "weight-data", "bias-added", "bn-stat-inplace",
    "bn-buffer-replaced", "bn-affine-replaced", "bn-eps", "bn-train", "padding", "stride",
    "channels-last", "other-bn", "conv-hook", "bn-hook", "act-hook", "global-hook",
    "strided-weight-inplace", "gelu-tanh", "grad-input", "grad-bn-affine", "bn-stat-data",
    "bn-affine-data",
]  # fmt: skip


@pytest.mark.parametrize("change", MUTATIONS)
def test_a_replayed_plan_sees_every_change_it_depends_on(tri: ModuleType, change: str) -> None:
    """After a layer's plan replays, each change of what it was planned for gives the stock
    layer's result (replanned or the modules themselves), never the stale launch."""
    c = 4
    conv, bn, act = _layer(c, (3, 3), 1, torch.float32, "gelu" if change == "gelu-tanh" else "relu")
    if change == "strided-weight-inplace":  # the kernel reads a contiguous copy of it
        conv.weight = torch.nn.Parameter(torch.randn(c, 1, 3, 3).transpose(2, 3))
    if change == "grad-bn-affine":  # only the folded BatchNorm's affine parameters need grad
        conv.weight.requires_grad_(False)
    x = torch.randn(1, c, 8, 6)
    seen: list[str] = []
    tri.clear_config_cache()
    with torch.no_grad():
        for _ in range(2):
            _check(tri.depthwise_conv2d(x, conv, bn, act), _want(x, conv, bn, act), x.dtype)
        assert len(tri._plans), "the kernel never ran"
        if change == "weight-inplace":
            conv.weight.mul_(-2.0)
        elif change == "weight-replaced":
            conv.weight = torch.nn.Parameter(torch.randn_like(conv.weight))
        elif change == "weight-data":
            conv.weight.data = torch.randn_like(conv.weight)
        elif change == "bias-added":
            conv.bias = torch.nn.Parameter(torch.randn(c))
        elif change == "bn-stat-inplace":
            bn.running_mean.add_(3.0)
        elif change == "bn-stat-data":  # new storage, the same tensor and version
            bn.running_mean.data = torch.randn(c)
        elif change == "bn-affine-data":  # what model.half() / .cuda() do to parameters
            bn.weight.data = torch.rand(c) + 3.0
        elif change == "bn-buffer-replaced":
            bn.running_var = torch.rand(c) + 2.0
        elif change == "bn-affine-replaced":
            bn.weight = torch.nn.Parameter(torch.rand(c) - 2.0)
        elif change == "bn-eps":
            bn.eps = 4.0
        elif change == "bn-train":
            bn.train()
            bn.momentum = 0.0
        elif change == "padding":
            conv.padding = (0, 0)
        elif change == "stride":
            conv.stride = (2, 2)
        elif change == "channels-last":
            x = x.contiguous(memory_format=torch.channels_last)
        elif change == "other-bn":
            bn = _layer(c, (3, 3), 1, torch.float32, "relu")[1]
        elif change == "conv-hook":
            conv.register_forward_hook(lambda *_: seen.append("conv"))
        elif change == "bn-hook":
            bn.register_forward_hook(lambda *_: seen.append("bn"))
        elif change == "act-hook":
            act.register_forward_hook(lambda *_: seen.append("act"))
        elif change == "strided-weight-inplace":
            conv.weight.mul_(-2.0)
        elif change == "gelu-tanh":
            act.approximate = "tanh"
        elif change == "grad-input":
            x.requires_grad_(True)
        global_hook = None
        if change == "global-hook":
            global_hook = torch.nn.modules.module.register_module_forward_hook(
                lambda *_: seen.append("global")
            )
        try:
            with torch.set_grad_enabled(change.startswith("grad")):
                got = tri.depthwise_conv2d(x, conv, bn, act)
        finally:
            if global_hook is not None:
                global_hook.remove()
        stock = change in ("bn-train", "gelu-tanh") or change.startswith("grad")
        with torch.set_grad_enabled(change.startswith("grad")):
            want = act(bn(conv(x))) if stock else _want(x, conv, bn, act)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert bool(seen) == change.endswith("-hook")
    assert got.requires_grad == change.startswith("grad")


@pytest.mark.parametrize(
    "k, pad, w",
    [((3, 3), (1, 1), 8), ((5, 5), (2, 2), 12), ((1, 7), (0, 3), 10), ((7, 7), (3, 3), 6),
     ((2, 3), (1, 0), 8), ((3, 3), (0, 0), 10), ((5, 5), (4, 3), 6), ((1, 1), (0, 0), 4)],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_pairs_and_elements_compute_the_same_conv(
    tri: ModuleType, k: tuple[int, int], pad: tuple[int, int], w: int, dtype: torch.dtype
) -> None:
    """VEC 2 (aligned input pairs, where the widths and strides are even) against VEC 1 and
    F.conv2d, at kernels, paddings and tiles that put pairs across every border; an input
    at an odd address or an odd width falls back to elements."""
    c, kh, kw = 5, *k
    weight = torch.randn(c, 1, kh, kw).to(dtype)
    x = torch.randn(2, c, 7, w).to(dtype)
    want = F.conv2d(x.float(), weight.float(), None, 1, pad, 1, c)
    shifted = torch.randn(2 * c * 7 * w + 1).to(dtype)[1:].view(2, c, 7, w)
    shifted.copy_(x)
    odd = torch.randn(2, c, 7, w + 1).to(dtype)
    for tile in ({"BLOCK_P": 64, "BLOCK_C": 1, "num_warps": 1},
                 {"BLOCK_P": 16, "BLOCK_C": 4, "num_warps": 1}):  # fmt: skip
        for vec in (1, 2):
            cfg = dict(tile, VEC=vec)
            kwargs = tri.prepare_launch(x, weight, (1, 1), pad, dict(cfg, num_stages=1))[3]
            assert kwargs["VEC"] == vec
            _check(tri.conv(x, weight, 1, pad, config=cfg), want, dtype)
            # Not pair-aligned: an odd address, an odd width.
            assert (
                tri.prepare_launch(shifted, weight, (1, 1), pad, dict(cfg, num_stages=1))[3]["VEC"]
                == 1
            )
            _check(tri.conv(shifted, weight, 1, pad, config=cfg), want, dtype)
            want_odd = F.conv2d(odd.float(), weight.float(), None, 1, pad, 1, c)
            _check(tri.conv(odd, weight, 1, pad, config=cfg), want_odd, dtype)


@pytest.mark.parametrize("layout", ["nchw", "channels-last", "stride-2"])
def test_a_replay_allocates_an_nchw_output_however_its_input_is_laid_out(
    tri: ModuleType, layout: str
) -> None:
    """A repeated call's output is NCHW-contiguous whatever its input's layout, as the kernel
    writes it."""
    stride = 2 if layout == "stride-2" else 1
    conv, bn, act = _layer(4, (3, 3), stride, torch.float32, "silu")
    tri.clear_config_cache()
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 4, 8, 6)
            if layout == "channels-last":
                x = x.contiguous(memory_format=torch.channels_last)
            got = tri.depthwise_conv2d(x, conv, bn, act)
            assert got.is_contiguous()
            _check(got, _want(x, conv, bn, act), torch.float32)
    assert len(tri._plans) == 1


class _Compiled:
    """What ``kernel.warmup`` returns: a compiled kernel whose ``[grid]`` runner records."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, stream=None: self.calls.append((grid, args))


class _Compiling:
    """A JITFunction stand-in with the real kernel's parameters: each ``kernel[grid]`` launch
    is recorded, and ``warmup`` returns one compiled kernel, which the Launcher adopts."""

    def __init__(self, real: Any) -> None:
        self.arg_names = list(inspect.signature(real.fn).parameters)
        self.compiled = _Compiled()
        self.launches: list[tuple[Any, ...]] = []
        self.pre_run_hooks: list[Any] = []

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: self.launches.append((grid, args, kwargs))

    def warmup(self, *args: Any, grid: Any, **kwargs: Any) -> _Compiled:
        return self.compiled


@contextlib.contextmanager
def _stand_in_kernel() -> Iterator[tuple[ModuleType, _Compiling]]:
    """The entry template with its kernel a :class:`_Compiling` stand-in, its CPU tensors
    said to be on GPU 0 (the current one), so the Launcher adopts the stand-in's compiled
    kernel as it adopts Triton's (the interpreter adopts nothing)."""
    module = load_template("depthwise_conv_triton")
    kernel = _Compiling(module.dk.KERNEL)
    saved = module.dk.KERNEL, module.rt.device_index, torch.cuda.current_device
    module.dk.KERNEL, module.rt.device_index = kernel, lambda t: 0
    module.rt.current_stream = lambda: lambda device: 0
    torch.cuda.current_device = lambda: 0
    cuda_device = torch.cuda.device
    torch.cuda.device = lambda index: contextlib.nullcontext()  # type: ignore[assignment,misc]
    try:
        yield module, kernel
    finally:
        module.dk.KERNEL, module.rt.device_index, torch.cuda.current_device = saved
        torch.cuda.device = cuda_device  # type: ignore[misc]


def test_a_layer_called_with_two_input_shapes_in_turn_does_not_plan_every_call() -> None:
    """One plan per layout: a layer whose input alternates between two shapes (two page
    sizes, a shared conv) launches through Triton's ``kernel[grid]`` binding (~20 us on a
    GPU host) once a layout, and every later call through the adopted compiled kernel."""
    conv, bn, act = _layer(4, (3, 3), 1, torch.float32, "relu")
    with _stand_in_kernel() as (module, kernel), torch.no_grad():
        a, b = torch.randn(1, 4, 8, 6), torch.randn(1, 4, 8, 10)
        for _ in range(3):
            module.depthwise_conv2d(a, conv, bn, act)
            module.depthwise_conv2d(b, conv, bn, act)
    assert len(kernel.launches) == 2, len(kernel.launches)
    assert len(kernel.compiled.calls) == 4


def test_a_repeat_call_launches_the_compiled_kernel_with_every_parameter_in_order() -> None:
    """A repeat call hands the compiled kernel's ``[grid]`` runner this call's tensors and
    every other argument of Triton's first launch, the keywords in the kernel's parameter
    order (constexprs included: Triton's own launch passes them so)."""
    conv, bn, act = _layer(4, (3, 3), 1, torch.float32, "hardswish")
    with _stand_in_kernel() as (module, kernel), torch.no_grad():
        module.depthwise_conv2d(torch.randn(1, 4, 8, 6), conv, bn, act)
        x = torch.randn(1, 4, 8, 6)
        out = module.depthwise_conv2d(x, conv, bn, act)
    assert len(kernel.launches) == 1 and len(kernel.compiled.calls) == 1
    grid, args, kwargs = kernel.launches[0]
    run_grid, call = kernel.compiled.calls[0]
    assert run_grid == (*grid, 1, 1)[:3] and call[0] is x and call[4] is out
    assert call[1:4] == args[1:4] and call[5 : len(args)] == args[5:]
    assert call[len(args) :] == tuple(kwargs[name] for name in kernel.arg_names[len(args) :])
