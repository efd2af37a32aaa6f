"""Depthwise convs (groups == in == out channels) of today's MinerU models: PP-DocLayoutV2's
HGNetV2 backbone, PP-OCRv6's PPLCNetV4 and PP-FormulaNet's HGNetV2 encoder. MIOpen runs them
through a grouped implicit-GEMM solver at a tenth of the memory bandwidth
(rocm-libraries#12039) and has no fp32 depthwise path at all; whether a given MIOpen is slow at
these shapes depends on the arch and the release, so ``doctor`` measures before ``apply``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .base import DTYPES, TRITON_SUPPORT, Case, GridGroup, Op, Scheme, TensorShape
from .pointwise_conv import matches as pointwise


def shape(
    c: int, k: int | tuple[int, int], h: int, w: int, *, s: int = 1, n: int = 1,
    dtype: str = "float32", act: str = "relu",
) -> dict[str, Any]:  # fmt: skip
    kh, kw = (k, k) if isinstance(k, int) else k
    return {"n": n, "c": c, "kh": kh, "kw": kw, "s": s, "h": h, "w": w, "dtype": dtype, "act": act}


def _id(s: TensorShape) -> str:
    k = f"k{s['kh']}" if s["kh"] == s["kw"] else f"k{s['kh']}x{s['kw']}"
    stride = f"-s{s['s']}" if s["s"] != 1 else ""
    batch = f"-b{s['n']}" if s["n"] != 1 else ""
    return f"depthwise-conv-c{s['c']}-{k}{stride}-{s['h']}x{s['w']}{batch}-{DTYPES[s['dtype']]}"


def _case(gpu: dict[str, Any]) -> Case:
    # The interpreter's shape: the same kernel, stride, dtype and activation, a thirty-second
    # of the channels and a tenth of the size (distinct per case, so each row names its own).
    small = {"c": max(2, gpu["c"] // 32), "h": max(3, gpu["h"] // 10), "w": max(3, gpu["w"] // 10)}
    return Case(_id(gpu), gpu, dict(gpu, n=min(int(gpu["n"]), 2), **small))


# Every depthwise shape MinerU 4.0's models run, read by hooking each conv in CPU forwards of
# the real models (PP-DocLayoutV2 at 800x800, PP-OCRv6 det tiny at 960x672, rec small at
# 6x48x320, the PP-FormulaNet_plus-M encoder at 8x384x384): fp32 layout and OCR detection,
# fp16 recognition and formulas. A conv with a bias and no norm costs the kernel what a
# folded BatchNorm does, so each is measured with one. Rec's two stride-(2, 1) 3x3s are left
# out: the op takes one stride for both axes, and the entry runs them on the stock path.
LAYOUT_K5_192 = shape(192, 5, 50, 50)
LAYOUT_K5_384 = shape(384, 5, 25, 25)
LAYOUT_S2_200 = shape(128, 3, 200, 200, s=2, act="none")
DET_K3_32 = shape(32, 3, 240, 168, act="none")
DET_K5_64 = shape(64, 5, 240, 168, act="none")
REC_K3_12 = shape(96, 3, 12, 80, n=6, dtype="float16", act="none")
REC_K1X7 = shape(120, (1, 7), 1, 40, n=6, dtype="float16", act="silu")
FORMULA_K5_384 = shape(384, 5, 24, 24, n=8, dtype="float16")

CASES = (
    _case(LAYOUT_K5_192),
    _case(LAYOUT_K5_384),
    _case(LAYOUT_S2_200),
    _case(shape(512, 3, 100, 100, s=2, act="none")),
    _case(shape(1024, 3, 50, 50, s=2, act="none")),
    _case(DET_K3_32),
    _case(shape(48, 3, 120, 84, act="none")),
    _case(shape(64, 3, 60, 42, act="none")),
    _case(shape(160, 3, 30, 21, act="none")),
    _case(shape(32, 3, 240, 168, s=2, act="none")),
    _case(shape(48, 3, 120, 84, s=2, act="none")),
    _case(shape(64, 3, 60, 42, s=2, act="none")),
    _case(DET_K5_64),
    _case(shape(64, 5, 120, 84, act="none")),
    _case(shape(64, 5, 60, 42, act="none")),
    _case(shape(64, 5, 30, 21, act="none")),
    _case(REC_K3_12),
    _case(shape(192, 3, 6, 80, n=6, dtype="float16", act="none")),
    _case(shape(384, 3, 3, 80, n=6, dtype="float16", act="none")),
    _case(REC_K1X7),
    _case(FORMULA_K5_384),
    _case(shape(768, 5, 12, 12, n=8, dtype="float16")),
    _case(shape(192, 3, 96, 96, s=2, n=8, dtype="float16", act="none")),
    _case(shape(512, 3, 48, 48, s=2, n=8, dtype="float16", act="none")),
    _case(shape(1024, 3, 24, 24, s=2, n=8, dtype="float16", act="none")),
)


def _target(gpu: dict[str, Any]) -> Case:
    k = f"k{gpu['kh']}" if gpu["kh"] == gpu["kw"] else f"k{gpu['kh']}x{gpu['kw']}"
    prec = "fp32" if gpu["dtype"] == "float32" else "f16"
    cpu = dict(gpu, n=1, c=4, h=10, w=9)
    return Case(f"depthwise_conv:{k}_s{gpu['s']}_{prec}", gpu, cpu)


# One target per tuned-file key ("<shape class>_<precision class>"): the shape of that class
# MinerU runs most often.
TUNE = tuple(
    _target(s)
    for s in (LAYOUT_K5_192, LAYOUT_S2_200, DET_K3_32, REC_K3_12, REC_K1X7, FORMULA_K5_384)
)


def _tile(p: int, c: int, warps: int, rows: int = 1) -> dict[str, Any]:
    return {"BLOCK_P": p, "BLOCK_C": c, "num_warps": warps, "num_stages": 1, "ROWS": rows}


# Tiles both vendors' GPUs try; pair tiles (stride 1, even widths) take at least two pixels a
# lane whatever BLOCK_P says, and ROWS 2 computes two output rows a position, each input row
# loaded once for both (templates/depthwise_conv_kernels.py).
_TILES = (
    _tile(128, 1, 4),
    _tile(256, 1, 4),
    _tile(512, 1, 4),
    _tile(256, 1, 8),
    _tile(512, 1, 8),
    _tile(1024, 1, 8),
    _tile(128, 2, 4),
    _tile(128, 1, 4, 2),
    _tile(256, 1, 4, 2),
    _tile(512, 1, 4, 2),
)
GRID = (
    GridGroup(("cpu",), (_tile(64, 1, 4), _tile(32, 2, 4), _tile(32, 2, 4, 2))),
    GridGroup(("hip",), (*_TILES, _tile(64, 4, 4), _tile(512, 1, 8, 2))),
    GridGroup(("hip", "option:waves_per_eu"), ({"waves_per_eu": 2}, {"waves_per_eu": 4})),
    # The H100 sweep's winners (docs/performance-depthwise.md): the fp16 5x5s and 3x3s on 2
    # warps, the stride-2 fp16 3x3s on two rows of 2 channels.
    GridGroup(
        ("cuda",),
        (*_TILES, _tile(128, 2, 2), _tile(256, 1, 2), _tile(128, 2, 2, 2), _tile(256, 1, 2, 2)),
    ),
)


def label(s: TensorShape) -> str:
    k = f"{s['kh']}x{s['kw']}"
    stride = f" s{s['s']}" if s["s"] != 1 else ""
    batch = f" b{s['n']}" if s["n"] != 1 else ""
    return f"{s['c']}ch {k}{stride} {s['h']}x{s['w']}{batch} {DTYPES.get(s['dtype'], s['dtype'])}"


def matches(conv: Mapping[str, Any], x: Sequence[int], w: Sequence[int]) -> bool:
    """A recorded conv call of this op: 2-D, not transposed, groups == in == out channels,
    no dilation (a 1x1 conv is the pointwise op's)."""
    groups = int(conv["groups"])
    return (
        len(x) == 4
        and not conv["transposed"]
        and groups > 1
        and groups == x[1] == w[0]
        and w[1] == 1
        and max(conv["dilation"]) == 1
        and not pointwise(conv, x, w)
    )


OP = Op(
    name="depthwise-conv",
    title="depthwise conv",
    native="F.conv2d, groups=C",
    schemes=(
        Scheme(
            "triton",
            "Triton direct depthwise conv, BatchNorm and activation in its store",
            "Triton",
            "depthwise_conv_triton.py",
            ("depthwise_conv_kernels.py", *TRITON_SUPPORT),
            needs_triton=True,
        ),
        Scheme(
            "channels-last",
            "the vendor's depthwise conv on a channels-last copy, no Triton",
            "channels-last",
            "depthwise_conv_vendor.py",
            ("rocmfix_kernel_support.py",),
        ),
    ),
    cases=CASES,
    kernel="depthwise_conv",
    kernel_template="depthwise_conv_triton.py",
    tune=TUNE,
    grid=GRID,
    harness="depthwise_conv",
    label=label,
    function="depthwise_conv2d",
    config_env="ROCMFIX_DEPTHWISE_CONV_CONFIG",
    fallback="channels-last",
    measured_verdict=True,
    order=30,
    matches=matches,
    replay="conv2d",
)
