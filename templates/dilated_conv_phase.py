"""Dilated conv2d as one dense conv over the input's phases (rocmfix template, no Triton).

rocmfix dropped this file into ``doclayout_yolo/nn/modules/`` as ``g2l_crm_triton.py`` and rewrote
``DilatedBlock.dilated_conv`` to call :func:`dilated_conv2d` for GPU inputs with the block's
``bn`` and ``act``, which it calls on the conv's output.  ``rocmfix revert`` removes this file
and restores the original method.

Why: on ROCm, MIOpen has no fast solver for dilation > 1 and falls back to a naive kernel, while
its dense (dilation 1) kernels are fast.  A conv with dilation ``d`` equals a dense conv over the
``d*d`` strided phases ``x[..., a::d, b::d]`` of the (padded) input.  All phases are made the same
size, stacked into the batch dimension, convolved by ONE ``F.conv2d`` call with dilation 1, then
interleaved back and cropped.  No convolution with dilation > 1 is issued, so the vendor library's
fast dense kernels do the work.  Plain torch ops: works on any device, and autograd works too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

SCHEME = "linear"


def _pair(v: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"expected an int or a pair, got {v!r}")
        return int(v[0]), int(v[1])
    return int(v), int(v)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _phase_geometry(size: int, pad: int, d: int, k: int) -> tuple[int, int, int, int, int]:
    """(front pad, back pad, phase length, dense-conv padding, output size) along one axis.

    With ``pad = q*d + f``, padding the input by ``f`` in front turns the conv's padding into a
    whole number ``q`` of zeros per phase; the back is padded until every phase has the length
    ``length`` that yields at least ``ceil(out/d)`` outputs.
    """
    out = size + 2 * pad - d * (k - 1)
    q, f = pad // d, pad % d  # not divmod: dynamo does not trace it on symbolic ints
    length = max(_cdiv(f + size, d), _cdiv(out, d) + k - 1 - 2 * q)
    back = length * d - (f + size)
    return f, back, length, q, out


def dilated_conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    dilation: int,
    padding: int | tuple[int, int],
    *,
    bn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    act: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """``F.conv2d(x, weight, None, stride=1, padding=padding, dilation=dilation)`` computed
    through a single dilation-1 ``F.conv2d`` over the ``dilation**2`` phases of ``x``, then
    ``act(bn(...))`` where they are given (the block's own modules, called as it calls them).

    The result may be a non-contiguous view (a crop of the interleaved phases).
    """
    y = _conv(x, weight, dilation, padding)
    if bn is not None:
        y = bn(y)
    return y if act is None else act(y)


def _is_compiling() -> bool:
    # torch.compiler.is_compiling arrived in torch 2.3; before it, the eager moves (a graph
    # break under torch.compile, still the right answer).
    check = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(check()) if check is not None else False


def _conv(
    x: torch.Tensor, weight: torch.Tensor, dilation: int, padding: int | tuple[int, int]
) -> torch.Tensor:
    d = dilation
    if isinstance(d, (tuple, list)):
        if len(set(d)) != 1:
            return F.conv2d(x, weight, None, 1, padding, d)
        d = d[0]
    d = int(d)
    pad_h, pad_w = _pair(padding)
    if d == 1 or x.dim() != 4 or weight.dim() != 4 or x.shape[0] == 0 or d < 1:
        return F.conv2d(x, weight, None, 1, (pad_h, pad_w), d)
    n, c, h, w = x.shape
    co, _, kh, kw = weight.shape
    if (
        pad_h < 0
        or pad_w < 0
        or h + 2 * pad_h - d * (kh - 1) < 1
        or w + 2 * pad_w - d * (kw - 1) < 1
    ):
        return F.conv2d(x, weight, None, 1, (pad_h, pad_w), d)  # torch raises its own error
    f_h, b_h, l_h, q_h, oh = _phase_geometry(h, pad_h, d, kh)
    f_w, b_w, l_w, q_w, ow = _phase_geometry(w, pad_w, d, kw)
    if f_h or b_h or f_w or b_w:
        x = F.pad(x, (f_w, b_w, f_h, b_h))
    # Each torch call costs host time, and DocLayout-YOLO's batch-1 forward is launch-bound:
    # a strided view, a copy and a view each way (reshape of a view it cannot keep costs
    # twice contiguous() on the host; a reshape/permute/reshape chain more).
    # Phase (a, b) holds x[n, c, i*d + a, j*d + b]: [d(a), d(b), N, C, Lh, Lw], then one copy
    # into a batch of d*d*N phase images.
    # Under torch.compile the same moves as views dynamo can trace (it does not trace
    # as_strided's integer strides, a graph break per call) and host time is not spent.
    compiling = _is_compiling()
    if compiling:
        phases = (
            x.reshape(n, c, l_h, d, l_w, d)
            .permute(3, 5, 0, 1, 2, 4)
            .reshape(d * d * n, c, l_h, l_w)
        )
    else:
        sn, sc, sh, sw = x.stride()
        phases = (
            x.as_strided(
                (d, d, n, c, l_h, l_w), (sh, sw, sn, sc, sh * d, sw * d), x.storage_offset()
            )
            .contiguous()
            .view(d * d * n, c, l_h, l_w)
        )
    y = F.conv2d(phases, weight, None, 1, (q_h, q_w), 1)
    _, _, ph, pw = y.shape
    if compiling:
        y = y.view(d, d, n, co, ph, pw).permute(2, 3, 4, 0, 5, 1).reshape(n, co, ph * d, pw * d)
        return y if oh == ph * d and ow == pw * d else y[:, :, :oh, :ow]
    # Phase (a, b)'s output (i, j) lands at row i*d + a, column j*d + b.
    yn, yc, yh, yw = y.stride()
    y = (
        y.as_strided(
            (n, co, ph, d, pw, d), (yn, yc, yh, d * n * yn, yw, n * yn), y.storage_offset()
        )
        .contiguous()
        .view(n, co, ph * d, pw * d)
    )
    if oh == ph * d and ow == pw * d:
        return y
    return y[:, :, :oh, :ow]


def conv2d(x: torch.Tensor, weight: torch.Tensor, bias: Any, *call: Any) -> torch.Tensor:
    """``F.conv2d`` of a dilated conv (stride 1, one dilation > 1 for both axes, one group)
    through the phase split, as ``rocmfix profile`` replays it; NotImplementedError for any
    other call."""
    stride, padding, dilation, groups = call
    d = dilation[0]
    if x.dim() != 4 or groups != 1 or stride != [1, 1] or dilation != [d, d] or d < 2:
        raise NotImplementedError("not a stride-1 dilated conv")
    if isinstance(padding, str):
        raise NotImplementedError("padding on one side only")
    y = dilated_conv2d(x, weight, d, (padding[0], padding[1]))
    return y if bias is None else y + bias.view(1, -1, 1, 1)
