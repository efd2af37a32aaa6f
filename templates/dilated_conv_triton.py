"""Triton dilated conv2d for DocLayout-YOLO's ``DilatedBlock.dilated_conv`` (rocmfix template).

rocmfix dropped this file into ``doclayout_yolo/nn/modules/`` as ``g2l_crm_triton.py`` and rewrote
``DilatedBlock.dilated_conv`` to call :func:`dilated_conv2d` for GPU inputs with the block's
``bn`` and ``act``, which the kernel applies as it stores (an eval-mode BatchNorm and SiLU; other
modules are called on its output).  ``rocmfix revert`` removes this file and restores the
original method.

Why: on ROCm, MIOpen has no fast solver for dilation > 1 and falls back to a naive kernel.  This
module computes the same thing as ``F.conv2d(x, w, None, stride=1, padding=p, dilation=d)``
(then, where the block passes them, its BatchNorm and SiLU) with a Triton kernel, an implicit
GEMM (no im2col buffer) through ``tl.dot``. Config flags pick how the input is read: ``nhwc``
(a channels-last copy of x, so each thread moves 16 bytes), ``tma`` (tensor descriptors:
Hopper's TMA, one output-row segment per program) or neither (strided loads straight from x,
any layout).

The kernel and how a launch is prepared live in ``dilated_conv_kernels``, the launch
configurations (data keyed by GPU arch) in ``dilated_conv_config``, both dropped beside this
module with the shared ``rocmfix_*`` support modules (``rocmfix_kernel_config`` merges the
configs with the tuned file and ``$ROCMFIX_DILATED_CONV_CONFIG``).  Batch, height and width
are kept out of Triton's specialisation, so a new page size does not compile a new kernel.
There is no backward pass: run inference under ``torch.no_grad()`` or ``torch.inference_mode()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from . import dilated_conv_config as dc
from . import dilated_conv_kernels as dk
from . import rocmfix_custom_op as rop
from . import rocmfix_kernel_config as kc
from . import rocmfix_kernel_support as ks
from . import rocmfix_triton as rt

if TYPE_CHECKING:
    Epilogue = dk.Epilogue

SCHEME = "gemm"
# The kernel's identity, configs and their resolution, where rocmfix's tools look for them.
CONFIG_ENV, KERNEL, CONFIG = dc.CONFIG_ENV, dc.KERNEL, dc.CONFIG
resolve_config, precision_class, shape_class = dc.resolve_config, dc.precision_class, dc.shape_class
triton = rt.triton
INTERPRETING = rt.INTERPRETING
device_arch = kc.device_arch

_INT32_MAX = 2**31 - 1

# Only an explicit config (the kernel alone: tune, tests) gets here with autograd recording;
# the patched block's calls run the stock conv then (dilated_conv2d).
_NO_BACKWARD_MSG = (
    "rocmfix's Triton dilated conv (doclayout_yolo g2l_crm_triton) has no backward pass: "
    "call it with an explicit config under torch.no_grad() or torch.inference_mode()"
)


def clear_config_cache() -> None:
    """Forget the cached tuned file, env parse, resolved configs, launch plans, packed weights
    and folded BatchNorms (for ``rocmfix tune``, tests, and code that writes a live model's
    weights through ``.data``, which moves no version)."""
    CONFIG.clear()
    _PLANS.clear()
    dk.clear_packs()
    ks.clear_folds()


# What an optimizer step makes stale (ks.training_seen): the packed weights.
ks.derived(dk.clear_packs)


def _triton_usable(x: torch.Tensor) -> bool:
    if not rt.HAS_TRITON:
        ks.warn_once(
            "no-triton",
            f"rocmfix: triton is not importable ({rt.IMPORT_ERROR!r}); "
            "the dilated conv falls back to F.conv2d",
        )
        return False
    if x.device.type == "cuda":
        return not INTERPRETING
    return x.device.type == "cpu" and INTERPRETING


def prepare(
    x: torch.Tensor,
    weight: torch.Tensor,
    dilation: int,
    padding: int | tuple[int, int],
    config: dict[str, Any] | None = None,
    epilogue: int = 0,
) -> tuple[Any, tuple[int], tuple[Any, ...], dict[str, Any]]:
    """What one call of :func:`dilated_conv2d` would launch, from the same config resolution
    and preparation, without launching: rocmfix's ahead-of-time compile check compiles it for
    GPUs it does not have. ``epilogue`` 2 is the kernel a block with an eval BatchNorm and
    SiLU runs (1: BatchNorm alone)."""
    c_out, c_in, kh, kw = weight.shape
    cfg = _explicit(x, c_in, c_out, max(kh, kw), config or {})
    fold = None
    if epilogue:
        zeros = torch.zeros(c_out, dtype=torch.float32, device=x.device)
        fold = (zeros, zeros, epilogue)
    kernel, grid, args, kwargs, _ = dk.prepare_launch(
        x, weight, dilation, padding, cfg, epilogue=fold
    )
    return kernel, grid, args, kwargs


def _explicit(x: torch.Tensor, c: int, co: int, k: int, config: dict[str, Any]) -> dict[str, Any]:
    """The resolved config with ``config``'s fields over it, as tune and tests pass them; a
    tf32 setting only applies where tf32 is this GPU's precision for ``x``."""
    cfg = resolve_config(x.device, c, co, k, x.dtype)
    cfg.update(CONFIG.validate(config))
    if precision_class(x.dtype, device_arch(x.device)) != "tf32":
        cfg["input_precision"] = "ieee"
    return cfg


