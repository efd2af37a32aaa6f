"""Depthwise conv2d through the vendor library on channels-last tensors (rocmfix template,
scheme ``channels-last``: no Triton).

rocmfix dropped this file beside a conv-norm-act layer (transformers' HGNetV2, MinerU's ports of
PaddleOCR) and rewrote the layer's forward to call :func:`depthwise_conv2d` with its modules;
``rocmfix revert`` removes it. The conv runs as ``F.conv2d`` on a channels-last copy of the
input, which MIOpen and cuDNN serve from their NHWC depthwise kernels instead of the grouped
implicit GEMM their NCHW path falls to, then the layer's own BatchNorm and activation; the result
is made NCHW-contiguous again, as the layer returned it. Standard library and torch only (and
``rocmfix_kernel_support``, dropped beside it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from . import rocmfix_kernel_support as ks

SCHEME = "channels-last"


def _handled(x: torch.Tensor, conv: Any) -> bool:
    return (
        x.is_cuda
        and ks.plain(x, conv, torch.nn.Conv2d)
        and conv.groups == x.shape[1] == conv.weight.shape[0]
        and conv.weight.shape[1] == 1
        and conv.weight.dtype == x.dtype
        and not isinstance(conv.padding, str)
    )


def _channels_last(x: torch.Tensor, weight: torch.Tensor, *args: Any) -> torch.Tensor:
    """``F.conv2d(x, weight, *args)`` on channels-last copies of x and the weight."""
    last = torch.channels_last
    return F.conv2d(x.contiguous(memory_format=last), weight.contiguous(memory_format=last), *args)


def depthwise_conv2d(
    x: torch.Tensor,
    conv: Any,
    bn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    act: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """``act(bn(conv(x)))`` (``conv(x)`` / ``bn(conv(x))`` where they are None) for any input;
    depthwise convs of GPU tensors run channels-last. Anything else, and any error, runs the
    modules as the layer called them."""
    if not _handled(x, conv):
        return ks.stock(x, conv, bn, act)
    try:
        y = _channels_last(x, conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation,
                           conv.groups)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - never take the model down
        y = ks.stock(x, conv, bn, act)  # the stock result first, then the report
        ks.failed("the channels-last depthwise conv", exc)
        return y
    if bn is not None:
        y = bn(y)
    if act is not None:
        y = act(y)
    return y.contiguous()


def conv2d(x: torch.Tensor, weight: torch.Tensor, bias: Any, *call: Any) -> torch.Tensor:
    """``F.conv2d`` of a depthwise conv as this scheme runs it (a channels-last copy, then
    NCHW again), as ``rocmfix profile`` replays it; NotImplementedError for any other call."""
    stride, padding, dilation, groups = call
    if not (x.dim() == 4 and groups == x.shape[1] == weight.shape[0]):
        raise NotImplementedError("not a depthwise conv")
    if weight.shape[1] != 1 or isinstance(padding, str):
        raise NotImplementedError("not a depthwise conv with padding on both sides")
    return _channels_last(x, weight, bias, stride, padding, dilation, groups).contiguous()
