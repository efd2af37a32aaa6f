"""1x1 convs (stride 1, no padding), dense or grouped, as vendor GEMMs (rocmfix template,
scheme ``gemm``: no Triton).

rocmfix dropped this file beside a conv-norm-act layer (DocLayout-YOLO's ``Conv``) and rewrote
the layer's forward to call :func:`pointwise_conv2d` with its modules; ``rocmfix revert``
removes it. MIOpen runs 1x1 convs 2-4x slower than a GEMM in fp16 NHWC and can fall to its
naive kernel in fp32 (KataGo#1237); PyTorch's own path without a conv library runs a grouped
one group by group. A 1x1 conv is exactly one matmul in the layout the caller has: NCHW
``W[Cout, Cin] @ x.view(N, Cin, H*W)``, channels-last ``x.view(N*H*W, Cin) @ W^T``, and a
grouped one the same per group, one batched GEMM over the groups (rocBLAS/hipBLASLt, cuBLAS),
the bias folded in where the GEMM takes it. The layer's own BatchNorm and activation follow as
modules, as the layer called them. Standard library and torch only (and
``rocmfix_kernel_support``, dropped beside it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import rocmfix_kernel_support as ks

SCHEME = "gemm"
_LAST = torch.channels_last


def pointwise(weight: torch.Tensor, stride: Any, padding: Any, groups: int) -> bool:
    """Whether a conv with these settings is a GEMM: a 1x1 kernel, stride 1, no padding
    (dilation changes nothing at 1x1), and more than one channel in or out per group. One in
    and one out per group is a per-channel scale with no GEMM in it: as a batched GEMM of 1x1
    matrices it took 2-4x the vendor's own time (H100, docs/performance-pointwise.md)."""
    return (
        weight.dim() == 4
        and tuple(weight.shape[2:]) == (1, 1)
        and ks.pair(stride) == (1, 1)
        and (padding in ("valid", "same") or ks.pair(padding) == (0, 0))
        and type(groups) is int
        and groups > 0
        and weight.shape[0] % groups == 0
        and (weight.shape[1] > 1 or weight.shape[0] > groups)
    )


def gemm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, groups: int
) -> torch.Tensor | None:
    """``F.conv2d(x, weight, bias, groups=groups)`` of a 1x1 conv as one (batched) GEMM, its
    output in the layout F.conv2d gives; None for an input layout it does not take (neither
    NCHW-contiguous with a contiguous weight nor channels-last)."""
    n, cin, h, w = (int(d) for d in x.shape)
    cout, g = int(weight.shape[0]), groups
    cig, cog = cin // g, cout // g
    wg = weight.reshape(g, cog, cig)
    if x.is_contiguous() and weight.is_contiguous():
        # (g, cog, cig) @ (n, g, cig, HW): no copy of x; one plain batched GEMM for a batch of one.
        xg = x.view(n, g, cig, h * w)
        if n == 1 and bias is not None:
            y = torch.baddbmm(bias.view(g, cog, 1), wg, xg[0])
        elif n == 1:
            y = torch.bmm(wg, xg[0])
        else:
            y = torch.matmul(wg, xg)
            if bias is not None:
                y = y.add_(bias.view(g, cog, 1))
        return y.view(n, cout, h, w)
    if not x.is_contiguous(memory_format=_LAST):
        return None
    rows = x.permute(0, 2, 3, 1).reshape(n * h * w, cin)  # a view: the pixels as rows
    if g == 1:
        wt = wg[0].t()
        y = torch.mm(rows, wt) if bias is None else torch.addmm(bias, rows, wt)
        return y.view(n, h, w, cout).permute(0, 3, 1, 2)
    # Per group: (pixels, cig) @ (cig, cog), the groups as the batch, then back to pixel rows.
    xg, wt = rows.view(-1, g, cig).transpose(0, 1), wg.transpose(1, 2)
    y = torch.bmm(xg, wt) if bias is None else torch.baddbmm(bias.view(g, 1, cog), xg, wt)
    # contiguous(): a reshape of the transpose can be a view in neither layout (one output
    # channel a group).
    return y.transpose(0, 1).contiguous().view(n, h, w, cout).permute(0, 3, 1, 2)


def conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> torch.Tensor:
    """``F.conv2d`` with its arguments where it is a GEMM (what ``rocmfix profile`` replays);
    NotImplementedError for any other conv or input layout."""
    if x.dim() != 4 or not pointwise(weight, stride, padding, groups):
        raise NotImplementedError("not a 1x1, stride-1, unpadded conv")
    y = gemm(x, weight, bias, groups)
    if y is None:
        raise NotImplementedError("an input layout that is neither NCHW nor channels-last")
    return y


def handled(x: torch.Tensor, conv: Any) -> bool:
    """Whether :func:`gemm` computes ``conv(x)``: a plain ``nn.Conv2d`` with a 1x1 kernel,
    stride 1, no padding, no hooks, in x's dtype and on x's device, outside autograd and
    autocast."""
    if not (
        isinstance(x, torch.Tensor) and ks.plain(x, conv, torch.nn.Conv2d) and not ks.global_hooks()
    ):
        return False
    weight, bias = conv.weight, conv.bias
    return (
        pointwise(weight, conv.stride, conv.padding, conv.groups)
        and weight.shape[1] * conv.groups == x.shape[1]
        and weight.dtype == x.dtype
        and weight.device == x.device
        and (bias is None or (bias.dtype == x.dtype and bias.device == x.device))
        and not ks.training(x, weight, bias)
        and not ks.any_autocast()
    )


def pointwise_conv2d(
    x: torch.Tensor,
    conv: Any,
    bn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    act: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """``act(bn(conv(x)))`` (``conv(x)`` / ``bn(conv(x))`` where they are None) for any input;
    a 1x1 conv runs as a GEMM. Anything else, and any error, runs the modules as the layer
    called them."""
    try:
        y = gemm(x, conv.weight, conv.bias, conv.groups) if handled(x, conv) else None
    except Exception as exc:  # noqa: BLE001 - never take the model down
        y = ks.stock(x, conv, bn, act)  # the stock result first, then the report
        ks.failed("the 1x1 conv as a GEMM", exc)
        return y
    if y is None:
        return ks.stock(x, conv, bn, act)
    if bn is not None:
        y = bn(y)
    if act is not None:
        y = act(y)
    return y