_tracing = torch._C._get_tracing_state


def dilated_conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    dilation: int,
    padding: int | tuple[int, int],
    *,
    bn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    act: Callable[[torch.Tensor], torch.Tensor] | None = None,
    config: dict[str, Any] | None = None,
) -> torch.Tensor:
    """``F.conv2d(x, weight, None, stride=1, padding=padding, dilation=dilation)``, then
    ``act(bn(...))`` where they are given (the block's own modules).

    Runs the Triton kernel for fp32/fp16/bf16 GPU tensors (CPU tensors only under
    ``TRITON_INTERPRET=1``) at dilation > 1, and ``F.conv2d`` otherwise.  An eval-mode
    ``nn.BatchNorm2d`` and an ``nn.SiLU`` or ``nn.Identity`` without hooks run in the kernel's
    store; any other module is called on the output, as the block would call it.  ``config``
    overrides the resolved launch config field by field (``rocmfix tune`` uses it); it is not
    validated against the hardware.  Output is NCHW-contiguous.
    """
    if config is None and rop.is_compiling():
        return _traced(x, weight, dilation, padding, bn, act)
    epilogue, fused = None, False
    if config is None and ks.training(x, weight, bn=bn):
        # Autograd records (training): the stock conv, which has a backward.
        y = F.conv2d(x, weight, None, 1, padding, dilation)
    elif config is None and (dilation == 1 or ks.any_autocast() or _tracing() is not None):
        # A dense conv: the vendor libraries run it fast (MIOpen leaves out its GEMM solvers
        # only for dilation > 1), and DocLayout-YOLO's blocks make a third of their calls at
        # d = 1. Explicit configs (tests, tune) still run the kernel. Under autocast F.conv2d
        # runs in autocast's dtype (the kernel keeps x's), and a torch.jit trace records no
        # Triton launch.
        y = F.conv2d(x, weight, None, 1, padding, dilation)
    else:
        try:
            if bn is not None:
                epilogue = _epilogue(bn, act)
            y, fused = _conv(x, weight, dilation, padding, config, epilogue)
        except Exception as exc:  # a dropped kernel must never take the model down
            if config is not None:  # tune and the tests asked for the kernel itself
                raise
            y, fused = F.conv2d(x, weight, None, 1, padding, dilation), False
            ks.failed("the dilated conv kernel", exc, "running F.conv2d")
    if not fused:  # the kernel did not apply them: the modules see a plain conv
        if bn is not None:
            y = bn(y)
        if act is not None:
            y = act(y)
    return y


