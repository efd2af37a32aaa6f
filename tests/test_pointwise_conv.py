"""The 1x1 conv op (``pointwise-conv``): its GEMM template against ``F.conv2d`` on the CPU, its
entry's fallbacks, the DocLayout-YOLO route (golden code written for these tests, then the
real release through the CLI and its model run down the GPU branch), and ``rocmfix profile``
naming it from the registry."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from rocmfix.ops import OPS, op
from rocmfix.patch import Patch, TargetContext
from rocmfix.registry import all_patches

from conftest import load_template

PATCH = "doclayout-pointwise-conv"
TARGET = "doclayout_yolo/nn/modules/conv.py"
DROP = "doclayout_yolo/nn/modules/rocmfix_pointwise_conv.py"
GOLDEN = Path(__file__).resolve().parent / "golden"
CTX = TargetContext(version="0", versions={}, torch=None)
OP = op("pointwise-conv")


@pytest.fixture(scope="module")
def gemm() -> Any:
    return load_template("pointwise_conv_gemm")


def _patch() -> Patch:
    return next(p for p in all_patches() if p.id == PATCH)


class Convs(TorchDispatchMode):
    """Counts the aten convolutions that actually run."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in (torch.ops.aten.convolution.default, torch.ops.aten.conv2d.default):
            self.count += 1
        return func(*args, **(kwargs or {}))


