"""Transposed convs whose kernel equals their stride: the DB text detector's head in MinerU's
PP-OCRv6 (two ``ConvTranspose2d``, 2x2, stride 2). Each input pixel alone writes one k x k
block of the output, so the op is exactly a 1x1 GEMM and a pixel shuffle; MIOpen runs it up to
20x slower than cuDNN (MIOpen#3952), and ``doctor`` measures whether this GPU's does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .base import DTYPES, Case, Op, Scheme, TensorShape


def shape(cin: int, cout: int, h: int, w: int, *, k: int = 2, n: int = 1,
          dtype: str = "float32") -> dict[str, Any]:  # fmt: skip
    return {"n": n, "cin": cin, "cout": cout, "k": k, "h": h, "w": w, "dtype": dtype}


def _case(gpu: dict[str, Any], small: tuple[int, int, int, int]) -> Case:
    cin, cout, h, w = small
    s = gpu
    return Case(
        f"conv-transpose-{s['cin']}to{s['cout']}-k{s['k']}-{s['h']}x{s['w']}",
        gpu,
        dict(gpu, cin=cin, cout=cout, h=h, w=w),
    )


def label(s: TensorShape) -> str:
    k = f"{s['k']}x{s['k']}/{s['k']}"
    return f"{s['cin']}→{s['cout']}ch {k} {s['h']}x{s['w']} {DTYPES.get(s['dtype'], s['dtype'])}"


def matches(conv: Mapping[str, Any], x: Sequence[int], w: Sequence[int]) -> bool:
    """A recorded conv call of this op: a 2-D transposed conv, one group, its kernel its
    stride, no padding, no output padding, no dilation."""
    stride = list(conv["stride"]) * 2 if len(conv["stride"]) == 1 else list(conv["stride"])
    return (
        len(x) == 4
        and bool(conv["transposed"])
        and int(conv["groups"]) == 1
        and list(w[2:]) == stride
        and not any(conv["padding"])
        and not any(conv["output_padding"])
        and max(conv["dilation"]) == 1
    )


OP = Op(
    name="conv-transpose",
    title="transposed conv",
    native="F.conv_transpose2d",
    schemes=(
        Scheme(
            "linear",
            "one vendor GEMM (rocBLAS/hipBLASLt) and a pixel shuffle, no Triton",
            "GEMM + shuffle",
            "conv_transpose_linear.py",
            ("rocmfix_kernel_support.py",),
        ),
    ),
    # PP-OCRv6 det tiny's DBHead on a 960x672 crop (read from the model): 16 -> 16 at 1/4,
    # then 16 -> 1 at 1/2.
    cases=(
        _case(shape(16, 16, 240, 168), (4, 4, 12, 9)),
        _case(shape(16, 1, 480, 336), (4, 1, 12, 9)),
    ),
    harness="conv_transpose",
    label=label,
    function="conv_transpose2d",
    fallback="linear",
    measured_verdict=True,
    order=40,
    matches=matches,
    replay="deconv2d",
)