def _conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    dilation: Any,
    padding: Any,
    config: dict[str, Any] | None,
    epilogue: Epilogue | None,
) -> tuple[torch.Tensor, bool]:
    """The conv, and whether ``epilogue`` was applied to it: the kernel applies it, a call
    that falls back to ``F.conv2d`` does not."""
    key = None
    if config is None:
        # DocLayout-YOLO calls this 16 times per page at d > 1 and is launch-bound at batch 1,
        # so a call whose key was seen before skips straight to the launch: the checks below
        # passed for that key, and only the input, the output and autograd are new.
        key = _plan_key(x, weight, dilation, padding, epilogue)
        plan = _PLANS.get(key) if key is not None else None
        if plan is not None and not (
            torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
        ):
            return _replay(x, weight, plan, epilogue), epilogue is not None
    if isinstance(dilation, (tuple, list)):
        if len(set(dilation)) != 1:
            return F.conv2d(x, weight, None, 1, padding, dilation), False
        dilation = dilation[0]
    dilation = int(dilation)
    if (
        not _triton_usable(x)
        or x.dim() != 4
        or weight.dim() != 4
        or x.dtype not in ks.DTYPES
        or weight.dtype != x.dtype
        or weight.device != x.device
        or weight.shape[1] != x.shape[1]
        or x.shape[0] == 0
        or dilation < 1
        # The fold's device and length (a key holds them, so a later call need not check).
        or (epilogue is not None and epilogue[0].device != x.device)
        or (epilogue is not None and epilogue[0].numel() != weight.shape[0])
    ):
        return F.conv2d(x, weight, None, 1, padding, dilation), False
    pad_h, pad_w = dk._pair(padding, "padding")
    if not _fits(x, weight, dilation, pad_h, pad_w):
        # Let torch raise its own error or handle what 32-bit indexing cannot.
        return F.conv2d(x, weight, None, 1, padding, dilation), False
    c, co, k = x.shape[1], weight.shape[0], max(weight.shape[2:])
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        raise RuntimeError(_NO_BACKWARD_MSG)
    # The tuned file and the environment are read here, when a key is first seen (and again
    # after clear_config_cache()), not per call: each lookup is host time.
    cfg = _explicit(x, c, co, k, config) if config else resolve_config(x.device, c, co, k, x.dtype)
    kernel, grid, args, kwargs, out = dk.prepare_launch(
        x, weight, dilation, (pad_h, pad_w), cfg, epilogue=epilogue
    )
    # Every tensor's alignment is fixed by the key (the input is keyed; its channels-last copy,
    # the packed weight, the output and the epilogue's scale and shift are fresh allocations),
    # as the Launcher needs.
    launcher = rt.Launcher(kernel, grid, kwargs, rt.device_index(x))
    if config:  # explicit configs (tests, `rocmfix tune`) skip the plan cache
        launcher.launch_once(*args)
        return out, epilogue is not None
    launcher(*args)
    if key is not None:
        pack = (kwargs["C_PAD"], kwargs["CO_PAD"], x.dtype, kwargs["W_KMAJOR"])
        tma = kwargs["KIND"] == "tma"
        _PLANS.put(key, (launcher, args[0] is not x, pack, args[5:], out.shape, tma))
    return out, epilogue is not None


def _plan_key(
    x: torch.Tensor, weight: torch.Tensor, dilation: Any, padding: Any, epilogue: Epilogue | None
) -> tuple[Any, ...] | None:
    """Everything a call's launch depends on but its tensors' addresses and values, or None
    for a call that is not cached (a list is no key)."""
    if type(dilation) is not int or not (
        type(padding) is int or (type(padding) is tuple and all(type(v) is int for v in padding))
    ):
        return None
    return (
        rt.layout_key(x),
        rt.layout_key(weight),
        dilation,
        padding,
        # TF32 or IEEE is read from torch per call, as cuDNN reads it (fp32 only).
        dc.torch_allows_tf32() if x.dtype == torch.float32 else None,
        # The fold's kind, device and length: the first call of a key checked them against
        # x's device and the weight's output channels.
        (epilogue[2], epilogue[0].get_device(), epilogue[0].shape) if epilogue else None,
    )


def _replay(
    x: torch.Tensor, weight: torch.Tensor, plan: tuple[Any, ...], epilogue: Epilogue | None
) -> torch.Tensor:
    launcher, to_cl, pack, tail, out_shape, tma = plan
    packed = dk._packed_weight(weight, *pack)  # cached by the weight's address and version
    if tma:
        dk._ensure_allocator()  # per thread: a plan made in one thread may run in another
    xin = x.contiguous(memory_format=torch.channels_last) if to_cl else x
    out = torch.empty(out_shape, dtype=x.dtype, device=x.device)
    if epilogue is None:
        launcher(xin, packed, out, packed, packed, *tail)
    else:
        launcher(xin, packed, out, epilogue[0], epilogue[1], *tail)
    return out


PLAN_CACHE_SIZE = 256
_PLANS: ks.BoundedCache[tuple[Any, ...], tuple[Any, ...]] = ks.BoundedCache(PLAN_CACHE_SIZE)

# --------------------------------------------------------------------------------------------
# The block's BatchNorm and activation, folded into the kernel's store
# --------------------------------------------------------------------------------------------

# The store's code of each activation it applies after the fold (by ks.act_code's codes).
_STORE: dict[int | None, int] = {ks.ACT_NONE: dk.EPILOGUE_FOLD, ks.ACT_SILU: dk.EPILOGUE_FOLD_SILU}


