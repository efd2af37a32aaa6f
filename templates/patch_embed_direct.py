"""Qwen2-VL patch embedding as a direct Triton dot product (rocmfix scheme ``direct``).

rocmfix dropped this file beside a Qwen-VL vision tower (vllm's ``qwen2_vl_vision_kernels.py``,
transformers' ``rocmfix_patch_embed.py``) and rewrote the patch embed's ``forward`` to call
:func:`triton_conv3d_patchify` instead of the Conv3d. ``rocmfix revert`` removes it.

One program per (patch, output channel) computes one K-long dot product (K = C*T*P*P = 1176
for Qwen2-VL) in fp32. It uses no matrix cores and re-reads a patch row and a weight row for
every output, so it is about 100-200x slower than the ``gemm`` scheme (on an H200: 61-250x
behind it and 110-290x behind cuBLAS, growing with the patch count; see
docs/performance-patch-embed.md). It is kept as a simple parity oracle, not for production. The
module needs stdlib, torch, triton and the ``rocmfix_*`` support modules dropped beside it,
never the package it sits in.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import rocmfix_custom_op as rop
from . import rocmfix_kernel_config as kc
from . import rocmfix_kernel_support as ks
from . import rocmfix_triton as rt

if rt.HAS_TRITON:
    # The modules rocmfix_triton imported, bound here for the kernels' annotations: that
    # module alone decides whether Triton is usable.
    import triton
    import triton.language as tl

SCHEME = "direct"
OP_NAME = "patch_embed_direct"

# A 1176-long row is 10 chunks of 128; wider chunks only add masked lanes.
BLOCK_K = 128
NUM_WARPS = 4

INTERPRETING = rt.INTERPRETING

if rt.HAS_TRITON:
    # No @triton.jit helpers of triton.language (tl.sum, ...): those are compiled-or-interpreted
    # when triton is first imported, and tests may set TRITON_INTERPRET=1 only after that.

    @triton.jit
    def _add(a, b):
        return a + b

    @triton.jit
    def _direct_kernel(
        a_ptr,
        w_ptr,
        bias_ptr,
        c_ptr,
        N,
        K,
        stride_am,
        stride_ak,
        stride_wn,
        stride_wk,
        stride_cm,
        stride_cn,
        BLOCK_K: tl.constexpr,
        HAS_BIAS: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        # int64 row offsets: L * K passes 2**31 elements for the ~2M-patch batches vllm can build.
        a_row = a_ptr + pid_m.to(tl.int64) * stride_am
        w_row = w_ptr + pid_n.to(tl.int64) * stride_wn
        acc = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            mask = rk < K
            a = tl.load(a_row + rk * stride_ak, mask=mask, other=0.0)
            w = tl.load(w_row + rk * stride_wk, mask=mask, other=0.0)
            acc += a.to(tl.float32) * w.to(tl.float32)
        total = tl.reduce(acc, 0, _add)
        if HAS_BIAS:
            total += tl.load(bias_ptr + pid_n).to(tl.float32)
        c = c_ptr + pid_m.to(tl.int64) * stride_cm + pid_n * stride_cn
        tl.store(c, total.to(c_ptr.dtype.element_ty))


def _check(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> None:
    if a.dim() != 2 or w.dim() != 2 or a.shape[1] != w.shape[1]:
        raise ValueError(f"patch embed: bad shapes x{tuple(a.shape)} weight{tuple(w.shape)}")
    if bias is not None and tuple(bias.shape) != (w.shape[0],):
        raise ValueError(f"patch embed: bias{tuple(bias.shape)} for {w.shape[0]} channels")


def patchify_direct(
    a: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``a[M, K] @ w[N, K].T (+ bias)``, one Triton program per output element.

    ``out`` (``[M, N]``, ``a``'s dtype) lets a caller pre-poison the result.
    """
    if not rt.HAS_TRITON:
        raise RuntimeError("triton is not importable")
    _check(a, w, bias)
    M = a.shape[0]
    N = w.shape[0]
    if w.dtype != a.dtype:
        w = w.to(a.dtype)
    if out is None:
        out = torch.empty((M, N), dtype=a.dtype, device=a.device)
    elif tuple(out.shape) != (M, N) or out.dtype != a.dtype:
        raise ValueError(f"patch embed: out must be {(M, N)} {a.dtype}")
    if M > 0 and N > 0:
        kernel, grid, args, kwargs = prepare_launch(a, w, bias, out)
        kernel[grid](*args, **kwargs)
    return out


def clear_config_cache() -> None:
    """Forget parsed files, warnings and arch queries (the direct kernel has no tile config,
    but every Triton template answers this for ``rocmfix tune``/``doctor``/``kernels``)."""
    kc.clear()


def prepare(
    a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None
) -> tuple[Any, tuple[int, int], tuple[Any, ...], dict[str, Any]]:
    """What one call would launch, not launched (see prepare_launch)."""
    out = torch.empty((a.shape[0], w.shape[0]), dtype=a.dtype, device=a.device)
    return prepare_launch(a, w, bias, out)


def prepare_launch(
    a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor
) -> tuple[Any, tuple[int, int], tuple[Any, ...], dict[str, Any]]:
    """The kernel, grid, arguments and launch options of one call, not launched (rocmfix's
    ahead-of-time compile check compiles them for GPUs it does not have)."""
    M, K = a.shape
    N = w.shape[0]
    args: tuple[Any, ...] = (a, w, bias if bias is not None else out, out, N, K)
    args += (a.stride(0), a.stride(1))
    args += (w.stride(0), w.stride(1), out.stride(0), out.stride(1))
    kwargs = {"BLOCK_K": BLOCK_K, "HAS_BIAS": bias is not None, "num_warps": NUM_WARPS}
    return _direct_kernel, (M, N), args, kwargs


def _linear_fallback(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(a, w.to(a.dtype), None if bias is None else bias.to(a.dtype))


def _impl_cuda(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if not rt.HAS_TRITON:
        ks.warn_once("no-triton", "rocmfix: triton is not importable; patch embed uses F.linear")
        return _linear_fallback(a, w, bias)
    return patchify_direct(a, w, bias)


def _impl_cpu(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if INTERPRETING:
        return patchify_direct(a, w, bias)
    if not rt.HAS_TRITON:
        ks.warn_once("no-triton", "rocmfix: triton is not importable; patch embed uses F.linear")
    return _linear_fallback(a, w, bias)


def _impl_fake(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return a.new_empty((a.shape[0], w.shape[0]))


_OP = rop.register_op(
    OP_NAME, "(Tensor x, Tensor weight, Tensor? bias) -> Tensor", _impl_cuda, _impl_cpu, _impl_fake
)


def triton_conv3d_patchify(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Conv3d with kernel == stride on ``x[L, C, T, P, P]`` and ``weight[N, C, T, P, P]``.

    Returns ``[L, N]`` in ``x``'s dtype.
    """
    if (not x.is_cuda and not INTERPRETING) or (
        torch.is_grad_enabled()
        and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
    ):
        # CPU inputs keep the stock op, bit for bit; so does a call autograd records (the
        # kernel has no backward).
        return F.conv3d(x, weight, bias, stride=tuple(weight.shape[2:])).flatten(1)
    # flatten(1), not reshape(L, -1): the latter is ambiguous for an empty batch.
    out: torch.Tensor = _OP(x.flatten(1), weight.flatten(1), bias)
    return out
