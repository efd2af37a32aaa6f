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
from typing import Any, Optional

import torch

from . import rocmfix_kernel_support as ks

SCHEME = "linear"


def handled(x: torch.Tensor, deconv: Any) -> bool:
    """Whether the GEMM computes ``deconv(x)``: kernel == stride, no padding, no overlap."""
    if not (ks.plain(x, deconv, torch.nn.ConvTranspose2d) and x.shape[0] > 0):
        return False
    weight = deconv.weight
    k = (int(weight.shape[2]), int(weight.shape[3]))
    return (
        deconv.groups == 1
        and weight.shape[0] == x.shape[1]
        and weight.dtype == x.dtype
        and weight.device == x.device
        and ks.pair(deconv.stride) == k
        and ks.pair(deconv.padding) == (0, 0)
        and ks.pair(deconv.output_padding) == (0, 0)
        and ks.pair(deconv.dilation) == (1, 1)
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


def _gemm_blocks(x: torch.Tensor, views: Views, spec: Spec) -> torch.Tensor:
    """The GEMM's result as the output's k x k blocks: a 6-D view, not yet in place."""
    path, xv, y6, perm = spec[:4]
    wm, wt, _bias6 = views
    if path == 0:
        y = torch.mm(wt, x.reshape(xv))
    elif path == 1:
        y = torch.matmul(wt, x.reshape(xv))
    else:
        y = torch.matmul(x.permute(0, 2, 3, 1).reshape(xv), wm)
    return y.view(y6).permute(perm)


def gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.conv_transpose2d(x, weight, bias, stride=kernel)`` as a GEMM + pixel shuffle."""
    return _run(x, *_views(weight, bias), _prepared(_spec(x, weight)))


def gemm_traced(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """:func:`gemm` for ``torch.compile`` to trace: the shuffle as a value, not written through
    ``out=`` into a view of the output, which AOTAutograd's functionalization cannot invert
    (fullgraph compiles failed on PP-OCRv6 det's head: "Cannot view a tensor ...")."""
    spec, views = _spec(x, weight), _views(weight, bias)
    blocks = _gemm_blocks(x, views, spec)
    if views[2] is not None:
        blocks = blocks + views[2]
    return blocks.reshape(spec[4])


# id(layer) -> its plan (see :func:`_plan`). A model calls each layer once a forward with the
# same input layout: every call but a layer's first reads this and prepares nothing. The plan
# holds the weight, so the id is not reused while it stands; a plain dict, read without a lock
# (a BoundedCache's get costs 180 ns more a call).
_layers: dict[int, tuple[Any, ...]] = {}
_LAYERS_SIZE = 256
_compiler = getattr(torch, "compiler", None)
if _compiler is not None and hasattr(_compiler, "is_compiling"):
    _is_compiling: Any = _compiler.is_compiling
else:  # torch < 2.3
    _is_compiling = torch._dynamo.is_compiling
_SPECS_SIZE = 64  # input layouts a layer keeps
_lock = threading.Lock()
_grad_enabled = torch.is_grad_enabled
_modules = torch.nn.modules.module
_mm, _matmul, _add = torch.mm, torch.matmul, torch.add
_autocast = ks.any_autocast


def _forget() -> None:
    """What an optimizer step makes stale (ks.training_seen): the plans, whose weight matrix is
    a copy where the weight is strided."""
    with _lock:
        _layers.clear()


# Every optimizer step in the process calls it (ks.training_seen).
ks.derived(_forget)


def _settings(deconv: Any) -> tuple[Any, ...]:
    return (type(deconv), deconv.stride, deconv.padding, deconv.output_padding,
            deconv.dilation, deconv.groups, deconv.padding_mode)  # fmt: skip


def _plan(deconv: Any, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[Any, ...]:
    """The layer's plan: its settings, the weight and bias with their addresses (the views
    share them) and, where the [Cin, Cout*k*k] matrix is a copy (a strided weight), the
    weight's version, the views, the last input layout with its prepared run (None: the
    module runs it) and the prepared runs by layout; () for inference tensors, which have
    no version to see an update by (prepared each call)."""
    views: Any
    try:
        views = _views(weight, bias)
    except RuntimeError:  # not a transposed conv's weight and bias: no layout of it runs
        views = (None, None, None)
    try:
        copied = views[0] is not None and views[0].data_ptr() != weight.data_ptr()
        # The weight's shape and strides too: the views were made from them, and `transpose_`
        # or `.data = w.data.transpose(2, 3)` change them at the same address.
        stamps = (weight.data_ptr(), weight._version if copied else None,
                  None if bias is None else bias.data_ptr(), weight.shape,
                  weight.stride())  # fmt: skip
    except RuntimeError:  # inference tensors
        return ()
    plan: tuple[Any, ...] = (_settings(deconv), weight, bias, *stamps, *views, None, {})
    with _lock:
        if len(_layers) >= _LAYERS_SIZE:
            _layers.clear()
        _layers[id(deconv)] = plan
    return plan


def _layout(x: torch.Tensor) -> tuple[Any, ...]:
    return (x.shape, x.stride(), x.dtype, x.get_device())


def _run(
    x: torch.Tensor, wm: torch.Tensor, wt: torch.Tensor, bias6: Any, run: tuple[Any, ...]
) -> torch.Tensor:
    """One call's GEMM and shuffle, everything but the tensors prepared (``run`` is
    :func:`_prepared`'s): the GEMM, one strided view of its blocks, the output and one
    ``add`` (or ``copy_``) that writes each block to its place."""
    path, xv, size, stride, out_shape, target, y6, perm = run
    if path == 0:
        y = _mm(wt, x.view(xv))
    elif path == 1:
        y = _matmul(wt, x.view(xv))
    else:
        y = _matmul(x.permute(0, 2, 3, 1).reshape(xv), wm)
    # A GEMM's result is a fresh contiguous tensor; the view and permute are the fallback.
    blocks = y.as_strided(size, stride) if y.is_contiguous() else y.view(y6).permute(perm)
    out = x.new_empty(target)
    if bias6 is None:
        out.copy_(blocks)
    else:
        _add(blocks, bias6, out=out)
    return out.view(out_shape)


def _prepared(spec: Spec) -> tuple[Any, ...]:
    """A layout's run for :func:`_run`: the spec with the size and strides of
    ``y.view(y6).permute(perm)`` for a contiguous ``y`` (one ``as_strided`` a call where the
    view and the permute are two)."""
    path, xv, y6, perm, out_shape, target = spec
    strides = [1] * len(y6)
    for i in range(len(y6) - 2, -1, -1):
        strides[i] = strides[i + 1] * y6[i + 1]
    size, stride = tuple(y6[p] for p in perm), tuple(strides[p] for p in perm)
    return (path, xv, size, stride, out_shape, target, y6, perm)


def conv_transpose2d(x: torch.Tensor, deconv: Any) -> torch.Tensor:
    """``deconv(x)`` for any input: a kernel == stride ``nn.ConvTranspose2d`` on GPU tensors
    (outside autograd) runs as one GEMM and a pixel shuffle; anything else, and any error, calls
    the module itself."""
    # The replay, first and inline: a layer's every call but its first (in its input layout)
    # checks, at one attribute read or C call each, what its plan was made for (the same
    # weight and bias objects at the same addresses, the weight's version where the plan
    # holds a copy of it, the settings, the input's shape, strides, dtype and device, no
    # forward hooks on the layer or global ones) and runs the prepared GEMM and shuffle.
    if not _is_compiling():
        plan = _layers.get(id(deconv))
        if plan:
            (settings, weight, bias, wptr, wversion, bptr, wshape, wstrides, wm, wt, bias6,
             last, _specs) = plan  # fmt: skip
            run: Any
            try:
                params = deconv._parameters
                if (
                    last is not None
                    and x.shape == last[0]
                    and x.stride() == last[1]
                    and x.dtype is last[2]
                    and x.get_device() == last[3]
                    and params["weight"] is weight
                    and params.get("bias") is bias
                    and weight.data_ptr() == wptr
                    and (wversion is None or weight._version == wversion)
                    and weight.shape == wshape
                    and weight.stride() == wstrides
                    and (bias is None or bias.data_ptr() == bptr)
                    and (type(deconv), deconv.stride, deconv.padding, deconv.output_padding,
                         deconv.dilation, deconv.groups, deconv.padding_mode) == settings
                    and not (deconv._forward_hooks or deconv._forward_pre_hooks)
                    and not (_modules._global_forward_hooks or _modules._global_forward_pre_hooks)
                    and not (_grad_enabled() and (x.requires_grad or weight.requires_grad
                             or (bias is not None and bias.requires_grad)))
                    and not _autocast()
                ):  # fmt: skip
                    run = last[4]
                    if run is None:  # a layer (or layout) the GEMM does not compute
                        return deconv(x)  # type: ignore[no-any-return]
                    return _run(x, wm, wt, bias6, run)
            except Exception as exc:  # noqa: BLE001 - never take the model down
                with _lock:
                    _layers.pop(id(deconv), None)
                y: torch.Tensor = deconv(x)  # the stock result first, then the report
                if isinstance(x, torch.Tensor):  # not a tracer's proxy (torch.fx)
                    _failed(exc)
                return y
    return _first(x, deconv)


def _first(x: torch.Tensor, deconv: Any) -> torch.Tensor:
    """A call the replay did not take: checks, prepares (the layer's plan, and the input
    layout's shapes) and runs; the module itself where the GEMM does not compute it."""
    params = getattr(deconv, "_parameters", None)
    # Not a tensor: torch.fx's symbolic trace records the module.
    if not isinstance(x, torch.Tensor) or not x.is_cuda or params is None:
        return deconv(x)  # type: ignore[no-any-return]
    weight, bias = params.get("weight"), params.get("bias")
    if weight is None:
        return deconv(x)  # type: ignore[no-any-return]
    if ks.training(x, weight, bias):
        return deconv(x)  # type: ignore[no-any-return]
    # Autocast: the module, in autocast's dtype as stock (dynamo reads the device's flag).
    if ks.autocasting(x) if _is_compiling() else _autocast():
        return deconv(x)  # type: ignore[no-any-return]
    if _is_compiling():
        # Traced: the views are graph ops, and addresses and versions no graph can read.
        if handled(x, deconv) and not (deconv._forward_hooks or deconv._forward_pre_hooks):
            return gemm_traced(x, weight, bias)
        return deconv(x)  # type: ignore[no-any-return]
    try:
        plan = _layers.get(id(deconv))
        if not (plan and _current(plan, deconv, weight, bias)):
            plan = _plan(deconv, weight, bias)
        layout = _layout(x)
        specs = plan[-1] if plan else {}
        run = specs.get(layout, False)
        if run is False:
            viewed = not plan or plan[8] is not None
            run = _prepared(_spec(x, weight)) if viewed and handled(x, deconv) else None
            if plan:
                with _lock:
                    if len(specs) >= _SPECS_SIZE:  # a page size each: start afresh
                        specs.clear()
                    specs[layout] = run
        if plan:
            with _lock:  # the replay's layout from now on (None: it runs the module itself)
                _layers[id(deconv)] = (*plan[:-2], (*layout, run), plan[-1])
        if not (
            run is None or deconv._forward_hooks or deconv._forward_pre_hooks or ks.global_hooks()
        ):
            wm, wt, bias6 = plan[8:11] if plan else _views(weight, bias)
            return _run(x, wm, wt, bias6, run)
    except Exception as exc:  # noqa: BLE001 - never take the model down
        y: torch.Tensor = deconv(x)
        _failed(exc)
        return y
    return deconv(x)  # type: ignore[no-any-return]


def _failed(exc: Exception) -> None:
    ks.failed("the transposed conv as a GEMM", exc, "running the module")


def _current(plan: tuple[Any, ...], deconv: Any, weight: torch.Tensor, bias: Any) -> bool:
    """Whether ``plan`` was made from the layer's current settings, weight and bias."""
    settings, w0, b0, wptr, wversion, bptr, wshape, wstrides = plan[:8]
    return (
        w0 is weight
        and b0 is bias
        and weight.data_ptr() == wptr
        and (wversion is None or weight._version == wversion)
        and weight.shape == wshape
        and weight.stride() == wstrides
        and (bias is None or bias.data_ptr() == bptr)
        and _settings(deconv) == settings
    )


def deconv2d(x: torch.Tensor, weight: torch.Tensor, bias: Any, *call: Any) -> torch.Tensor:
    """``F.conv_transpose2d`` of a conv whose kernel is its stride (no padding, no dilation,
    one group) as :func:`gemm`, as ``rocmfix profile`` replays it; NotImplementedError for
    any other call."""
    stride, padding, output_padding, groups, dilation = call
    plain = not any(padding) and not any(output_padding) and dilation == [1, 1]
    if x.dim() != 4 or groups != 1 or list(weight.shape[2:]) != stride or not plain:
        raise NotImplementedError("not a transposed conv whose kernel is its stride")
    return gemm(x, weight, bias)