def _epilogue(bn: Any, act: Any, traced: bool = False) -> Epilogue | None:
    """``act(bn(y))`` as a per-channel scale and shift (and SiLU), or None where the modules
    must run: anything but an ``nn.BatchNorm2d`` the kernel may fold
    (rocmfix_kernel_support.foldable_bn) and an ``nn.SiLU``/``nn.Identity``/None activation
    without hooks (a subclass, a forward hook, train mode: the block calls them itself), where
    autograd records through the BatchNorm's parameters (to autograd the fold is a constant),
    or where its tensors are inference tensors (a model built under inference_mode), which have
    no version to see an update by.

    The fold is computed once per module and reused while its statistics, affine parameters
    and eps are the same tensors at the same addresses and versions (an in-place update, a
    ``load_state_dict`` or a ``.to()`` moves one of them). ``traced``: the fold as traced ops
    (a few per-channel ops the graph recomputes) instead of looked up by the module's id and
    versions, which would guard the graph on them.
    """
    code = _STORE.get(ks.act_code(act))
    if code is None or not ks.foldable_bn(bn) or ks.global_hooks():
        return None
    fold: ks.Fold | None
    if traced:
        tensors = (bn.running_mean, bn.running_var, bn.weight, bn.bias)
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
            return None
        fold = ks.fold_traced(bn, None)
    else:
        fold = ks.fold_bn(bn, None, versioned=True)
    if fold is None:
        return None
    scale, shift = fold
    return scale, shift, code  # type: ignore[return-value]  # bn given: both are tensors


# --------------------------------------------------------------------------------------------
# torch.compile: one opaque op
# --------------------------------------------------------------------------------------------

OP_NAME = "dilated_conv2d"
# The BatchNorm's fold and the activation travel as tensors and a code, never as modules: an
# op's arguments are what the graph can hold. act 0: none (scale and shift unused), 1: the
# scale and shift, 2: then SiLU.
OP_SCHEMA = (
    "(Tensor x, Tensor weight, int dilation, int[2] padding, Tensor? scale, Tensor? shift, "
    "int act) -> Tensor"
)


def _apply_fold(
    y: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, code: int
) -> torch.Tensor:
    # What the kernel's store computes: fp32 math, then the output's dtype.
    z = y.float() * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1)
    if code == 2:
        z = F.silu(z)
    return z.to(y.dtype)


def _impl(
    x: torch.Tensor,
    weight: torch.Tensor,
    dilation: int,
    padding: list[int],
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    act: int,
) -> torch.Tensor:
    """The op on real tensors: the eager path (the cached launcher, or F.conv2d wherever the
    kernel does not apply), then the fold in torch where the kernel did not apply it. The
    result is NCHW-contiguous, as the fake says: Inductor lays out what follows by it."""
    epilogue = (scale, shift, act) if act and scale is not None and shift is not None else None
    y, fused = _conv(x, weight, dilation, (padding[0], padding[1]), None, epilogue)
    if epilogue is not None and not fused:
        y = _apply_fold(y, epilogue[0], epilogue[1], act)
    return y.contiguous()


def _fake(
    x: torch.Tensor,
    weight: torch.Tensor,
    dilation: int,
    padding: list[int],
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    act: int,
) -> torch.Tensor:
    n, _, h, w = x.shape
    co, _, kh, kw = weight.shape
    oh = h + 2 * padding[0] - dilation * (kh - 1)
    ow = w + 2 * padding[1] - dilation * (kw - 1)
    return x.new_empty((n, co, oh, ow))


def _graph(
    x: torch.Tensor,
    weight: torch.Tensor,
    dilation: int,
    padding: list[int],
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    act: int,
) -> torch.Tensor:
    """The op as Inductor sees it (a triton op's body, see rocmfix_custom_op): the kernel
    launched through ``wrap_triton`` with the config and the tile the eager plan resolves,
    everything around it torch ops the compiler schedules (``dk.launch_args``): the
    channels-last copy of x, the packed weight, the output. A call the kernel does not take
    (the checks of :func:`_conv` on what a fake tensor knows; sizes may be symbolic: a
    comparison guards) is F.conv2d and the fold in torch, as :func:`_conv` falls back; so is
    every CPU graph, and any under TRITON_INTERPRET=1: the interpreter's kernels are not
    compiled ones, which wrap_triton cannot trace."""
    epilogue = (scale, shift, act) if act and scale is not None and shift is not None else None
    if (
        x.device.type != "cuda"
        or INTERPRETING
        or not rt.HAS_TRITON
        or x.dtype not in ks.DTYPES
        or weight.dtype != x.dtype
        or weight.device != x.device
        or weight.shape[1] != x.shape[1]
        or not _fits(x, weight, dilation, padding[0], padding[1])
    ):
        # F.conv2d raises its own error, or handles what 32 bits cannot.
        y = F.conv2d(x, weight, None, 1, padding, dilation)
        return (y if epilogue is None else _apply_fold(y, *epilogue)).contiguous()
    c, co, k = x.shape[1], weight.shape[0], max(weight.shape[2:])
    launch = resolve_config(x.device, c, co, k, x.dtype)
    pads = (padding[0], padding[1])
    _kind, grid, args, kwargs = dk.launch_args(x, weight, dilation, pads, launch, epilogue, False)
    rop.launch_traced(dk.KERNEL, grid, args, {**kwargs, **kc.launch_options(launch)})
    out: torch.Tensor = args[2]
    return out


