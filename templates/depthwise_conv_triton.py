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
Tile configs are data (:data:`SHIPPED_CONFIGS`), merged with the tuned file and
``$ROCMFIX_DEPTHWISE_CONV_CONFIG`` by ``rocmfix_kernel_config``. The kernel, and how a
call becomes its launch, live in ``depthwise_conv_kernels``; Triton itself, the launcher and the
custom op come from the shared ``rocmfix_*`` modules; all are dropped beside this file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from . import depthwise_conv_kernels as dk
from . import rocmfix_custom_op as rop
from . import rocmfix_kernel_config as kc
from . import rocmfix_kernel_support as ks
from . import rocmfix_triton as rt

SCHEME = "triton"
OP_NAME = "depthwise_conv2d"
MAX_KERNEL = 9
_INT32_MAX = 2**31 - 1

device_arch = kc.device_arch
triton = rt.triton
INTERPRETING = rt.INTERPRETING
prepare_launch = dk.prepare_launch
_pair = ks.pair
# The kernel itself (None without Triton), where rocmfix's profiler looks for it.
_dw_kernel = dk.KERNEL

# --------------------------------------------------------------------------------------------
# Tile configs
# --------------------------------------------------------------------------------------------

KERNEL = "depthwise_conv"
CONFIG_ENV = "ROCMFIX_DEPTHWISE_CONV_CONFIG"

# Layers, least specific first: "any", the input layout ("nchw" or "nhwc"), the precision
# class ("fp32", "f16"), the shape class ("k5_s1", "k1x7_s1") and "<shape>_<precision>".
# BLOCK_P output pixels (whole rows and more of a plane) by BLOCK_C channels per program. An
# arch's entry replaces the default's fields, whatever their layer: each arch names its own
# channels-last tile.
_NCHW = {"BLOCK_P": 256, "BLOCK_C": 1, "num_warps": 4, "num_stages": 1}
# Channels-last input: channels are the contiguous axis, so a program reads them first.
_NHWC = {"BLOCK_P": 32, "BLOCK_C": 32}


