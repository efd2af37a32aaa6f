"""A transposed conv whose kernel equals its stride as one vendor GEMM and a pixel shuffle
(rocmfix template, scheme ``linear``: no Triton).

rocmfix dropped this file beside a layer that calls an ``nn.ConvTranspose2d`` with kernel ==
stride (the DB text detector's head in MinerU's port of PaddleOCR: 2x2, stride 2) and rewrote
the call to :func:`conv_transpose2d`; ``rocmfix revert`` removes it. MIOpen runs these
transposed convs up to 20x slower than cuDNN (MIOpen#3952), and they are exactly a GEMM: each
input pixel's Cin values times the weight viewed as [Cin, Cout*k*k] gives the k x k output block
it alone writes. So: one batched matmul (rocBLAS/hipBLASLt, cuBLAS) straight from the NCHW or
channels-last input, then one elementwise pass that adds the bias while it moves each block to
its place. Standard library and torch only (and ``rocmfix_kernel_support``, dropped beside it);
works under torch.compile and graph capture.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from . import rocmfix_kernel_support as ks

SCHEME = "linear"
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_warned: set[str] = set()


def _warn_once(message: str) -> None:
    # A model calls this thousands of times a page: one warning per kind of failure.
    key = message.split("(")[1].split(":")[0] if "(" in message else message
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _pair(v: Any) -> tuple[int, int] | None:
    if type(v) is int:
        return v, v
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(type(i) is int for i in v):
        return int(v[0]), int(v[1])
    return None


def handled(x: torch.Tensor, deconv: Any) -> bool:
    """Whether the GEMM computes ``deconv(x)``: kernel == stride, no padding, no overlap."""
    if not (
        isinstance(deconv, torch.nn.ConvTranspose2d)
        and type(deconv).forward is torch.nn.ConvTranspose2d.forward
        and not deconv._forward_hooks
        and not deconv._forward_pre_hooks
        and deconv.padding_mode == "zeros"
        and x.dim() == 4
        and x.dtype in SUPPORTED_DTYPES
        and x.shape[0] > 0
    ):
        return False
    weight = deconv.weight
    k = (int(weight.shape[2]), int(weight.shape[3]))
    return (
        deconv.groups == 1
        and weight.shape[0] == x.shape[1]
        and weight.dtype == x.dtype
        and weight.device == x.device
        and _pair(deconv.stride) == k
        and _pair(deconv.padding) == (0, 0)
        and _pair(deconv.output_padding) == (0, 0)
        and _pair(deconv.dilation) == (1, 1)
        and (deconv.bias is None or deconv.bias.dtype == x.dtype)
    )


def gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.conv_transpose2d(x, weight, bias, stride=kernel)`` as a GEMM + pixel shuffle."""
    n, cin, h, w = x.shape
    _, cout, kh, kw = weight.shape
    wm = weight.view(cin, cout * kh * kw) if weight.is_contiguous() else weight.reshape(cin, -1)
    if x.is_contiguous():
        # NCHW: y[n, (co, i, j), hw] = W^T @ x[n], no copy of x; one GEMM for a batch of one.
        if n == 1:
            y = torch.mm(wm.t(), x.view(cin, h * w))
        else:
            y = torch.matmul(wm.t(), x.view(n, cin, h * w))
        blocks = y.view(n, cout, kh, kw, h, w).permute(0, 1, 4, 2, 5, 3)
    else:
        # Channels-last (or any other layout): the pixels as rows.
        y = torch.matmul(x.permute(0, 2, 3, 1).reshape(n, h * w, cin), wm)
        blocks = y.view(n, h, w, cout, kh, kw).permute(0, 3, 1, 4, 2, 5)
    out = torch.empty((n, cout, h * kh, w * kw), dtype=x.dtype, device=x.device)
    target = out.view(n, cout, h, kh, w, kw)
    if bias is None:
        target.copy_(blocks)
    else:
        torch.add(blocks, bias.view(1, cout, 1, 1, 1, 1), out=target)
    return out


# Calls already checked, by everything handled() reads but the tensors' contents: a model
# calls each of its layers once a forward with the same input layout.
_checked: ks.BoundedCache[tuple[Any, ...], bool] = ks.BoundedCache(256)


def conv_transpose2d(x: torch.Tensor, deconv: Any) -> torch.Tensor:
    """``deconv(x)`` for any input: a kernel == stride ``nn.ConvTranspose2d`` on GPU tensors
    (outside autograd) runs as one GEMM and a pixel shuffle; anything else, and any error, calls
    the module itself."""
    params = getattr(deconv, "_parameters", None)
    if not x.is_cuda or params is None:
        return deconv(x)  # type: ignore[no-any-return]
    weight, bias = params.get("weight"), params.get("bias")
    if weight is None or (
        torch.is_grad_enabled()
        and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
    ):
        return deconv(x)  # type: ignore[no-any-return]
    key = (id(deconv), id(weight), id(bias), x.shape, x.dtype, x.device, deconv.stride,
           deconv.padding, deconv.output_padding, deconv.dilation, deconv.groups)  # fmt: skip
    ok = _checked.get(key)
    if ok is None:
        ok = handled(x, deconv)
        _checked.put(key, ok)
    if not ok or deconv._forward_hooks or deconv._forward_pre_hooks or ks.global_hooks():
        return deconv(x)  # type: ignore[no-any-return]
    try:
        return gemm(x, weight, bias)
    except Exception as exc:  # noqa: BLE001 - never take the model down
        _warn_once(
            f"rocmfix: the transposed conv as a GEMM failed ({type(exc).__name__}: {exc}); "
            "running the module",
        )
        return deconv(x)  # type: ignore[no-any-return]
