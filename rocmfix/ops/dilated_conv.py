"""DocLayout-YOLO's weight-shared dilated convs (``DilatedBlock.dilated_conv``): MIOpen has no
fast solver for dilation > 1 and falls back to a naive kernel (layout at 1.6 it/s instead of
15+ on a 7900 XTX).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .base import DTYPES, TRITON_SUPPORT, Case, GridGroup, Op, Scheme, TensorShape, tile
from .pointwise_conv import matches as pointwise


def _tile(bm: int, bn: int, bk: int, warps: int, stages: int, **extra: Any) -> dict[str, Any]:
    flags = {"taps_inner": True, "nhwc": True, "tma": False, **extra}
    return tile(bm, bn, bk, warps, stages, **flags)


def _case(c: int, k: int, h: int, w: int, d: int, small: tuple[int, int, int]) -> Case:
    sc, sh, sw = small
    return Case(
        f"dilated-conv-c{c}-k{k}-d{d}",
        {"n": 1, "c": c, "k": k, "h": h, "w": w, "d": d, "dtype": "float32"},
        {"n": 1, "c": sc, "k": k, "h": sh, "w": sw, "d": d, "dtype": "float32"},
    )


# yolov10m-doclayout's G2L_CRM blocks at imgsz 1280 on an A4 page (1280x928): P3 (96 channels,
# 5x5, d = 1, 2, 3) and P4 (192 channels, 3x3, d = 1, 3, 5), fp32 as MinerU runs them.
P3 = {"n": 1, "c": 96, "k": 5, "h": 160, "w": 116, "dilations": [1, 2, 3], "dtype": "float32"}
P4 = {"n": 1, "c": 192, "k": 3, "h": 80, "w": 58, "dilations": [1, 3, 5], "dtype": "float32"}

GRID = (
    GridGroup(("cpu",), (_tile(128, 16, 16, 4, 1), _tile(64, 32, 16, 4, 1, taps_inner=False))),
    GridGroup(
        ("hip",),
        (
            _tile(64, 64, 32, 4, 1),
            _tile(64, 64, 32, 4, 2),
            _tile(128, 64, 32, 4, 1),
            _tile(128, 64, 32, 8, 2),
            _tile(64, 128, 32, 4, 1),
            _tile(128, 128, 32, 8, 1),
            _tile(64, 64, 16, 4, 1),
            _tile(64, 64, 32, 4, 1, nhwc=False),
        ),
    ),
    GridGroup(
        ("hip", "option:waves_per_eu"),
        (_tile(64, 64, 32, 4, 1, waves_per_eu=2), _tile(128, 64, 32, 4, 1, waves_per_eu=2)),
    ),
    # Strict fp32 is an FMA dot: small K steps, N-contiguous weights, strided loads.
    GridGroup(
        ("cuda", "precision:fp32"),
        (
            _tile(64, 32, 16, 4, 2, nhwc=False, w_kmajor=False),
            _tile(64, 64, 32, 4, 2, nhwc=False, w_kmajor=False),
            _tile(64, 32, 16, 4, 2, w_kmajor=False),
            _tile(64, 64, 32, 4, 2, w_kmajor=False),
            _tile(64, 128, 16, 4, 2, w_kmajor=False),
            _tile(128, 64, 16, 8, 2, w_kmajor=False),
        ),
    ),
    GridGroup(
        ("cuda", "!precision:fp32"),
        (
            _tile(64, 128, 32, 4, 3),
            _tile(128, 64, 32, 4, 3),
            _tile(128, 64, 32, 8, 3),
            _tile(256, 64, 32, 8, 3),
            _tile(128, 128, 32, 8, 3),
            _tile(128, 128, 16, 8, 4),
            _tile(128, 128, 64, 8, 3),
        ),
    ),
    GridGroup(
        ("cuda", "!precision:fp32", "sm>=90"),
        (_tile(128, 128, 32, 4, 4, tma=True), _tile(64, 128, 32, 4, 4, tma=True)),
    ),
)


def label(s: TensorShape) -> str:
    dilation = f"d={s['d']}" if "d" in s else "d=" + ",".join(map(str, s["dilations"]))
    size = f"{s['h']}x{s['w']}"
    return f"{s['c']}ch {s['k']}x{s['k']} {dilation} {size} {DTYPES.get(s['dtype'], s['dtype'])}"


def matches(conv: Mapping[str, Any], x: Sequence[int], w: Sequence[int]) -> bool:
    """A recorded conv call of this op: 2-D, not transposed, dilation > 1 (a 1x1 conv is the
    pointwise op's, whatever its dilation)."""
    dilated = len(x) == 4 and not conv["transposed"] and max(conv["dilation"]) > 1
    return dilated and not pointwise(conv, x, w)


OP = Op(
    name="dilated-conv",
    title="dilated conv",
    native="act(bn(F.conv2d))",
    schemes=(
        Scheme(
            "gemm",
            "Triton implicit-GEMM dilated conv",
            "Triton",
            "dilated_conv_triton.py",
            ("dilated_conv_kernels.py", "dilated_conv_config.py", *TRITON_SUPPORT),
            needs_triton=True,
        ),
        Scheme(
            "linear",
            "phase split: d*d dense convs batched into one vendor call, no Triton",
            "phase split",
            "dilated_conv_phase.py",
        ),
    ),
    cases=(
        *(_case(96, 5, 160, 116, d, (8, 20, 14)) for d in (1, 2, 3)),
        *(_case(192, 3, 80, 58, d, (16, 12, 10)) for d in (1, 3, 5)),
    ),
    kernel="dilated_conv",
    kernel_template="dilated_conv_triton.py",
    tune=(
        Case(
            "dilated_conv:c96_k5",
            P3,
            {"n": 1, "c": 8, "k": 5, "h": 12, "w": 10, "dilations": [3], "dtype": "float32"},
        ),
        Case(
            "dilated_conv:c192_k3",
            P4,
            {"n": 1, "c": 16, "k": 3, "h": 12, "w": 10, "dilations": [5], "dtype": "float32"},
        ),
    ),
    grid=GRID,
    config_env="ROCMFIX_DILATED_CONV_CONFIG",
    fallback="linear",
    order=20,
    harness="dilated_conv",
    label=label,
    function="dilated_conv2d",
    matches=matches,
    replay="conv2d",
)