def _arch(**layers: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {"any": dict(_NCHW), "nhwc": dict(_NHWC), **layers}


SHIPPED_CONFIGS: dict[str, dict[str, dict[str, Any]]] = {
    "default": _arch(),
    # CDNA (wave64): 512 pixels on 4 waves, so that a pair tile (VEC 2) holds a pair per
    # lane. Unmeasured.
    "gfx90a": _arch(any=dict(_NCHW, BLOCK_P=512)),
    "gfx942": _arch(any=dict(_NCHW, BLOCK_P=512)),
    "gfx950": _arch(any=dict(_NCHW, BLOCK_P=512)),
    # RDNA (wave32): 256 pixels on 4 warps, a pair per lane. Unmeasured.
    "gfx1100": _arch(),
    "gfx1201": _arch(),
    # Hopper: from bench/depthwise_conv.py's sweep at MinerU's 25 shapes (H100, torch 2.11,
    # Triton 3.6, 2026-11-25; docs/performance-depthwise.md). Two output rows a position
    # (ROWS 2) on 128 positions and 4 warps (a pair tile: 256) is within 8% of the best of 17
    # tiles at every fp32 shape of 50x50 and up, stride 1 and 2, and within 0.5 us at the
    # launch-bound smaller ones (5x5 240x168: 11.4 us, 13.3 with one row). Recognition's
    # fp16 3x3s at 12x80, 6x80 and 3x80 want one row (two waste a third of a 3-row plane's
    # tile), as do the formula encoder's fp16 5x5s (10.5 and 8.6 us on 2 channels of 128
    # pixels, 2 warps, against 11.1 and 7.8 with two rows: a wash at 36 and 18 calls a
    # page); its fp16 stride-2 3x3s take two rows on 2 channels (18.1, 14.5 and 10.1 us at
    # 96x96, 48x48 and 24x24, was 21.3, 18.3 and 12.8). Channels-last keeps one row:
    # unmeasured. A pair tile (VEC 2) is at least 64 positions a warp whatever the entry says.
    "sm_90": _arch(
        any=dict(_NCHW, BLOCK_P=128, ROWS=2),
        nhwc=dict(_NHWC, ROWS=1),
        k3_s1_f16={"BLOCK_P": 128, "BLOCK_C": 2, "num_warps": 2, "ROWS": 1},
        k5_s1_f16={"BLOCK_P": 128, "BLOCK_C": 2, "num_warps": 2, "ROWS": 1},
        k3_s2_f16={"BLOCK_P": 128, "BLOCK_C": 2, "num_warps": 2, "ROWS": 2},
    ),
}

CONFIG = kc.KernelConfig(
    KERNEL,
    CONFIG_ENV,
    SHIPPED_CONFIGS,
    {
        "BLOCK_P": kc.pow2(16, 4096),
        "BLOCK_C": kc.pow2(1, 128),
        "VEC": kc.pow2(1, 2),
        "ROWS": kc.pow2(1, 2),
    },
)


def precision_class(dtype: torch.dtype, arch: str = "") -> str:
    """``f16`` for fp16/bf16, ``fp32`` for fp32 (no dot: no TF32 class)."""
    return "fp32" if dtype == torch.float32 else "f16"


def shape_class(kh: int, kw: int, stride: int) -> str:
    size = f"k{kh}" if kh == kw else f"k{kh}x{kw}"
    return f"{size}_s{stride}"


def layout_class(x: torch.Tensor) -> str:
    return "nhwc" if x.dim() == 4 and x.stride(1) == 1 and x.shape[1] > 1 else "nchw"


def resolve_config(
    device: torch.device | str | int | None = None,
    kh: int = 3,
    kw: int = 3,
    stride: int = 1,
    dtype: torch.dtype = torch.float32,
    layout: str = "nchw",
    *,
    arch: str | None = None,
) -> dict[str, Any]:
    """The tile config of one conv shape on ``device`` (see rocmfix_kernel_config)."""
    arch = arch or kc.device_arch(device)
    prec = precision_class(dtype, arch)
    shape = shape_class(kh, kw, stride)
    return CONFIG.resolve(arch, ("any", layout, prec, shape, f"{shape}_{prec}"))


# The launch of each key: (Launcher, the arguments after the output, the output's shape, the
# weight's contiguity). A key holds everything Triton specialises on (each tensor's shape,
# strides, dtype, device and 16-byte alignment, as rt.layout_key, the conv's stride and
# padding, the fused activation) and nothing derived from a tensor's values, so a plan cannot
# go stale. What is (the folded BatchNorm) is ks.fold_bn's, which re-checks its sources on
# every call. The eager key holds the layer's type and settings in place of the stride and
# padding: all _conv_geometry reads, so it runs once a key.
_plans: ks.BoundedCache[tuple[Any, ...], tuple[Any, ...]] = ks.BoundedCache(256)
# The keys that run the modules: a geometry the kernel does not compute, or a failed launch.
_broken: ks.BoundedCache[tuple[Any, ...], bool] = ks.BoundedCache(256)
# Autocast (the stock conv in its dtype), a torch.jit trace and torch.compile's tracing take
# other paths than the eager one.
_autocast, _tracing, _compiling = ks.any_autocast, torch._C._get_tracing_state, rop.is_compiling
_grad_enabled = torch.is_grad_enabled


def clear_config_cache() -> None:
    """Forget the tuned file, env config, arch queries, launch plans and folds (tune, tests,
    and code that writes a live model's weights through ``.data``, which moves no version)."""
    CONFIG.clear()
    for cache in (_plans, _broken):
        cache.clear()
    ks.clear_folds()


# --------------------------------------------------------------------------------------------
# Launch
# --------------------------------------------------------------------------------------------


def _config(
    x: torch.Tensor, weight: torch.Tensor, stride: int, config: dict[str, Any] | None
) -> dict[str, Any]:
    """The config a call of ``x`` resolves, with ``config``'s fields over it (tune, doctor)."""
    kh, kw = int(weight.shape[2]), int(weight.shape[3])
    cfg = resolve_config(x.device, kh, kw, stride, x.dtype, layout_class(x))
    cfg.update(CONFIG.validate(config or {}))
    return cfg


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
    ones = torch.ones(x.shape[1], dtype=torch.float32, device=x.device)
    pad = ((kh - 1) // 2, (kw - 1) // 2)
    kernel, grid, args, kwargs, _ = prepare_launch(
        x, weight, (stride, stride), pad, _config(x, weight, stride, config), ones, ones, act
    )
    return kernel, grid, args, kwargs


def conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    *,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    act: int = 0,
    config: dict[str, Any] | None = None,
) -> torch.Tensor:
    """The kernel alone, no checks and no fallback, for ``rocmfix tune``/``doctor`` and tests:
    ``act(conv(x) * scale + shift)``; ``config`` over the resolved one."""
    if dk.KERNEL is None:
        raise RuntimeError("triton is not importable")
    st, pad = _pair(stride), _pair(padding)
    assert st is not None and pad is not None
    cfg = _config(x, weight, st[0], config)
    kernel, grid, args, kwargs, out = prepare_launch(x, weight, st, pad, cfg, scale, shift, act)
    rt.Launcher(kernel, grid, kwargs, rt.device_index(x)).launch_once(*args)
    return out


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def _conv_geometry(x: torch.Tensor, layer: Any) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """(stride, padding) where the kernel computes ``layer(x)``, else None."""
    if not ks.plain(x, layer, torch.nn.Conv2d):
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


def _epilogue(bias: Any, bn: Any, act: Any) -> tuple[Any, Any, int, bool, bool] | None:
    """(scale, shift, act code, bn fused, act fused), or None where even the conv's bias
    cannot be applied (it records gradients)."""
    code = ks.act_code(act)
    folded = None if bn is None else ks.fold_bn(bn, bias)
    bn_done = bn is None or folded is not None
    if folded is None:
        folded = ks.fold_bn(None, bias)
        if folded is None:
            return None
    # A BatchNorm called as a module comes between the conv and the activation.
    act_done = bn_done and code is not None
    return folded[0], folded[1], code if code is not None and act_done else 0, bn_done, act_done


def _launch(
    key: tuple[Any, ...],
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    stride: tuple[int, int],
    padding: tuple[int, int],
    act: int,
    layer: Any = None,
) -> torch.Tensor | None:
    """The kernel's output for one call the caller checked, launched through the plan of
    ``key`` (made on the key's first call: config resolved, Launcher made), or None where the
    key runs the modules. The eager entry passes ``layer``, whose geometry (stride, padding)
    is checked once a key."""
    plan = _plans.get(key)
    if plan is not None:
        launcher, rest, shape, contiguous = plan
        out = x.new_empty(shape)
        # The kernel reads [C, KH*KW], a contiguous weight's own layout (the key fixes which).
        wk = weight if contiguous else weight.contiguous()
        launcher(x, wk, wk if scale is None else scale, wk if shift is None else shift, out,
                 *rest)  # fmt: skip
        return out
    if _broken.get(key):
        return None
    if layer is not None:
        geometry = _conv_geometry(x, layer)
        if geometry is None:
            _broken.put(key, True)
            return None
        stride, padding = geometry
    kh, kw = int(weight.shape[2]), int(weight.shape[3])
    cfg = resolve_config(x.device, kh, kw, stride[0], x.dtype, layout_class(x))
    kernel, grid, args, kwargs, out = prepare_launch(
        x, weight, stride, padding, cfg, scale, shift, act
    )
    launcher = rt.Launcher(kernel, grid, kwargs, rt.device_index(x))
    try:
        launcher(*args)
    except Exception:
        _broken.put(key, True)
        raise
    _plans.put(key, (launcher, args[5:], tuple(out.shape), weight.is_contiguous()))
    return out


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
    if not isinstance(x, torch.Tensor):
        return ks.stock(x, conv, bn, act)  # torch.fx's symbolic trace records the modules
    if triton is None:
        if x.is_cuda:  # a warning that cannot raise (ks.warn_once)
            ks.warn_once("no-triton", "rocmfix: triton is not importable; depthwise convs run "
                         "the stock modules")  # fmt: skip
        return ks.stock(x, conv, bn, act)
    if not (x.is_cuda or INTERPRETING):
        return ks.stock(x, conv, bn, act)
    if _compiling():
        traced = _traced(x, conv, bn, act)
        return ks.stock(x, conv, bn, act) if traced is None else traced
    if _tracing() is not None or not isinstance(conv, torch.nn.Conv2d):
        return ks.stock(x, conv, bn, act)  # a torch.jit trace records no Triton launch
    # The eager path, its checks cheapest first and its key built here: a repeat call's host
    # time is what a launch-bound layer costs.
    try:
        params = conv._parameters
        weight, bias = params.get("weight"), params.get("bias")
        # Autograd recording (the stock modules have a backward), autocast, a hook or a
        # training BatchNorm: the stock modules. No epilogue: the bias records gradients.
        epilogue = None
        if (
            weight is not None
            and not (_grad_enabled() and ks.training(x, weight, bias, bn=bn))
            and not _autocast()
            and not ks.layer_hooked(conv, bn, act)
        ):
            epilogue = _epilogue(bias, bn, act)
        if weight is not None and epilogue is not None:
            scale, shift, code, bn_done, act_done = epilogue
            # rt.layout_key of x and the weight, flat (a nested tuple costs a frame a tensor).
            key = (x.shape, x.stride(), x.dtype, x.get_device(), x.data_ptr() % 16,
                   weight.shape, weight.stride(), weight.dtype, weight.get_device(),
                   weight.data_ptr() % 16, type(conv), conv.stride, conv.padding,
                   conv.dilation, conv.groups, conv.padding_mode, code,
                   None if scale is None else rt.layout_key(scale),
                   None if shift is None else rt.layout_key(shift))  # fmt: skip
            out = _launch(key, x, weight, scale, shift, (1, 1), (0, 0), code, conv)
            if out is not None:
                if not bn_done and bn is not None:
                    out = bn(out)
                if not act_done and act is not None:
                    out = act(out)
                return out
    except Exception as exc:  # noqa: BLE001 - a dropped kernel must never take the model down
        y = ks.stock(x, conv, bn, act)  # the stock result first, then the report
        _failed(exc)
        return y
    return ks.stock(x, conv, bn, act)


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


def _failed(exc: Exception) -> None:
    ks.failed("the depthwise conv kernel", exc)


# --------------------------------------------------------------------------------------------
# torch.compile: one custom op
# --------------------------------------------------------------------------------------------


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
            key = (rt.layout_key(x), rt.layout_key(weight), st, pad, act,
                   None if scale is None else rt.layout_key(scale),
                   None if shift is None else rt.layout_key(shift))  # fmt: skip
            out = _launch(key, x, weight, scale, shift, st, pad, act)
            if out is not None:
                return out  # else: warned when it broke
        except Exception as exc:  # noqa: BLE001
            y = reference(x, weight, scale, shift, stride, padding, act)
            _failed(exc)
            return y
    return reference(x, weight, scale, shift, stride, padding, act)


def reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    act: int,
) -> torch.Tensor:
    """The op in torch, NCHW-contiguous as the fake says: Inductor reads the result by the
    fake's strides, and F.conv2d keeps a channels-last input's layout (Inductor on the CPU runs
    convs so)."""
    y = F.conv2d(x, weight, None, stride, padding, 1, x.shape[1]).float()
    if scale is not None:
        y = y * scale.view(1, -1, 1, 1)
    if shift is not None:
        y = y + shift.view(1, -1, 1, 1)
    return ks.apply_act(y, act).to(x.dtype).contiguous()


