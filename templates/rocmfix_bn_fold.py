"""A block's eval-mode BatchNorm (and SiLU) as a per-channel scale and shift (rocmfix template,
shared by the dilated-conv schemes).

rocmfix drops this file, under this name, beside the dilated-conv module it drops into
DocLayout-YOLO; ``rocmfix revert`` removes it with them. The schemes import it relatively, so
the copy they use is always the one dropped with them. Standard library and torch only.

Why: ``DilatedBlock.dilated_conv`` returns ``act(bn(conv))``. Each module call is one more pass
over the conv's output and, at batch 1, where the forward is launch-bound, 15-20 µs of host
time. A Triton kernel applies ``y * scale + shift`` (then SiLU) as it stores; the phase split's
vendor conv takes the fold as its weight and bias (:func:`conv_weight`), so its BatchNorm no
longer runs on the cropped, non-contiguous view that BatchNorm first copies. A plain dense
conv gains nothing from the fold: cuDNN and MIOpen add a bias in a kernel of its own, and the
fold's checks cost what the module calls did (measured on an H200).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # a runtime tuple[...] needs Python 3.9; the templates run on 3.8 too
    # (scale, shift, code): code 1 applies y * scale + shift per output channel, 2 then SiLU.
    Epilogue = tuple[torch.Tensor, torch.Tensor, int]

IDENTITY, SILU = 1, 2
_ACTS = {torch.nn.Identity: IDENTITY, torch.nn.SiLU: SILU}
FOLDED: dict[int, tuple[Any, ...]] = {}
WEIGHTS: dict[int, tuple[Any, ...]] = {}
CACHE_SIZE = 256
_LOCK = threading.Lock()


def conv_bn_act(
    conv: Callable[..., torch.Tensor],
    x: torch.Tensor,
    weight: torch.Tensor,
    bn: Any,
    act: Any,
    *args: Any,
) -> torch.Tensor:
    """``act(bn(conv(x, weight, None, *args)))`` for a vendor conv: where the fold applies,
    ``conv(x, weight * scale, shift, *args)`` and SiLU in place on its output (``conv``
    returns a tensor of its own or a view of one), else the modules as the block calls them."""
    fold = epilogue(bn, act) if bn is not None else None
    fused = conv_weight(fold, x, weight) if fold is not None else None
    if fold is None or fused is None:
        return modules(conv(x, weight, None, *args), bn, act)
    y = conv(x, fused[0], fused[1], *args)
    return F.silu(y, inplace=True) if fold[2] == SILU else y


def modules(y: torch.Tensor, bn: Any, act: Any) -> torch.Tensor:
    """``act(bn(y))``, as the block calls them; either may be None."""
    if bn is not None:
        y = bn(y)
    return y if act is None else act(y)


def epilogue(bn: Any, act: Any) -> Epilogue | None:
    """``act(bn(y))`` as a per-channel scale and shift (and SiLU), for an ``nn.BatchNorm2d`` in
    eval mode with running statistics and an ``nn.SiLU``/``nn.Identity``/None activation;
    None for anything else, or where the modules must be called: a subclass, a hook that
    would see the call, train mode, or autograd recording through the BatchNorm's
    parameters (the fold is a constant to autograd).

    The fold is computed once per module and reused while its statistics, affine parameters
    and eps are the same tensors at the same addresses and versions (an in-place update, a
    ``load_state_dict`` or a ``.to()`` moves one of them).
    """
    code = IDENTITY if act is None else _ACTS.get(type(act))
    if (
        code is None
        or type(bn) is not torch.nn.BatchNorm2d
        or bn.training
        or bn._forward_hooks
        or bn._forward_pre_hooks
        or (act is not None and (act._forward_hooks or act._forward_pre_hooks))
        or _global_hooks()
    ):
        return None
    buffers, params = bn._buffers, bn._parameters
    tensors = (
        buffers.get("running_mean"),
        buffers.get("running_var"),
        params.get("weight"),
        params.get("bias"),
    )
    if tensors[0] is None or tensors[1] is None:
        return None  # no running statistics: BatchNorm uses the batch's, even in eval
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return None
    if any(t is not None and t.is_inference() for t in tensors):
        # Inference tensors (a model built under inference_mode) have no version to see an
        # update by (asking one raises, slowly): the modules run as the block calls them.
        return None
    state = tuple((t, t.data_ptr(), t._version) if t is not None else None for t in tensors)
    folded = FOLDED.get(id(bn))
    if folded is None or folded[0] != bn.eps or not _same(folded[1], state):
        scale, shift = _fold(tensors, bn.eps)
        folded = (bn.eps, state, scale, shift)
        with _LOCK:
            if len(FOLDED) >= CACHE_SIZE:
                FOLDED.clear()
            FOLDED[id(bn)] = folded
    return folded[2], folded[3], code


def clear() -> None:
    """Forget every fold (for ``rocmfix tune`` and tests)."""
    with _LOCK:
        FOLDED.clear()
        WEIGHTS.clear()


def fits(
    fold: Epilogue, x: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype | None = None
) -> bool:
    """Whether the fold can be applied to this conv's output: its device, its channels, and
    the dtype a kernel reads the fold in where it needs one."""
    scale = fold[0]
    return (
        scale.device == x.device
        and scale.numel() == weight.shape[0]
        and (dtype is None or scale.dtype == dtype)
    )


def conv_weight(
    fold: Epilogue, x: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(weight * scale, shift)``: a conv with these as weight and bias computes
    ``bn(conv(x, weight))``. Made once per weight and fold, and again when the weight is
    updated; None where the fold does not fit this conv, autograd records through the weight,
    the weight has no version to see updates by, or the product leaves the weight's dtype's
    range (a half-precision weight times a large scale)."""
    scale, shift = fold[0], fold[1]
    if not fits(fold, x, weight) or (torch.is_grad_enabled() and weight.requires_grad):
        return None
    if weight.is_inference():  # no version to see updates by (asking one raises, slowly)
        return None
    state = (weight.data_ptr(), weight._version)
    seen = WEIGHTS.get(id(weight))
    if seen is not None and seen[0] is weight and seen[1] is scale and seen[2] == state:
        cached: tuple[torch.Tensor, torch.Tensor] | None = seen[3]
        return cached
    dtype = torch.promote_types(weight.dtype, scale.dtype)
    shape = (-1,) + (1,) * (weight.dim() - 1)
    with torch.no_grad():
        w = (weight.to(dtype) * scale.view(shape)).to(weight.dtype)
        fused = (w, shift.to(weight.dtype)) if bool(torch.isfinite(w).all()) else None
    with _LOCK:
        if len(WEIGHTS) >= CACHE_SIZE:
            WEIGHTS.clear()
        # Holding the weight and the scale keeps their ids from being reused while cached.
        WEIGHTS[id(weight)] = (weight, scale, state, fused)
    return fused


def _same(seen: tuple[Any, ...], now: tuple[Any, ...]) -> bool:
    # The fold holds the tensors it was made from, so `is` cannot match a new tensor that
    # reuses a freed one's id.
    return all(
        (a is None and b is None)
        or (a is not None and b is not None and a[0] is b[0] and a[1:] == b[1:])
        for a, b in zip(seen, now)
    )


def _fold(tensors: tuple[Any, ...], eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    mean, var, gamma, beta = tensors
    # In fp32 at least, as BatchNorm computes for a half-precision input; a float64 model's
    # fold stays float64.
    dtype = torch.promote_types(var.dtype, torch.float32)
    with torch.no_grad():
        scale = torch.rsqrt(var.to(dtype) + eps)
        if gamma is not None:
            scale = scale * gamma.to(dtype)
        shift = -mean.to(dtype) * scale
        if beta is not None:
            shift = shift + beta.to(dtype)
    return scale.contiguous(), shift.contiguous()


def _global_hooks() -> bool:
    module = torch.nn.modules.module
    return bool(
        getattr(module, "_global_forward_hooks", None)
        or getattr(module, "_global_forward_pre_hooks", None)
    )
