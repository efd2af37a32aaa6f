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

import threading
import warnings
from typing import Any, Optional

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


# How one input layout runs: (path, x's view, y's 6-D view, its permutation, the output's
# shape, the output's 6-D view); path 0: NCHW batch 1, 1: NCHW, 2: any other layout.
Spec = tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...],
             tuple[int, ...]]  # fmt: skip
# The weight as [Cin, Cout*k*k] and transposed, the bias as [1, Cout, 1, 1, 1, 1].
Views = tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]  # evaluated: 3.9's syntax


def _views(weight: torch.Tensor, bias: torch.Tensor | None) -> Views:
    cin, cout = int(weight.shape[0]), int(weight.shape[1])
    wm = weight.view(cin, -1) if weight.is_contiguous() else weight.reshape(cin, -1)
    return wm, wm.t(), None if bias is None else bias.view(1, cout, 1, 1, 1, 1)


def _spec(x: torch.Tensor, weight: torch.Tensor) -> Spec:
    n, cin, h, w = (int(d) for d in x.shape)
    cout, kh, kw = (int(d) for d in weight.shape[1:])
    out, target = (n, cout, h * kh, w * kw), (n, cout, h, kh, w, kw)
    if x.is_contiguous():
        # NCHW: y[n, (co, i, j), hw] = W^T @ x[n], no copy of x; one GEMM for a batch of one.
        path, xv = (0, (cin, h * w)) if n == 1 else (1, (n, cin, h * w))
        return path, xv, (n, cout, kh, kw, h, w), (0, 1, 4, 2, 5, 3), out, target
    # Channels-last (or any other layout): the pixels as rows.
    return 2, (n, h * w, cin), (n, h, w, cout, kh, kw), (0, 3, 1, 4, 2, 5), out, target


def _shuffle(x: torch.Tensor, views: Views, spec: Spec) -> torch.Tensor:
    """The GEMM and the pixel shuffle of one call, everything but the tensors prepared."""
    path, xv, y6, perm, out_shape, target = spec
    wm, wt, bias6 = views
    if path == 0:
        y = torch.mm(wt, x.view(xv))
    elif path == 1:
        y = torch.matmul(wt, x.view(xv))
    else:
        y = torch.matmul(x.permute(0, 2, 3, 1).reshape(xv), wm)
    blocks = y.view(y6).permute(perm)
    out = x.new_empty(out_shape)
    if bias6 is None:
        out.view(target).copy_(blocks)
    else:
        torch.add(blocks, bias6, out=out.view(target))
    return out


def gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.conv_transpose2d(x, weight, bias, stride=kernel)`` as a GEMM + pixel shuffle."""
    return _shuffle(x, _views(weight, bias), _spec(x, weight))


def gemm_traced(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """:func:`gemm` for ``torch.compile`` to trace: the shuffle as a value, not written through
    ``out=`` into a view of the output, which AOTAutograd's functionalization cannot invert
    (fullgraph compiles failed on PP-OCRv6 det's head: "Cannot view a tensor ...")."""
    path, xv, y6, perm, out_shape, _target = _spec(x, weight)
    wm, wt, bias6 = _views(weight, bias)
    if path == 0:
        y = torch.mm(wt, x.reshape(xv))
    elif path == 1:
        y = torch.matmul(wt, x.reshape(xv))
    else:
        y = torch.matmul(x.permute(0, 2, 3, 1).reshape(xv), wm)
    blocks = y.view(y6).permute(perm)
    if bias6 is not None:
        blocks = blocks + bias6
    return blocks.reshape(out_shape)


# id(layer) -> (its settings, weight and bias with their addresses and versions, their views,
# and by input layout the Spec, or None where handled() said no). A model calls each layer
# once a forward with the same input layout: every call but a layer's first reads this and
# prepares nothing. The entry holds the weight, so the id is not reused while it stands; a
# plain dict, read without a lock (a BoundedCache's get costs 180 ns more a call).
_layers: dict[int, tuple[Any, ...]] = {}
_LAYERS_SIZE = 256
_compiler = getattr(torch, "compiler", None)
if _compiler is not None and hasattr(_compiler, "is_compiling"):
    _is_compiling: Any = _compiler.is_compiling
else:  # torch < 2.3
    _is_compiling = torch._dynamo.is_compiling
_SPECS_SIZE = 64  # input layouts a layer keeps
_lock = threading.Lock()


def _settings(deconv: Any) -> tuple[Any, ...]:
    return (type(deconv), deconv.stride, deconv.padding, deconv.output_padding,
            deconv.dilation, deconv.groups, deconv.padding_mode)  # fmt: skip


def _plan(deconv: Any, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[Any, ...]:
    """The layer's entry in :data:`_layers`: the current one, or a new one where the settings
    or a tensor changed (replaced, moved, or updated in place: its version); () for inference
    tensors, which have no version to see an update by (such calls prepare anew)."""
    settings = _settings(deconv)
    plan = _layers.get(id(deconv))
    try:
        if (
            plan is not None
            and plan[1] is weight
            and plan[4] is bias
            and plan[2] == weight.data_ptr()
            and plan[3] == weight._version
            and (bias is None or (plan[5] == bias.data_ptr() and plan[6] == bias._version))
            and plan[0] == settings
        ):
            return plan
        stamps = (weight.data_ptr(), weight._version, bias,
                  None if bias is None else bias.data_ptr(),
                  None if bias is None else bias._version)  # fmt: skip
    except RuntimeError:  # inference tensors
        return ()
    plan = (settings, weight, *stamps, _views(weight, bias), {})
    with _lock:
        if len(_layers) >= _LAYERS_SIZE:
            _layers.clear()
        _layers[id(deconv)] = plan
    return plan


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
    if _is_compiling():
        # Traced: the views are graph ops, and addresses and versions no graph can read.
        if handled(x, deconv) and not (deconv._forward_hooks or deconv._forward_pre_hooks):
            return gemm_traced(x, weight, bias)
        return deconv(x)  # type: ignore[no-any-return]
    try:
        plan = _plan(deconv, weight, bias)
        layout = (x.shape, x.stride(), x.dtype, x.get_device())
        specs = plan[-1] if plan else {}
        spec = specs.get(layout, False)
        if spec is False:
            spec = _spec(x, weight) if handled(x, deconv) else None
            if plan:
                with _lock:
                    if len(specs) >= _SPECS_SIZE:  # a page size each: start afresh
                        specs.clear()
                    specs[layout] = spec
        if not (
            spec is None or deconv._forward_hooks or deconv._forward_pre_hooks or ks.global_hooks()
        ):
            return _shuffle(x, plan[-2] if plan else _views(weight, bias), spec)
    except Exception as exc:  # noqa: BLE001 - never take the model down
        _warn_once(
            f"rocmfix: the transposed conv as a GEMM failed ({type(exc).__name__}: {exc}); "
            "running the module",
        )
    return deconv(x)  # type: ignore[no-any-return]