def fake(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    act: int,
) -> torch.Tensor:
    """The op's output on fake tensors (its opaque op's fake implementation)."""
    n, c, h, w = x.shape
    oh = (h + 2 * padding[0] - weight.shape[2]) // stride[0] + 1
    ow = (w + 2 * padding[1] - weight.shape[3]) // stride[1] + 1
    return x.new_empty((n, c, oh, ow))


def graph(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    act: int,
) -> torch.Tensor:
    """``act(conv(x) * scale + shift)``, NCHW-contiguous: the kernel's launch for CUDA/HIP
    tensors (the entry's traced path checked the geometry), :func:`reference` elsewhere (the
    interpreter's kernel is not compiled: ``wrap_triton`` cannot trace it)."""
    if dk.KERNEL is None or INTERPRETING or x.device.type != "cuda":
        return reference(x, weight, scale, shift, stride, padding, act)
    st, pad = (int(stride[0]), int(stride[1])), (int(padding[0]), int(padding[1]))
    kh, kw = int(weight.shape[2]), int(weight.shape[3])
    cfg = resolve_config(x.device, kh, kw, st[0], x.dtype, layout_class(x))
    # The eager plan's launch; whether it reads pairs is chosen from what the fake promises.
    kernel, grid, args, kwargs, out = dk.prepare_launch(
        x, weight, st, pad, cfg, scale, shift, act, aligned=rop.offset_aligned
    )
    rop.launch_traced(kernel, grid, args, kwargs)
    return out


# A triton op where torch has them (its graph body: graph), else opaque; eager
# calls of it run _impl either way.
_OP = rop.register_triton_op(
    OP_NAME,
    "(Tensor x, Tensor weight, Tensor? scale, Tensor? shift, int[] stride, int[] padding, "
    "int act) -> Tensor",
    graph,
    _impl,
    _impl,
    fake,
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