def _fits(x: torch.Tensor, weight: torch.Tensor, dilation: int, pad_h: Any, pad_w: Any) -> bool:
    """Whether the kernel computes this conv: padding, an output, channels, and 32-bit offsets
    into x (or its dense channels-last copy) and the output. A graph's sizes may be symbolic:
    each comparison guards."""
    n, c, h, w = x.shape
    co, _, kh, kw = weight.shape
    oh = h + 2 * pad_h - dilation * (kh - 1)
    ow = w + 2 * pad_w - dilation * (kw - 1)
    (sn, sc, sh, sw) = x.stride()
    span = max(1 + (n - 1) * sn + (c - 1) * sc + (h - 1) * sh + (w - 1) * sw, n * c * h * w)
    return not (
        bool(pad_h < 0)
        or bool(pad_w < 0)
        or bool(oh < 1)
        or bool(ow < 1)
        or bool(c == 0)
        or bool(co == 0)
        or bool(span > _INT32_MAX)
        or bool(n * co * oh * ow > _INT32_MAX)
    )


# Eager calls of the op (real tensors) run _impl: the cached launcher, or under
# TRITON_INTERPRET=1 the interpreted kernel on CPU tensors, and F.conv2d otherwise.
_OP = rop.register_triton_op(OP_NAME, OP_SCHEMA, _graph, _impl, _impl, _fake)


def _traced(
    x: torch.Tensor,
    weight: torch.Tensor,
    dilation: Any,
    padding: Any,
    bn: Callable[[torch.Tensor], torch.Tensor] | None,
    act: Callable[[torch.Tensor], torch.Tensor] | None,
) -> torch.Tensor:
    """What :func:`dilated_conv2d` is under ``torch.compile``: one ``rocmfix::dilated_conv2d``
    node (the per-call plan lookup is host-side state the graph must not see), and plain
    torch wherever eager mode would not run the kernel either."""
    d = dilation
    if isinstance(d, (tuple, list)) and len(set(d)) == 1:
        d = d[0]
    pad = padding if isinstance(padding, (tuple, list)) else (padding, padding)
    if (
        type(d) is not int
        or d < 2
        or len(pad) != 2
        or not all(type(p) is int and p >= 0 for p in pad)
        or x.dim() != 4
        or weight.dim() != 4
        or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        or ks.autocasting(x)
    ):
        # A dense conv (the vendor's is fast), a shape the kernel does not take, or autograd
        # (the op has no backward): what the block itself runs.
        y = F.conv2d(x, weight, None, 1, padding, dilation)
        fold = None
    else:
        fold = _epilogue(bn, act, traced=True) if bn is not None else None
        if fold is not None:
            return _OP(x, weight, d, list(pad), fold[0], fold[1], fold[2])  # type: ignore[no-any-return]
        y = _OP(x, weight, d, list(pad), None, None, 0)
    if bn is not None:
        y = bn(y)
    return y if act is None else act(y)


def conv2d(x: torch.Tensor, weight: torch.Tensor, bias: Any, *call: Any) -> torch.Tensor:
    """``F.conv2d`` of a dilated conv of GPU tensors (stride 1, one dilation > 1 for both
    axes, one group, padding on both sides) through the kernel, as ``rocmfix profile``
    replays it (CPU tensors under the interpreter); NotImplementedError for any other call."""
    stride, padding, dilation, groups = call
    d = dilation[0]
    dilated = dilation == [d, d] and d > 1 and stride == [1, 1] and groups == 1
    runs = x.is_cuda or INTERPRETING
    if not (runs and x.dim() == 4 and dilated and not isinstance(padding, str)):
        raise NotImplementedError("not a stride-1 dilated conv of GPU tensors")
    y = dilated_conv2d(x, weight, d, (padding[0], padding[1]))
    return y if bias is None else y + bias.view(1, -1, 1, 1)