# (n, cin, cout, groups, h, w): dense, grouped (3 into 1 a group, as DocLayout-YOLO's), a
# depthwise gate, more out than in a group, odd sizes, one pixel, an empty batch.
SHAPES = [
    (1, 8, 16, 1, 5, 7),
    (2, 12, 6, 3, 3, 4),
    (3, 288, 96, 96, 7, 5),
    (1, 6, 6, 6, 2, 3),
    (2, 4, 12, 2, 5, 3),
    (2, 5, 7, 1, 1, 1),
    (1, 33, 17, 1, 13, 11),
    (0, 8, 4, 2, 3, 3),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("layout", ["nchw", "channels-last"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_the_gemm_computes_f_conv2d(
    gemm: Any, dtype: torch.dtype, layout: str, bias: bool, shape: tuple[int, ...]
) -> None:
    n, cin, cout, g, h, w = shape
    torch.manual_seed(0)
    x = torch.randn(n, cin, h, w, dtype=dtype)
    if layout == "channels-last":
        x = x.contiguous(memory_format=torch.channels_last)
    weight = torch.randn(cout, cin // g, 1, 1, dtype=dtype)
    b = torch.randn(cout, dtype=dtype) if bias else None
    got = gemm.conv2d(x, weight, b, 1, 0, 1, g)
    want = F.conv2d(x, weight, b, groups=g)
    assert got.shape == want.shape and got.dtype == want.dtype
    exact = F.conv2d(x.double(), weight.double(), None if b is None else b.double(), groups=g)
    limit = 1e-5 if dtype == torch.float32 else 4e-3
    scale = max([1.0, *exact.abs().flatten().tolist()])
    assert all(abs(e) <= limit * scale for e in (got.double() - exact).flatten().tolist())
    # The layout F.conv2d gives (where one is defined: a single pixel is both).
    if h * w > 1 and n > 0:
        for fmt in (torch.contiguous_format, torch.channels_last):
            assert got.is_contiguous(memory_format=fmt) == want.is_contiguous(memory_format=fmt)


def test_the_gemm_refuses_what_is_not_a_1x1_gemm(gemm: Any) -> None:
    x, w = torch.randn(1, 4, 5, 5), torch.randn(4, 4, 1, 1)
    for stride, padding in (((2, 2), 0), (1, 1), (1, (0, 1))):
        with pytest.raises(ValueError):
            gemm.conv2d(x, w, None, stride, padding, 1, 1)
    with pytest.raises(ValueError):
        gemm.conv2d(x, torch.randn(4, 4, 3, 3), None, 1, 1, 1, 1)
    with pytest.raises(ValueError, match="layout"):
        gemm.conv2d(x.transpose(2, 3), w, None, 1, 0, 1, 1)  # neither NCHW nor channels-last
    assert torch.equal(gemm.conv2d(x, w, None, 1, "valid", 2, 1), F.conv2d(x, w))


def _layer(cin: int, cout: int, k: int = 1, groups: int = 1, **kw: Any) -> Any:
    torch.manual_seed(1)
    conv = torch.nn.Conv2d(cin, cout, k, groups=groups, **kw).eval()
    bn = torch.nn.BatchNorm2d(cout).eval()
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    return conv, bn, torch.nn.SiLU()


@pytest.mark.parametrize("layout", ["nchw", "channels-last"])
def test_the_entry_runs_the_layer_as_a_gemm(gemm: Any, layout: str) -> None:
    conv, bn, act = _layer(288, 96, groups=96, bias=True)
    x = torch.randn(2, 288, 9, 7)
    if layout == "channels-last":
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        want = act(bn(conv(x)))
        spy = Convs()
        with spy:
            got = gemm.pointwise_conv2d(x, conv, bn=bn, act=act)
        assert torch.equal(gemm.pointwise_conv2d(x, conv), gemm.conv2d(x, conv.weight,
                           conv.bias, 1, 0, 1, 96))  # fmt: skip
    assert spy.count == 0, "the GEMM ran no convolution"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _stock_ran(gemm: Any, x: torch.Tensor, conv: Any, **kw: Any) -> bool:
    spy = Convs()
    with spy:
        got = gemm.pointwise_conv2d(x, conv, **kw)
    want = conv(x)
    for name in ("bn", "act"):
        if kw.get(name) is not None:
            want = kw[name](want)
    assert torch.equal(got, want)
    return spy.count == 1


def test_the_entry_runs_the_stock_modules_for_anything_else(gemm: Any) -> None:
    x = torch.randn(1, 8, 6, 6)
    conv, bn, act = _layer(8, 8)
    with torch.no_grad():
        assert not _stock_ran(gemm, x, conv, bn=bn, act=act)
        for other in (_layer(8, 8, 3, padding=1)[0], _layer(8, 8, stride=2)[0],
                      _layer(8, 8, padding=1)[0]):  # fmt: skip
            assert _stock_ran(gemm, x, other, bn=bn, act=act)
        assert not gemm.handled(x.half(), conv)  # a weight of another dtype

        class Mine(torch.nn.Conv2d):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return super().forward(x) * 2

        mine = Mine(8, 8, 1).eval()
        assert _stock_ran(gemm, x, mine)
        seen: list[int] = []
        handle = conv.register_forward_hook(lambda *_: seen.append(1))
        assert _stock_ran(gemm, x, conv) and seen  # the hook sees its module called
        handle.remove()
    # Autograd records the call: the stock modules, which have a backward.
    assert _stock_ran(gemm, x.requires_grad_(), conv)


def test_a_failing_gemm_is_the_stock_result_and_a_warning_that_cannot_raise(
    gemm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_args: Any) -> None:
        raise RuntimeError("no GEMM here")

    monkeypatch.setattr(gemm, "gemm", broken)
    conv, bn, act = _layer(8, 4)
    x = torch.randn(1, 8, 5, 5)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("error")  # python -W error: still no exception in the forward
        got = gemm.pointwise_conv2d(x, conv, bn=bn, act=act)
        torch.testing.assert_close(got, act(bn(conv(x))))
    assert any("1x1 conv as a GEMM failed" in str(w.message) for w in caught)


def test_the_op_is_registered_with_a_measured_verdict() -> None:
    assert OP in OPS and OP.measured_verdict and OP.fallback == "gemm"
    cases = {c.id for c in OP.cases}
    assert "pointwise-conv-288to96-g96-160x116-fp32" in cases  # DocLayout-YOLO's grouped 1x1
    assert "pointwise-conv-576to192-g192-80x58-fp32" in cases
    assert all(c.cpu["cin"] % c.cpu["g"] == 0 and c.cpu["cout"] % c.cpu["g"] == 0
               for c in OP.cases)  # fmt: skip
