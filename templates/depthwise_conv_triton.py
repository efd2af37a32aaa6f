"""Depthwise conv2d as a Triton direct kernel, with the BatchNorm and activation that follow it
in its store (rocmfix template, scheme ``triton``).

rocmfix dropped this file beside a conv-norm-act layer (transformers' HGNetV2, MinerU's ports of
PaddleOCR) and rewrote the layer's forward to call :func:`depthwise_conv2d` with its modules;
``rocmfix revert`` removes it. Why: MIOpen runs depthwise convs through a grouped implicit-GEMM
solver at a tenth of the memory bandwidth, and has no fp32 depthwise path at all.

A depthwise conv (groups == in == out channels) is bound by memory: the kernel (in
``depthwise_conv_kernels``) makes one pass over the input with the weights in registers, then
applies ``y * scale + shift`` (an eval-mode BatchNorm folded with the conv's bias) and ReLU,
SiLU, GELU or Hardswish before the one store. NCHW or channels-last input (any strides),
NCHW-contiguous output; fp32, fp16, bf16.

:func:`depthwise_conv2d` never fails: a shape it does not handle (not depthwise, dilation > 1,
CPU tensors outside Triton's interpreter, autograd recording, a training BatchNorm), Triton
missing, or any error of the kernel runs the layer's own modules, with one warning for an error.
Tile configs are data (``depthwise_conv_config.SHIPPED_CONFIGS``), merged with the tuned file
and ``$ROCMFIX_DEPTHWISE_CONV_CONFIG`` by ``rocmfix_kernel_config``. The kernel, and how a
call becomes its launch, live in ``depthwise_conv_kernels``; Triton itself, the launcher and the
custom op come from the shared ``rocmfix_*`` modules; all are dropped beside this file.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import torch

from . import depthwise_conv_config as dc
from . import depthwise_conv_kernels as dk
from . import depthwise_conv_op as dop
from . import rocmfix_custom_op as rop
from . import rocmfix_kernel_config as kc
from . import rocmfix_kernel_support as ks
from . import rocmfix_launcher as rl
from . import rocmfix_triton as rt

SCHEME = "triton"
OP_NAME = "depthwise_conv2d"
# The configs live in depthwise_conv_config; tune, doctor and the tests read them here.
KERNEL = dc.KERNEL
CONFIG_ENV = dc.CONFIG_ENV
CONFIG = dc.CONFIG
precision_class, shape_class, layout_class = dc.precision_class, dc.shape_class, dc.layout_class
resolve_config = dc.resolve_config
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_KERNEL = 9
_INT32_MAX = 2**31 - 1

device_arch = kc.device_arch
triton = rt.triton
INTERPRETING = rt.INTERPRETING
prepare_launch = dk.prepare_launch
# The kernel alone (tune, doctor, tests), and the (stride, padding) pair parse, beside the op.
conv, _pair = dop.conv, ks.pair
# The kernel itself (None without Triton), where rocmfix's profiler looks for it.
_dw_kernel = dk.KERNEL

# The launch of each key (the layout, the modules and their settings) planned so far: the
# replays read _replays; this is the record tests and benches count plans by.
_plans: ks.BoundedCache[tuple[Any, ...], rl.Launcher] = ks.BoundedCache(256)
_broken: ks.BoundedCache[tuple[Any, ...], bool] = ks.BoundedCache(256)
# id(conv) -> its last call's Replay. It holds the layer's weight, so an id is not reused
# while its entry stands. A plain dict: a dict's get costs 36 ns where BoundedCache.get's
# recency update makes it 218 (CPython 3.12). Writes take rt.LOCK; a model with more layers
# than it holds starts it afresh.
_replays: dict[int, tuple[Any, ...]] = {}
_REPLAYS_SIZE = 256
# What the replay calls every time, bound once (a module attribute read each is ~20 ns).
_is_compiling = rop.is_compiling
_grad_enabled = torch.is_grad_enabled
# Autocast (the stock conv in its dtype) and a torch.jit trace take the stock modules.
_autocast, _tracing = ks.any_autocast, torch._C._get_tracing_state
_empty_like = torch.empty_like
_CONTIGUOUS = torch.contiguous_format
_modules = torch.nn.modules.module
_GELU = torch.nn.GELU


def _forget() -> None:
    """What an optimizer step makes stale (ks.training_seen): the replays and the op's plans."""
    with rt.LOCK:
        _replays.clear()
    _op_plans.clear()


