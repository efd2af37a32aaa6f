"""Qwen2-VL patch embedding through the vendor BLAS (rocmfix scheme ``linear``).

rocmfix dropped this file beside a Qwen-VL vision tower (vllm's ``qwen2_vl_vision_kernels.py``,
transformers' ``rocmfix_patch_embed.py``) and rewrote the patch embed's ``forward`` to call
:func:`triton_conv3d_patchify` instead of the Conv3d. ``rocmfix revert`` removes it.

The conv has kernel == stride and no padding, so it is ``F.linear`` on the flattened patches:
rocBLAS/hipBLASLt on ROCm, cuBLAS on CUDA. This is what vllm upstream later did itself
(``Conv3dLayer._forward_mulmat``), minus its unfold/permute copy, since vllm already hands the
patches over as ``[L, C*T*P*P]``. No Triton, no custom op: ``F.linear`` already works under
torch.compile and graph capture.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

SCHEME = "linear"


def triton_conv3d_patchify(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Conv3d with kernel == stride on ``x[L, C, T, P, P]`` and ``weight[N, C, T, P, P]``.

    Returns ``[L, N]`` in ``x``'s dtype. (The name is kept so the patched forward is the same
    for every scheme.)
    """
    if not x.is_cuda:
        # CPU inputs keep the stock op, bit for bit.
        return F.conv3d(x, weight, bias, stride=tuple(weight.shape[2:])).flatten(1)
    # flatten(1), not reshape(L, -1): the latter is ambiguous for an empty batch.
    w = weight.flatten(1)
    if w.dtype != x.dtype:
        w = w.to(x.dtype)
    if bias is not None and bias.dtype != x.dtype:
        bias = bias.to(x.dtype)
    return F.linear(x.flatten(1), w, bias)


def conv3d(x: torch.Tensor, weight: torch.Tensor, bias: Any, *call: Any) -> torch.Tensor:
    """``F.conv3d`` of GPU tensors, one patch a row (the kernel the input's size, no padding,
    no dilation, one group), through ``F.linear``, as ``rocmfix profile`` replays it;
    NotImplementedError for any other call."""
    _stride, padding, dilation, groups = call  # one patch a row: any stride
    one = x.dim() == 5 and x.shape[2:] == weight.shape[2:] and groups == 1
    if not (one and x.is_cuda and padding == [0, 0, 0] and dilation == [1, 1, 1]):
        raise NotImplementedError("not one patch a row of GPU tensors")
    return triton_conv3d_patchify(x, weight, bias)[:, :, None, None, None]
