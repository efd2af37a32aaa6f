"""What the kernel entries must leave to the stock op even with a plan in hand: autocast
(the stock op computes in autocast's dtype, a kernel keeps x's), a ``torch.jit`` trace (it
records no Triton launch) and, for the depthwise conv, a weight whose shape changed in place.
Each test runs the entry once first, so a replay is what it would take. The entries:
templates/depthwise_conv_triton.py, dilated_conv_triton.py, patch_embed_gemm.py.

The kernel runs in Triton's CPU interpreter (``TRITON_INTERPRET=1`` while the template is
imported), on small fp32 inputs.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from types import ModuleType

import pytest
import torch

from conftest import load_template

pytest.importorskip("triton")
# torch.jit.trace is deprecated, and what these tests prove is that a trace stays correct.
pytestmark = [
    pytest.mark.usefixtures("no_kernel_config"),
    pytest.mark.filterwarnings("ignore:`torch.jit.trace:FutureWarning"),
]


@pytest.fixture(scope="module")
def tri() -> ModuleType:
    return load_template("depthwise_conv_triton")


@pytest.fixture(scope="module")
def dil() -> ModuleType:
    return load_template("dilated_conv_triton")


@pytest.fixture(scope="module")
def pe() -> ModuleType:
    return load_template("patch_embed_gemm")


def _planned(tri: ModuleType, conv: torch.nn.Conv2d, x: torch.Tensor) -> None:
    tri.clear_config_cache()
    with torch.no_grad():
        torch.testing.assert_close(tri.depthwise_conv2d(x, conv), conv(x))
    assert len(tri._plans), "the kernel never ran"


def test_autocast_runs_the_stock_layer_in_its_dtype(tri: ModuleType) -> None:
    """Under autocast the stock conv computes and returns bf16; the kernel would keep fp32."""
    conv = torch.nn.Conv2d(4, 4, 3, 1, 1, groups=4).eval()
    bn, act = torch.nn.BatchNorm2d(4).eval(), torch.nn.ReLU()
    x = torch.randn(1, 4, 9, 7)
    _planned(tri, conv, x)
    with torch.no_grad():
        tri.depthwise_conv2d(x, conv, bn, act)  # and the fused plan
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for y_bn, y_bare in ((bn, None), (None, None)):
                got = tri.depthwise_conv2d(x, conv, y_bn, act if y_bn else y_bare)
                want = act(bn(conv(x))) if y_bn else conv(x)
                assert got.dtype == want.dtype == torch.bfloat16
                torch.testing.assert_close(got, want)


def test_a_jit_trace_records_the_stock_conv(tri: ModuleType) -> None:
    """A Triton launch is invisible to torch.jit's tracer: a trace must hold the conv."""
    conv = torch.nn.Conv2d(4, 4, 3, 1, 1, groups=4, bias=False).eval()
    x = torch.randn(1, 4, 9, 7)
    _planned(tri, conv, x)

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = conv

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            y: torch.Tensor = tri.depthwise_conv2d(t, self.conv)
            return y

    with torch.no_grad():
        traced = torch.jit.trace(Layer(), x, check_trace=False)
        other = torch.randn(1, 4, 9, 7)
        torch.testing.assert_close(traced(other), conv(other))
    assert "aten::_convolution" in str(traced.inlined_graph)


def test_a_weight_transposed_in_place_is_planned_anew(tri: ModuleType) -> None:
    """Same tensor, same address: a 3x5 kernel turned 5x3 by ``transpose_`` (its version
    moves) must not replay the old view of it."""
    conv = torch.nn.Conv2d(4, 4, (3, 5), 1, (2, 2), groups=4, bias=False).eval()
    x = torch.randn(1, 4, 9, 8)
    _planned(tri, conv, x)
    with torch.no_grad():
        conv.weight.transpose_(2, 3)
        torch.testing.assert_close(tri.depthwise_conv2d(x, conv), conv(x))


def _traced_holds(fn: object, x: torch.Tensor, op: str) -> torch.jit.ScriptModule:
    class Wrap(torch.nn.Module):
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            y: torch.Tensor = fn(t)  # type: ignore[operator]
            return y

    with torch.no_grad():
        traced = torch.jit.trace(Wrap(), x, check_trace=False)
    assert op in str(traced.inlined_graph)
    return traced


def test_the_dilated_entry_under_autocast_and_a_jit_trace(dil: ModuleType) -> None:
    w = torch.randn(4, 4, 3, 3)
    x = torch.randn(1, 4, 11, 9)

    def want(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv2d(t, w, None, 1, 2, 2)

    with torch.no_grad():
        torch.testing.assert_close(dil.dilated_conv2d(x, w, 2, 2), want(x))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got, ref = dil.dilated_conv2d(x, w, 2, 2), want(x)
        assert got.dtype == ref.dtype == torch.bfloat16
        torch.testing.assert_close(got, ref)
    traced = _traced_holds(lambda t: dil.dilated_conv2d(t, w, 2, 2), x, "aten::_convolution")
    other = torch.randn(1, 4, 11, 9)
    torch.testing.assert_close(traced(other), want(other))


def test_the_patch_embed_entry_under_autocast_and_a_jit_trace(pe: ModuleType) -> None:
    w, b = torch.randn(8, 3, 2, 4, 4), torch.randn(8)
    x = torch.randn(5, 3, 2, 4, 4)

    def want(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv3d(t, w, b, stride=(2, 4, 4)).flatten(1)

    with torch.no_grad():
        torch.testing.assert_close(pe.triton_conv3d_patchify(x, w, b), want(x))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got, ref = pe.triton_conv3d_patchify(x, w, b), want(x)
        assert got.dtype == ref.dtype == torch.bfloat16
        torch.testing.assert_close(got, ref)
    traced = _traced_holds(lambda t: pe.triton_conv3d_patchify(t, w, b), x, "aten::_convolution")
    other = torch.randn(5, 3, 2, 4, 4)
    torch.testing.assert_close(traced(other), want(other))
