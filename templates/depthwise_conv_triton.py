"""Depthwise conv2d as a Triton direct kernel, with the BatchNorm and activation that follow it
in its store (rocmfix template, scheme ``triton``).

rocmfix dropped this file beside a conv-norm-act layer (transformers' HGNetV2, MinerU's ports of
PaddleOCR) and rewrote the layer's forward to call :func:`depthwise_conv2d` with its modules;
``rocmfix revert`` removes it. Why: MIOpen runs depthwise convs through a grouped implicit-GEMM
solver at a tenth of the memory bandwidth, and has no fp32 depthwise path at all.

A depthwise conv (groups == in == out channels) reads each input element KH*KW times from
cache and does as many FMAs: it is bound by memory, so the kernel makes one pass over the input
with the weights in registers and an fp32 accumulator, tiles [BLOCK_C channels x BLOCK_P output
pixels] of one image, then applies ``y * scale + shift`` (an eval-mode BatchNorm folded with the
conv's bias) and ReLU, SiLU, GELU or Hardswish before the one store. Where rows are stride 1
and every width and stride is even (``VEC`` 2), a lane computes two adjacent outputs and reads
its window as aligned input pairs, one load per two taps: half the instructions per tap. NCHW
or channels-last input (any strides), NCHW-contiguous output; fp32, fp16, bf16.

:func:`depthwise_conv2d` never fails: a shape it does not handle (not depthwise, dilation > 1,
CPU tensors outside Triton's interpreter, autograd recording, a training BatchNorm), Triton
missing, or any error of the kernel runs the layer's own modules, with one warning for an error.
Tile configs are data (:data:`SHIPPED_CONFIGS`), merged with the tuned file and
``$ROCMFIX_DEPTHWISE_CONV_CONFIG`` by ``rocmfix_kernel_config``, dropped beside this file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from . import rocmfix_kernel_config as kc
from . import rocmfix_kernel_support as ks

SCHEME = "triton"
KERNEL = "depthwise_conv"
OP_NAME = "depthwise_conv2d"
CONFIG_ENV = "ROCMFIX_DEPTHWISE_CONV_CONFIG"

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - a broken triton install must not break the model's import
    triton = None
    tl = None

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
    # Hopper: from bench/depthwise_conv.py's sweep at MinerU's shapes (H100, torch 2.11,
    # Triton 3.6, 2026-11-24; docs/performance-depthwise.md). 256 pixels on 4 warps is within
    # 10% of the best tile at every shape but two: 5x5 planes of 25x25 and 30x21 (odd widths:
    # one element per tap) want 128 pixels, and the formula encoder's fp16 5x5s at 24x24 and
    # 12x12 (batch 8) 2 channels of 128 pixels on 2 warps (12.1 and 9.8 us against 14.9 and
    # 10.3). A pair tile (VEC 2) is at least 64 pixels a warp whatever the entry says.
    "sm_90": _arch(
        k5_s1={"BLOCK_P": 128},
        k5_s1_f16={"BLOCK_P": 128, "BLOCK_C": 2, "num_warps": 2},
    ),
}

CONFIG = kc.KernelConfig(
    KERNEL,
    CONFIG_ENV,
    SHIPPED_CONFIGS,
    {"BLOCK_P": kc.pow2(16, 4096), "BLOCK_C": kc.pow2(1, 128), "VEC": kc.pow2(1, 2)},
)
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_KERNEL = 9
_INT32_MAX = 2**31 - 1

device_arch = kc.device_arch

# --------------------------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------------------------

if triton is not None:
    # Builtins only, no @triton.jit helpers of triton.language (tl.sigmoid, tl.cdiv): those are
    # compiled-or-interpreted when triton is first imported, and tests set TRITON_INTERPRET=1
    # after that. Sizes stay out of the specialisation: a new page size compiles nothing new.

    @triton.jit
    def _fold_act(acc, scale, shift, HAS_SCALE: tl.constexpr, HAS_SHIFT: tl.constexpr,
                  ACT: tl.constexpr):  # fmt: skip
        if HAS_SCALE:
            acc = acc * scale
        if HAS_SHIFT:
            acc = acc + shift
        if ACT == 1:
            acc = tl.maximum(acc, 0.0)
        elif ACT == 2:
            acc = acc / (1.0 + tl.exp(-acc))
        elif ACT == 3:
            acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
        elif ACT == 4:
            acc = acc * tl.minimum(tl.maximum(acc + 3.0, 0.0), 6.0) / 6.0
        return acc

    @triton.jit(do_not_specialize=("H", "W", "OH", "OW"))
    def _dw_kernel(
        x_ptr, w_ptr, scale_ptr, shift_ptr, out_ptr, C, H, W, OH, OW, sxn, sxc, sxh, sxw,
        KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
        PH: tl.constexpr, PW: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_SHIFT: tl.constexpr,
        ACT: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, VEC: tl.constexpr,
    ):  # fmt: skip
        pid_p = tl.program_id(0)
        pid_c = tl.program_id(1)
        n = tl.program_id(2)
        npix = OH * OW
        offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        mask_c = offs_c < C
        # A tail channel reads the last one's weights (its outputs are not stored): the weight
        # loads, one per tap, need no mask and no fill value.
        w_base = w_ptr + tl.minimum(offs_c, C - 1) * (KH * KW)
        scale = tl.load(scale_ptr + offs_c, mask=mask_c & HAS_SCALE, other=1.0)
        shift = tl.load(shift_ptr + offs_c, mask=mask_c & HAS_SHIFT, other=0.0)
        if VEC == 2:
            # Pairs of outputs (even, odd) of one row (OW, W and every stride but the pixel
            # one even, stride 1 along W): each tap row is read as aligned input pairs, one
            # 2-element load serving two taps of both outputs; an odd tap's pair straddles
            # two of them (the high half of one, the low half of the next). Half the loads,
            # conversions and address sums of one load per tap and output.
            offs_q = pid_p * (BLOCK_P // 2) + tl.arange(0, BLOCK_P // 2)
            p0 = offs_q * 2
            mask_q = p0 < npix
            oh = p0 // OW
            ow = p0 - oh * OW
            ih0 = oh * SH - PH
            half = tl.arange(0, 2)
            row0 = n * sxn + offs_c[:, None] * sxc + (oh * SH * sxh + ow)[None, :]
            S0: tl.constexpr = -(PW + PW % 2)
            NPAIR: tl.constexpr = (KW - PW - S0) // 2 + 1
            acc = tl.zeros((BLOCK_C, BLOCK_P // 2, 2), dtype=tl.float32)
            for kh in tl.static_range(KH):
                ih = ih0 + kh
                row_ok = mask_c[:, None] & (mask_q & (ih >= 0) & (ih < H))[None, :]
                row = row0 + (kh - PH) * sxh
                prev = acc
                for t in tl.static_range(NPAIR):
                    s = S0 + 2 * t
                    iw = ow + s
                    ok = row_ok & ((iw >= 0) & (iw < W))[None, :]
                    off = tl.multiple_of((row + s)[:, :, None] + half[None, None, :], [1, 1, 2])
                    cur = tl.load(
                        x_ptr + off,
                        mask=tl.broadcast_to(ok[:, :, None], (BLOCK_C, BLOCK_P // 2, 2)),
                        other=0.0,
                    ).to(tl.float32)
                    if s + PW >= 0 and s + PW < KW:
                        wv = tl.load(w_base + (kh * KW + s + PW))
                        acc += cur * wv.to(tl.float32)[:, None, None]
                    if t > 0 and s - 1 + PW >= 0 and s - 1 + PW < KW:
                        _, prev_hi = tl.split(prev)
                        cur_lo, _ = tl.split(cur)
                        wv = tl.load(w_base + (kh * KW + s - 1 + PW))
                        acc += tl.join(prev_hi, cur_lo) * wv.to(tl.float32)[:, None, None]
                    prev = cur
            acc = _fold_act(acc, scale[:, None, None], shift[:, None, None], HAS_SCALE,
                            HAS_SHIFT, ACT)  # fmt: skip
            out_off = tl.multiple_of(
                ((n * C + offs_c[:, None]) * npix + p0[None, :])[:, :, None] + half[None, None, :],
                [1, 1, 2],
            )
            store_ok = mask_c[:, None] & mask_q[None, :]
            tl.store(
                out_ptr + out_off,
                acc.to(out_ptr.dtype.element_ty),
                mask=tl.broadcast_to(store_ok[:, :, None], (BLOCK_C, BLOCK_P // 2, 2)),
            )
        else:
            offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
            mask_p = offs_p < npix
            oh = offs_p // OW
            ow = offs_p - oh * OW
            ih0 = oh * SH - PH
            iw0 = ow * SW - PW
            # One offset per output, then a uniform one per tap: a tap costs an add, not the
            # products of its row and column with their strides.
            base = n * sxn + offs_c[:, None] * sxc + (ih0 * sxh + iw0 * sxw)[None, :]
            acc2 = tl.zeros((BLOCK_C, BLOCK_P), dtype=tl.float32)
            for kh in tl.static_range(KH):
                ih = ih0 + kh
                row_ok = mask_c[:, None] & (mask_p & (ih >= 0) & (ih < H))[None, :]
                for kw in tl.static_range(KW):
                    iw = iw0 + kw
                    ok = row_ok & ((iw >= 0) & (iw < W))[None, :]
                    xv = tl.load(x_ptr + (base + (kh * sxh + kw * sxw)), mask=ok, other=0.0)
                    wv = tl.load(w_base + (kh * KW + kw))
                    acc2 += xv.to(tl.float32) * wv.to(tl.float32)[:, None]
            acc2 = _fold_act(acc2, scale[:, None], shift[:, None], HAS_SCALE, HAS_SHIFT, ACT)
            out = out_ptr + (n * C + offs_c[:, None]) * npix + offs_p[None, :]
            tl.store(out, acc2.to(out_ptr.dtype.element_ty), mask=mask_c[:, None] & mask_p[None, :])

    INTERPRETING = ks.interpreted(_dw_kernel)
else:
    _dw_kernel = None
    INTERPRETING = False


# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------


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


_plans: ks.BoundedCache[tuple[Any, ...], tuple[Any, ...]] = ks.BoundedCache(256)
_broken: ks.BoundedCache[tuple[Any, ...], bool] = ks.BoundedCache(256)
# id(layer) -> its last call's plan and what it was planned for (see _replay). The plan holds
# the layer's weight, so an id is not reused while its entry stands.
_replays: dict[int, tuple[Any, ...]] = {}


def clear_config_cache() -> None:
    """Forget the tuned file, env config, arch queries and launch plans (tune, tests)."""
    CONFIG.clear()
    _plans.clear()
    _broken.clear()
    _replays.clear()


# --------------------------------------------------------------------------------------------
# Launch
# --------------------------------------------------------------------------------------------


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pair(v: Any) -> tuple[int, int] | None:
    if type(v) is int:
        return v, v
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(type(i) is int for i in v):
        return int(v[0]), int(v[1])
    return None


def _pairs_fit(x: torch.Tensor, stride: tuple[int, int], ow: int) -> bool:
    """Whether the kernel may read the input as aligned pairs of a row (``VEC`` 2): stride 1
    along rows, unit column stride, every other stride, the widths and the address even, so
    that an even output column reads an even input one and a pair is never half in bounds."""
    n, _, _, w = x.shape
    sn, sc, sh, sw = x.stride()
    return (
        stride[1] == 1
        and sw == 1
        and w % 2 == 0
        and ow % 2 == 0
        and sh % 2 == 0
        and sc % 2 == 0
        and (sn % 2 == 0 or n == 1)
        and x.data_ptr() % (2 * x.element_size()) == 0
    )


def prepare_launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    stride: tuple[int, int],
    padding: tuple[int, int],
    config: dict[str, Any],
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    act: int = 0,
    out: torch.Tensor | None = None,
) -> tuple[Any, tuple[int, int, int], tuple[Any, ...], dict[str, Any], torch.Tensor]:
    """Kernel, grid, positional arguments, launch keywords and output of one call; ``weight``
    is ``[C, 1, KH, KW]``. Nothing is checked here: the entry point did."""
    n, c, h, w = x.shape
    kh, kw = int(weight.shape[2]), int(weight.shape[3])
    oh = (h + 2 * padding[0] - kh) // stride[0] + 1
    ow = (w + 2 * padding[1] - kw) // stride[1] + 1
    if out is None:
        out = torch.empty((n, c, oh, ow), dtype=x.dtype, device=x.device)
    wk = weight.reshape(c, kh * kw)
    if not wk.is_contiguous():
        wk = wk.contiguous()
    block_p, block_c = int(config["BLOCK_P"]), int(config["BLOCK_C"])
    vec = 2 if int(config.get("VEC", 2)) == 2 and _pairs_fit(x, stride, ow) else 1
    if vec == 2:
        # Fewer pairs than lanes replicate the tile across lanes: 4x slower on an H100 (a
        # 128-pixel tile on 4 warps). A wave is 64 lanes on CDNA, 32 on RDNA and NVIDIA.
        lanes = 64 if kc.is_hip() else 32
        block_p = max(block_p, 2 * lanes * int(config["num_warps"]))
    grid = (_cdiv(oh * ow, block_p), _cdiv(c, block_c), n)
    sn, sc, sh, sw = x.stride()
    args = (x, wk, wk if scale is None else scale, wk if shift is None else shift, out,
            c, h, w, oh, ow, sn, sc, sh, sw)  # fmt: skip
    kwargs = {
        "KH": kh,
        "KW": kw,
        "SH": stride[0],
        "SW": stride[1],
        "PH": padding[0],
        "PW": padding[1],
        "HAS_SCALE": scale is not None,
        "HAS_SHIFT": shift is not None,
        "ACT": act,
        "BLOCK_P": block_p,
        "BLOCK_C": block_c,
        "VEC": vec,
        **kc.launch_options(config),
    }
    return _dw_kernel, grid, args, kwargs, out


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
    if _dw_kernel is None:
        raise RuntimeError("triton is not importable")
    st, pad = _pair(stride), _pair(padding)
    assert st is not None and pad is not None
    kh, kw = int(weight.shape[2]), int(weight.shape[3])
    cfg = resolve_config(x.device, kh, kw, st[0], x.dtype, layout_class(x))
    if config:
        cfg.update(CONFIG.validate(config))
    kernel, grid, args, kwargs, out = prepare_launch(x, weight, st, pad, cfg, scale, shift, act)
    kc.Launcher(kernel, grid, kwargs, kc.device_index(x)).launch_once(*args)
    return out


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


def _layout(x: torch.Tensor) -> tuple[Any, ...]:
    # What Triton specialises on for the input but its address (kc.layout_key, inlined).
    return (x.shape, x.stride(), x.dtype, x.get_device(), x.data_ptr() & 15)


def _settings(layer: Any, bn: Any) -> tuple[Any, ...]:
    return (layer.stride, layer.padding, layer.dilation, layer.groups, layer.padding_mode,
            None if bn is None else bn.eps)  # fmt: skip


def _replay(x: torch.Tensor, layer: Any, bn: Any, act: Any) -> torch.Tensor | None:
    """The launch planned for this layer at its last call, where nothing it depends on has
    changed since; else None. A model calls each layer once a forward with the same shapes:
    this is the path of every call but a layer's first, checked inline at the fewest checks
    that stay correct (a hook, training mode, a replaced or updated tensor, a new layout or
    setting send the call to the full path, which plans it anew)."""
    plan = _replays.get(id(layer))
    if plan is None:
        return None
    bn0, act0, settings, layout, tensors, stamps, launch, out_shape, bn_done, act_done = plan
    if (
        bn is not bn0
        or act is not act0
        or _layout(x) != layout
        or _settings(layer, bn) != settings
        or layer._forward_hooks
        or layer._forward_pre_hooks
        or ks.global_hooks()
    ):
        return None
    params = layer._parameters
    if params["weight"] is not tensors[0] or params.get("bias") is not tensors[1]:
        return None
    if bn is not None:
        if bn.training or bn._forward_hooks or bn._forward_pre_hooks:
            return None
        buffers, affine = bn._buffers, bn._parameters
        if (
            buffers.get("running_mean") is not tensors[2]
            or buffers.get("running_var") is not tensors[3]
            or affine.get("weight") is not tensors[4]
            or affine.get("bias") is not tensors[5]
        ):
            return None
    if act is not None and ks.hooked(act):
        return None
    # In-place updates (load_state_dict, a fused-BN rewrite) bump a version or move the data.
    for t, ptr, version in stamps:
        if t._version != version or t.data_ptr() != ptr:
            return None
    launcher, wk, scale, shift, tail = launch
    out = x.new_empty(out_shape)
    launcher(x, wk, scale, shift, out, *tail)
    if not bn_done and bn is not None:
        out = bn(out)
    if not act_done and act is not None:
        out = act(out)
    return out


def _eager(x: torch.Tensor, layer: Any, bn: Any, act: Any) -> torch.Tensor | None:
    weight = layer._parameters.get("weight") if isinstance(layer, torch.nn.Module) else None
    if weight is None:
        return None
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return None
    out = _replay(x, layer, bn, act)
    if out is not None:
        return out
    # Everything a launch depends on but the tensors: their layout, the modules and their
    # settings. A layer that failed once at a key runs its modules from then on.
    key = (kc.layout_key(x), id(layer), layer.stride, layer.padding, layer.dilation,
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
    launcher = kc.Launcher(kernel, grid, kwargs, kc.device_index(x))
    try:
        launcher(*args)
    except Exception:
        _broken.put(key, True)
        raise
    stamps = ks.layer_stamps(layer, bn)
    if stamps is not None:
        _plans.put(key, (launcher, args))
        if len(_replays) >= _plans.size:
            _replays.clear()
        _replays[id(layer)] = (
            bn,
            act,
            _settings(layer, bn),
            _layout(x),
            stamps[0::3],
            tuple((t, ptr, v) for t, ptr, v in zip(stamps[0::3], stamps[1::3], stamps[2::3])
                  if t is not None),
            (launcher, args[1], args[2], args[3], args[5:]),
            tuple(out.shape),
            bn_done,
            act_done,
        )  # fmt: skip
    if not bn_done and bn is not None:
        out = bn(out)
    if not act_done and act is not None:
        out = act(out)
    return out


def _traced(x: torch.Tensor, layer: Any, bn: Any, act: Any) -> torch.Tensor | None:
    """Under torch.compile: one opaque op for conv + fold + activation, or None."""
    if torch.is_grad_enabled() and (x.requires_grad or layer.weight.requires_grad):
        return None  # the op has no backward
    geometry = _conv_geometry(x, layer)
    if geometry is None or (bn is not None and not ks.foldable_bn(bn)):
        return None
    code = ks.act_code(act)
    scale, shift = ks.fold_traced(bn, layer.bias)
    fused_act = code if code is not None else 0
    y: torch.Tensor = _OP(x, layer.weight, scale, shift, list(geometry[0]), list(geometry[1]),
                          fused_act)  # fmt: skip
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
    if triton is None:
        if x.is_cuda:
            kc.warn_once("no-triton", "rocmfix: triton is not importable; depthwise convs run "
                         "the stock modules")  # fmt: skip
        return ks.stock(x, conv, bn, act)
    if not (x.is_cuda or INTERPRETING):
        return ks.stock(x, conv, bn, act)
    if kc.is_compiling():
        y = _traced(x, conv, bn, act)
        return ks.stock(x, conv, bn, act) if y is None else y
    try:
        out = _eager(x, conv, bn, act)
    except Exception as exc:  # noqa: BLE001 - a dropped kernel must never take the model down
        kc.warn_once(
            "depthwise:" + type(exc).__name__,
            f"rocmfix: the depthwise conv kernel failed ({type(exc).__name__}: {exc}); "
            "running the stock modules",
        )
        out = None
    return ks.stock(x, conv, bn, act) if out is None else out


# --------------------------------------------------------------------------------------------
# torch.compile: one custom op
# --------------------------------------------------------------------------------------------


def _reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    act: int,
) -> torch.Tensor:
    y = F.conv2d(x, weight, None, stride, padding, 1, x.shape[1]).float()
    if scale is not None:
        y = y * scale.view(1, -1, 1, 1)
    if shift is not None:
        y = y + shift.view(1, -1, 1, 1)
    return ks.apply_act(y, act).to(x.dtype)


def _impl(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    act: int,
) -> torch.Tensor:
    if _dw_kernel is not None and (x.is_cuda or INTERPRETING):
        try:
            return conv(x, weight, tuple(stride), tuple(padding),  # type: ignore[arg-type]
                        scale=scale, shift=shift, act=act)  # fmt: skip
        except Exception as exc:  # noqa: BLE001
            kc.warn_once(
                "depthwise-op:" + type(exc).__name__,
                f"rocmfix: the depthwise conv kernel failed ({type(exc).__name__}: {exc}); "
                "running F.conv2d",
            )
    return _reference(x, weight, scale, shift, stride, padding, act)


def _impl_fake(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    act: int,
) -> torch.Tensor:
    n, c, h, w = x.shape
    oh = (h + 2 * padding[0] - weight.shape[2]) // stride[0] + 1
    ow = (w + 2 * padding[1] - weight.shape[3]) // stride[1] + 1
    return x.new_empty((n, c, oh, ow))


_OP = kc.register_op(
    OP_NAME,
    "(Tensor x, Tensor weight, Tensor? scale, Tensor? shift, int[] stride, int[] padding, "
    "int act) -> Tensor",
    _impl,
    _impl,
    _impl_fake,
)
