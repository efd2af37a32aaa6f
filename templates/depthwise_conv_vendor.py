"""Depthwise conv2d through the vendor library on channels-last tensors (rocmfix template,
scheme ``channels-last``: no Triton).

rocmfix dropped this file beside a conv-norm-act layer (transformers' HGNetV2, MinerU's ports of
PaddleOCR) and rewrote the layer's forward to call :func:`depthwise_conv2d` with its modules;
``rocmfix revert`` removes it. The conv runs as ``F.conv2d`` on a channels-last copy of the
input, which MIOpen and cuDNN serve from their NHWC depthwise kernels instead of the grouped
implicit GEMM their NCHW path falls to, then the layer's own BatchNorm and activation; the result
is made NCHW-contiguous again, as the layer returned it. Standard library and torch only.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

SCHEME = "channels-last"
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_warned: set[str] = set()


def _warn_once(message: str) -> None:
    # A model calls this thousands of times a page: one warning per kind of failure.
    key = message.split("(")[1].split(":")[0] if "(" in message else message
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _stock(
    x: torch.Tensor,
    conv: Any,
    bn: Callable[[torch.Tensor], torch.Tensor] | None,
    act: Callable[[torch.Tensor], torch.Tensor] | None,
) -> torch.Tensor:
    y: torch.Tensor = conv(x)
    if bn is not None:
        y = bn(y)
    if act is not None:
        y = act(y)
    return y


def _handled(x: torch.Tensor, conv: Any) -> bool:
    return (
        x.is_cuda
        and isinstance(conv, torch.nn.Conv2d)
        and type(conv).forward is torch.nn.Conv2d.forward
        and type(conv)._conv_forward is torch.nn.Conv2d._conv_forward
        and not conv._forward_hooks
        and not conv._forward_pre_hooks
        and conv.padding_mode == "zeros"
        and x.dim() == 4
        and x.dtype in SUPPORTED_DTYPES
        and conv.groups == x.shape[1] == conv.weight.shape[0]
        and conv.weight.shape[1] == 1
        and conv.weight.dtype == x.dtype
        and not isinstance(conv.padding, str)
    )


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
        return _stock(x, conv, bn, act)
    try:
        xin = x.contiguous(memory_format=torch.channels_last)
        w = conv.weight.contiguous(memory_format=torch.channels_last)
        y = F.conv2d(xin, w, conv.bias, conv.stride, conv.padding, conv.dilation, conv.groups)
    except Exception as exc:  # noqa: BLE001 - never take the model down
        _warn_once(
            f"rocmfix: the channels-last depthwise conv failed ({type(exc).__name__}: {exc}); "
            "running the stock modules",
        )
        return _stock(x, conv, bn, act)
    if bn is not None:
        y = bn(y)
    if act is not None:
        y = act(y)
    return y.contiguous()