# Every optimizer step in the process calls it (ks.training_seen).
ks.derived(_forget)


def clear_config_cache() -> None:
    """Forget the tuned file, env config, arch queries and launch plans (tune, tests)."""
    CONFIG.clear()
    _plans.clear()
    _op_plans.clear()
    _broken.clear()
    with rt.LOCK:
        _replays.clear()
    ks.clear_folds()


# --------------------------------------------------------------------------------------------
# Launch
# --------------------------------------------------------------------------------------------


def prepare(
    x: torch.Tensor,
    weight: torch.Tensor,
    stride: int,
    config: dict[str, Any] | None = None,
    act: int = ks.ACT_RELU,
) -> tuple[Any, tuple[int, int, int], tuple[Any, ...], dict[str, Any]]:
    """One MinerU call's launch ("same" padding, a folded BatchNorm, ``act``) for the
    ahead-of-time compile check: the resolved config with ``config`` over it."""
    kh, kw = int(weight.shape[2]), int(weight.shape[3])
    cfg = resolve_config(x.device, kh, kw, stride, x.dtype, layout_class(x))
    cfg.update(CONFIG.validate(config or {}))
    ones = torch.ones(x.shape[1], dtype=torch.float32, device=x.device)
    pad = ((kh - 1) // 2, (kw - 1) // 2)
    kernel, grid, args, kwargs, _ = prepare_launch(
        x, weight, (stride, stride), pad, cfg, ones, ones, act
    )
    return kernel, grid, args, kwargs


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def _conv_geometry(x: torch.Tensor, layer: Any) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """(stride, padding) where the kernel computes ``layer(x)``, else None."""
    if (
        not isinstance(layer, torch.nn.Conv2d)
        or type(layer).forward is not torch.nn.Conv2d.forward
        or type(layer)._conv_forward is not torch.nn.Conv2d._conv_forward
        or ks.hooked(layer)
        or layer.padding_mode != "zeros"
        or x.dim() != 4
        or x.dtype not in SUPPORTED_DTYPES
    ):
        return None
    weight = layer.weight
    c = x.shape[1]
    if (
        layer.groups != c
        or weight.shape[0] != c
        or weight.shape[1] != 1
        or weight.dtype != x.dtype
        or weight.device != x.device
        or tuple(layer.dilation) != (1, 1)
        or not 1 <= weight.shape[2] <= MAX_KERNEL
        or not 1 <= weight.shape[3] <= MAX_KERNEL
        or x.shape[0] == 0
        or c == 0
    ):
        return None
    stride, padding = _pair(layer.stride), _pair(layer.padding)
    if stride is None or padding is None or min(stride) < 1 or min(padding) < 0:
        return None
    if x.numel() > _INT32_MAX:
        return None
    oh = (x.shape[2] + 2 * padding[0] - weight.shape[2]) // stride[0] + 1
    ow = (x.shape[3] + 2 * padding[1] - weight.shape[3]) // stride[1] + 1
    if oh < 1 or ow < 1 or x.shape[0] * c * oh * ow > _INT32_MAX or x.shape[0] > 65535:
        return None
    return stride, padding


def _epilogue(layer: Any, bn: Any, act: Any) -> tuple[Any, Any, int, bool, bool] | None:
    """(scale, shift, act code, bn fused, act fused), or None where even the conv's bias
    cannot be applied (it records gradients)."""
    code = ks.act_code(act)
    if bn is not None:
        folded = ks.fold_bn(bn, layer.bias)
        if folded is not None:
            if code is None:
                return folded[0], folded[1], 0, True, False
            return folded[0], folded[1], code, True, True
    plain = ks.fold_bn(None, layer.bias)
    if plain is None:
        return None
    # A BatchNorm called as a module comes between the conv and the activation.
    fuse_act = bn is None and code is not None
    return plain[0], plain[1], code if fuse_act and code is not None else 0, bn is None, fuse_act


def _allocation(x: torch.Tensor, out_shape: tuple[int, ...]) -> int:
    """How a replay allocates the (NCHW-contiguous) output, cheapest first (CPython 3.11, torch
    2.14 on a CPU: 0.9, 1.1 and 1.5 us, bench/dw_host.py): 0 ``empty_like(x)`` for a
    contiguous input of the output's shape (it keeps that layout), 1 ``empty_like`` in the
    contiguous format for any other input of that shape, 2 ``new_empty``."""
    if tuple(x.shape) != out_shape:
        return 2
    return 0 if x.is_contiguous() else 1


# A layer's replay, in the order the replay checks it: the BatchNorm and activation; the
# input's layout and address modulo 16; the conv's settings, weight (at wptr) and bias; a
# folded BatchNorm's tensors and eps; (tensor, address, version) of what was folded and of
# the BatchNorm's batch count (its train-mode forward moves no statistic's version); the
# output's allocation (_allocation) and shape; launch(*head, stream, *between, the kernel's
# arguments spread or one tuple) (Launcher.replay_launch), with wk, scale, shift as ints
# where ``addresses`` (keep holds the tensors). Stored as a plain tuple: one unpacks in 0.13
# us, a namedtuple in 0.33 (CPython 3.11's fast path is for exact tuples); replay_of names it.
Replay = collections.namedtuple(
    "Replay",
    "bn act shape strides dtype device align settings weight wptr wshape wstrides bias folded "
    "stamps alloc "
    "out_shape launcher launch head between spread addresses wk scale shift rest tail "
    "bn_done act_done gelu grads keep",
)


def replay_of(layer: Any) -> Replay | None:
    """``layer``'s replay, named (tests, benches)."""
    return Replay._make(_replays[id(layer)]) if id(layer) in _replays else None


# How replays launch (read at plan time): the launcher's C ``launch`` where rl.direct_launch
# reads its layout; tensors as addresses (Triton's C launch queries the driver for a tensor).
DIRECT, ADDRESSES = True, True


def _plan(
    x: torch.Tensor,
    layer: Any,
    bn: Any,
    act: Any,
    launcher: rl.Launcher,
    args: tuple[Any, ...],
    out_shape: tuple[int, ...],
    epilogue: tuple[Any, Any, int, bool, bool],
) -> Replay | None:
    """What :func:`depthwise_conv2d` replays for ``layer``'s next calls, with everything the
    launch was made from: None where a tensor has no version (inference tensors)."""
    _scale, _shift, _code, bn_done, act_done = epilogue
    params = layer._parameters
    weight, bias = params["weight"], params.get("bias")
    folded = None
    sources = [bias]  # what the scale and shift were computed from: copies
    if bn_done and bn is not None:
        buffers, affine = bn._buffers, bn._parameters
        folded = (buffers.get("running_mean"), buffers.get("running_var"),
                  affine.get("weight"), affine.get("bias"), bn.eps)  # fmt: skip
        sources += (*folded[:4], buffers.get("num_batches_tracked"))
    try:
        # The weight's version too: a copy of it (a non-contiguous weight) goes stale when it
        # is updated in place, and a view (the live values) when its shape or strides change
        # in place (`transpose_`).
        sources.append(weight)
        stamps = tuple((t, t.data_ptr(), t._version) for t in sources if t is not None)
        wptr = weight.data_ptr()
    except RuntimeError:
        return None
    launch, head, between, spread = launcher.replay_launch(args, direct=DIRECT)
    wk, scale, shift = args[1:4]
    addresses = launch is not None and (ADDRESSES or not spread)  # a tuple: addresses
    if addresses:
        wk, scale, shift = wk.data_ptr(), scale.data_ptr(), shift.data_ptr()
    return Replay(
        bn, act, x.shape, x.stride(), x.dtype, x.get_device(), x.data_ptr() & 15,
        (layer.stride, layer.padding, layer.dilation, layer.groups, layer.padding_mode),
        weight, wptr, weight.shape, weight.stride(), bias, folded, stamps,
        _allocation(x, out_shape), out_shape,
        launcher, launch, head, between, spread, addresses, wk, scale, shift,
        args[5:] + launcher.tail, args[5:], bn_done, act_done,
        act_done and type(act) is _GELU,
        tuple(t for t in (weight, *sources) if t is not None), tuple(args[1:4]),
    )  # fmt: skip


def _eager(x: torch.Tensor, layer: Any, bn: Any, act: Any) -> torch.Tensor | None:
    """A layer's first call (or the first since what it was planned for changed): checks,
    plans, launches, and keeps the plan for the replay in :func:`depthwise_conv2d`."""
    weight = layer._parameters.get("weight") if isinstance(layer, torch.nn.Module) else None
    if weight is None:
        return None
    if ks.training(x, weight, layer._parameters.get("bias"), bn=bn):
        return None  # the stock modules, which have a backward
    if _autocast():
        return None
    # Everything a launch depends on but the tensors: their layout, the modules and their
    # settings. A layer that failed once at a key runs its modules from then on.
    key = (rl.layout_key(x), id(layer), layer.stride, layer.padding, layer.dilation,
           layer.groups, id(bn), id(act), getattr(bn, "eps", None))  # fmt: skip
    if _broken.get(key) or ks.layer_hooked(layer, bn, act):
        return None
    geometry = _conv_geometry(x, layer)
    if geometry is None:
        return None
    epilogue = _epilogue(layer, bn, act)
    if epilogue is None:
        return None
    scale, shift, code, bn_done, act_done = epilogue
    stride, padding = geometry
    kh, kw = int(weight.shape[2]), int(weight.shape[3])
    cfg = resolve_config(x.device, kh, kw, stride[0], x.dtype, layout_class(x))
    kernel, grid, args, kwargs, out = prepare_launch(
        x, weight.detach(), stride, padding, cfg, scale, shift, code
    )
    # A launcher adopted for this layer at this key before (a layer whose input alternates
    # between layouts replans at each change), where everything else Triton specialises on
    # is the same: the weight's and the fold's layouts and alignment, the constexprs, the grid.
    launch_key = (*key, *(rl.layout_key(t) for t in args[1:4]), tuple(kwargs.items()), grid)
    launcher = _plans.get(launch_key)
    if launcher is None:
        launcher = rl.Launcher(kernel, grid, kwargs, rl.device_index(x))
    try:
        launcher(*args)
    except Exception:
        _broken.put(key, True)
        raise
    plan = _plan(x, layer, bn, act, launcher, args, tuple(out.shape), epilogue)
    if plan is not None:
        _plans.put(launch_key, launcher)
        with rt.LOCK:
            if len(_replays) >= _REPLAYS_SIZE:
                _replays.clear()
            _replays[id(layer)] = tuple(plan)
    if not bn_done and bn is not None:
        out = bn(out)
    if not act_done and act is not None:
        out = act(out)
    return out


def _traced(x: torch.Tensor, layer: Any, bn: Any, act: Any) -> torch.Tensor | None:
    """Under torch.compile: one opaque op for conv + fold + activation, or None."""
    if ks.training(x, layer.weight, layer.bias, bn=bn):
        return None  # the op has no backward
    if ks.autocasting(x):
        return None  # the op keeps x's dtype where the conv would run in autocast's
    geometry = _conv_geometry(x, layer)
    if geometry is None:
        return None
    code = ks.act_code(act)
    if bn is not None and not ks.foldable_bn(bn):
        # As _epilogue: a BatchNorm the kernel cannot fold (RT-DETR's frozen one in
        # PP-DocLayoutV2's backbone) is called on the op's output, then the activation.
        scale, shift = ks.fold_traced(None, layer.bias)
        y: torch.Tensor = _OP(x, layer.weight, scale, shift, list(geometry[0]),
                              list(geometry[1]), 0)  # fmt: skip
        y = bn(y)
        return y if act is None else act(y)
    scale, shift = ks.fold_traced(bn, layer.bias)
    fused_act = code if code is not None else 0
    y = _OP(x, layer.weight, scale, shift, list(geometry[0]), list(geometry[1]), fused_act)
    if code is None and act is not None:
        y = act(y)
    return y


def depthwise_conv2d(
    x: torch.Tensor,
    conv: Any,
    bn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    act: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """``act(bn(conv(x)))`` (``conv(x)`` / ``bn(conv(x))`` where they are None) for any input:
    ``conv`` is the layer's ``nn.Conv2d``, ``bn`` its BatchNorm, ``act`` its activation.

    Depthwise convs (groups == in == out channels, dilation 1, zero padding, kernels up to
    9x9, any stride) of fp32/fp16/bf16 GPU tensors (CPU ones under ``TRITON_INTERPRET=1``) run
    the Triton kernel, an eval-mode ``nn.BatchNorm2d`` and an ``nn.ReLU``/``SiLU``/``GELU``/
    ``Hardswish``/``Identity`` without hooks in its store; any other module is called on its
    output. Everything else runs the modules themselves, as does any error (warned once).
    """
    # The replay, first and inline: every call but a layer's first lands here, where the
    # F.conv2d it replaces pays one C++ dispatch. It checks, at one attribute read or C call
    # each, what the launch was planned for (Replay, in order; the weight at the same
    # address: the kernel reads it through a view), no hooks on the conv, the folded
    # BatchNorm and fused activation or global ones, a folded BatchNorm's eval mode.
    # Anything else goes to _eager, which plans anew or runs the modules.
    if not _is_compiling():
        plan = _replays.get(id(conv))
        if plan is not None:
            (bn0, act0, shape, strides, dtype, device, align, settings, weight, wptr, wshape,
             wstrides, bias, folded, stamps, alloc, out_shape, launcher, launch, head, between,
             spread, addresses, wk, scale, shift, rest, tail, bn_done, act_done, gelu, grads,
             keep) = plan  # fmt: skip
            try:
                xp = x.data_ptr()
                params = conv._parameters
                fresh = (
                    _tracing() is None  # first: a trace would warn on the shape's compare
                    and bn is bn0
                    and act is act0
                    and x.shape == shape
                    and x.stride() == strides
                    and x.dtype is dtype
                    and x.get_device() == device
                    and xp & 15 == align
                    and (conv.stride, conv.padding, conv.dilation, conv.groups,
                         conv.padding_mode) == settings
                    and params["weight"] is weight
                    and weight.data_ptr() == wptr
                    # `.data = w.data.transpose(2, 3)`: another view at the same address
                    and weight.shape == wshape
                    and weight.stride() == wstrides
                    and params.get("bias") is bias
                    and not (conv._forward_hooks or conv._forward_pre_hooks)
                    and not (_modules._global_forward_hooks or _modules._global_forward_pre_hooks)
                    and not (_grad_enabled()
                             and (x.requires_grad or any(t.requires_grad for t in grads)))
                    and not _autocast()
                )  # fmt: skip
                if fresh and folded is not None:
                    buffers, affine = bn._buffers, bn._parameters  # type: ignore[union-attr]
                    fresh = (
                        buffers.get("running_mean") is folded[0]
                        and buffers.get("running_var") is folded[1]
                        and affine.get("weight") is folded[2]
                        and affine.get("bias") is folded[3]
                        and bn.eps == folded[4]  # type: ignore[union-attr]
                        and not bn.training  # type: ignore[union-attr]
                        and not (bn._forward_hooks or bn._forward_pre_hooks)  # type: ignore[union-attr]
                    )
                if fresh and act_done and act is not None:
                    fresh = not (act._forward_hooks or act._forward_pre_hooks)  # type: ignore[attr-defined]
                    if gelu and act.approximate != "none":  # type: ignore[attr-defined]
                        fresh = False
                if fresh:
                    for t, ptr, version in stamps:
                        if t._version != version or t.data_ptr() != ptr:
                            fresh = False
                            break
                if fresh:
                    if alloc == 0:
                        out = _empty_like(x)
                    elif alloc == 1:
                        out = _empty_like(x, memory_format=_CONTIGUOUS)
                    else:
                        out = x.new_empty(out_shape)
                    stream = None if launch is None else launcher.stream()
                    # Each form spelled out: a tuple built and spread costs 0.1 us more.
                    if stream is None:
                        launcher(x, *keep, out, *tail)
                    elif not addresses:
                        launch(*head, stream, *between, x, wk, scale, shift, out, *rest)
                    elif spread:
                        launch(*head, stream, *between, xp, wk, scale, shift, out.data_ptr(),
                               *rest)  # fmt: skip
                    else:
                        launch(*head, stream, *between,
                               (xp, wk, scale, shift, out.data_ptr(), *rest))  # fmt: skip
                    if not bn_done and bn is not None:
                        out = bn(out)
                    if not act_done and act is not None:
                        out = act(out)
                    return out
            except Exception as exc:  # noqa: BLE001 - a dropped kernel must never take the model down
                with rt.LOCK:
                    _replays.pop(id(conv), None)  # the next call plans anew, or marks it broken
                y = ks.stock(x, conv, bn, act)  # the stock result first, then the report
                if isinstance(x, torch.Tensor):  # not a tracer's proxy (torch.fx)
                    _failed(exc)
                return y
    if not isinstance(x, torch.Tensor):
        return ks.stock(x, conv, bn, act)  # torch.fx's symbolic trace records the modules
    if triton is None:
        if x.is_cuda:  # a warning that cannot raise (ks.warn_once)
            ks.warn_once("no-triton", "rocmfix: triton is not importable; depthwise convs run "
                         "the stock modules")  # fmt: skip
        return ks.stock(x, conv, bn, act)
    if not (x.is_cuda or INTERPRETING):
        return ks.stock(x, conv, bn, act)
    if _is_compiling():
        traced = _traced(x, conv, bn, act)
        return ks.stock(x, conv, bn, act) if traced is None else traced
    if _tracing() is not None:
        return ks.stock(x, conv, bn, act)
    try:
        done = _eager(x, conv, bn, act)
    except Exception as exc:  # noqa: BLE001 - a dropped kernel must never take the model down
        y = ks.stock(x, conv, bn, act)
        _failed(exc)
        return y
    return ks.stock(x, conv, bn, act) if done is None else done


def _failed(exc: Exception) -> None:
    ks.warn_once(
        "depthwise:" + type(exc).__name__,
        f"rocmfix: the depthwise conv kernel failed ({type(exc).__name__}: {exc}); "
        "running the stock modules",
    )


# --------------------------------------------------------------------------------------------
# torch.compile: one custom op
# --------------------------------------------------------------------------------------------


# The op's launches under torch.compile, by everything a launch depends on but the addresses:
# a compiled model calls the op with the same weight and layouts every forward, so every call
# but the first launches straight away. conv() resolves the config and builds a Launcher on
# each call: 150 us a node on an H100 host, which made PP-OCRv6 det compiled 1.5x stock with
# 0.85x its GPU time (bench/compile_gpu.py, 2026-11-25). A plan holds its weight, so the id is
# not reused while it stands; the weight's address and version see an in-place update.
_op_plans: ks.BoundedCache[tuple[Any, ...], tuple[Any, ...]] = ks.BoundedCache(256)


def _tensor_key(t: torch.Tensor | None) -> tuple[Any, ...] | None:
    return None if t is None else (t.shape, t.stride(), t.dtype, t.data_ptr() % 16)


def _op_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    stride: tuple[int, int],
    padding: tuple[int, int],
    act: int,
) -> torch.Tensor:
    if weight.is_inference():  # no version to see an update by: planned anew
        return conv(x, weight, stride, padding, scale=scale, shift=shift, act=act)
    key = (rl.layout_key(x), id(weight), weight.data_ptr(), weight._version, weight.shape,
           weight.stride(), stride, padding, act, _tensor_key(scale),
           _tensor_key(shift))  # fmt: skip
    plan = _op_plans.get(key)
    if plan is None:
        kh, kw = int(weight.shape[2]), int(weight.shape[3])
        cfg = resolve_config(x.device, kh, kw, stride[0], x.dtype, layout_class(x))
        kernel, grid, args, kwargs, out = prepare_launch(
            x, weight, stride, padding, cfg, scale, shift, act
        )
        launcher = rl.Launcher(kernel, grid, kwargs, rl.device_index(x))
        launcher(*args)
        _op_plans.put(key, (launcher, weight, args[1], args[5:], tuple(out.shape)))
        return out
    launcher, _weight, wk, tail, out_shape = plan
    out = torch.empty(out_shape, dtype=x.dtype, device=x.device)
    launcher(x, wk, wk if scale is None else scale, wk if shift is None else shift, out, *tail)
    return out


def _impl(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    act: int,
) -> torch.Tensor:
    if dk.KERNEL is not None and (x.is_cuda or INTERPRETING):
        try:
            st, pad = (int(stride[0]), int(stride[1])), (int(padding[0]), int(padding[1]))
            return _op_conv(x, weight, scale, shift, st, pad, act)
        except Exception as exc:  # noqa: BLE001
            y = _reference(x, weight, scale, shift, stride, padding, act)
            ks.warn_once(
                "depthwise-op:" + type(exc).__name__,
                f"rocmfix: the depthwise conv kernel failed ({type(exc).__name__}: {exc}); "
                "running F.conv2d",
            )
            return y
    return _reference(x, weight, scale, shift, stride, padding, act)


def _reference(*args: Any) -> torch.Tensor:
    # NCHW-contiguous, as the fake says: Inductor reads the result by the fake's strides, and
    # F.conv2d keeps a channels-last input's layout (Inductor on the CPU runs convs so).
    return dop.reference(*args).contiguous()


# A triton op where torch has them (its graph body in depthwise_conv_op), else opaque; eager
# calls of it run _impl either way.
_OP = rop.register_triton_op(
    OP_NAME,
    "(Tensor x, Tensor weight, Tensor? scale, Tensor? shift, int[] stride, int[] padding, "
    "int act) -> Tensor",
    dop.graph,
    _impl,
    _impl,
    dop.fake,
)


def conv2d(x: torch.Tensor, weight: torch.Tensor, bias: Any, *call: Any) -> torch.Tensor:
    """``F.conv2d`` of a depthwise conv of GPU tensors (no dilation) through the kernel alone,
    as ``rocmfix profile`` replays it (CPU tensors under the interpreter); NotImplementedError
    for any other call, or where Triton is missing."""
    stride, padding, dilation, groups = call
    depthwise = x.dim() == 4 and groups == x.shape[1] == weight.shape[0] and weight.shape[1] == 1
    runs = (x.is_cuda or INTERPRETING) and _dw_kernel is not None
    if not (depthwise and runs and dilation == [1, 1]):
        raise NotImplementedError("not a depthwise conv the kernel runs")
    if isinstance(padding, str):
        raise NotImplementedError("padding on one side only")
    y = conv(x, weight, (stride[0], stride[1]), (padding[0], padding[1]))
    return y if bias is None else y + bias.view(1, -1, 1, 1)
