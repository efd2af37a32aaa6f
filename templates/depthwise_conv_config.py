"""The tile configs of rocmfix's depthwise conv kernel, and which one a call runs (rocmfix
template; the kernel is ``depthwise_conv_kernels``, the entry ``depthwise_conv_triton``).

rocmfix drops this file, under this name, beside those modules; ``rocmfix revert`` removes it
with them. The configs are data (:data:`SHIPPED_CONFIGS`, keyed by GPU arch);
``rocmfix_kernel_config`` merges them with the tuned file and
``$ROCMFIX_DEPTHWISE_CONV_CONFIG``.
"""

from __future__ import annotations

from typing import Any

import torch

from . import rocmfix_kernel_config as kc

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
