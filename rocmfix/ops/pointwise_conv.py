"""1x1 convs (stride 1, no padding), dense or grouped: the bulk of the small models' convs.
A 1x1 conv is exactly a GEMM over the pixels (per group for a grouped one), which the
vendor's BLAS runs well; MIOpen runs 1x1 convs 2-4x slower than that GEMM in fp16 NHWC and
can fall to its naive kernel in fp32 (KataGo#1237), and PyTorch's path without a conv library
runs DocLayout-YOLO's grouped 1x1s at 0.5-1.9% of roofline (an H100 with cuDNN off). Whether
a given MIOpen is slow at these shapes depends on the arch and the release, so ``doctor``
measures before ``apply``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .base import DTYPES, Case, Op, Scheme, TensorShape


def shape(cin: int, cout: int, h: int, w: int, *, g: int = 1, n: int = 1,
          dtype: str = "float32", layout: str = "nchw") -> dict[str, Any]:  # fmt: skip
    return {"n": n, "cin": cin, "cout": cout, "g": g, "h": h, "w": w, "dtype": dtype,
            "layout": layout, "bias": False}  # fmt: skip


def label(s: TensorShape) -> str:
    groups = f" g{s['g']}" if s["g"] != 1 else ""
    batch = f" b{s['n']}" if s["n"] != 1 else ""
    cl = " NHWC" if s["layout"] == "channels-last" else ""
    dtype = DTYPES.get(s["dtype"], s["dtype"])
    return f"{s['cin']}→{s['cout']}ch{groups} {s['h']}x{s['w']}{batch} {dtype}{cl}"


def _case(gpu: dict[str, Any]) -> Case:
    s = gpu
    groups = f"-g{s['g']}" if s["g"] != 1 else ""
    batch = f"-b{s['n']}" if s["n"] != 1 else ""
    cl = "-nhwc" if s["layout"] == "channels-last" else ""
    name = f"pointwise-conv-{s['cin']}to{s['cout']}{groups}-{s['h']}x{s['w']}{batch}"
    # The CPU's shape: the same groups, dtype and layout, a sixteenth of the channels per
    # group (at least one) and a tenth of the size.
    g = int(s["g"])
    cig, cog = max(1, s["cin"] // g // 16), max(1, s["cout"] // g // 16)
    small = {"cin": cig * g, "cout": cog * g, "h": max(2, s["h"] // 10), "w": max(2, s["w"] // 10)}
    return Case(f"{name}-{DTYPES[s['dtype']]}{cl}", gpu, dict(gpu, **small))


# MinerU 4.0's layout model (PP-DocLayoutV2 at 800x800, fp32, read by hooking every conv of a
# CPU forward of transformers 5.24's model, random weights): 66 1x1 convs, the most common
# first. DocLayout-YOLO's (yolov10m-doclayout at 1280x928, fp32, MinerU 2.x's layout, read
# the same way): the DilatedBlocks' grouped 1x1s (3 channels into 1 per group, 4 each) and
# its most common dense ones. Their depthwise gates (one channel a group) are no GEMM and the
# entry leaves them to the stock line (templates/pointwise_conv_gemm.py: pointwise). OCR rec
# and the formula encoder run fp16 (their shapes not read here): two of these GEMMs in half,
# channels-last.
CASES = (
    _case(shape(192, 192, 50, 50)),
    _case(shape(256, 256, 50, 50)),
    _case(shape(256, 256, 100, 100)),
    _case(shape(384, 384, 25, 25)),
    _case(shape(512, 1024, 50, 50)),
    _case(shape(2176, 512, 50, 50)),
    _case(shape(288, 96, 160, 116, g=96)),
    _case(shape(576, 192, 80, 58, g=192)),
    _case(shape(576, 192, 160, 116)),
    _case(shape(384, 192, 80, 58)),
    _case(shape(576, 288, 40, 29)),
    _case(shape(192, 192, 50, 50, dtype="float16", layout="channels-last")),
    _case(shape(288, 96, 160, 116, g=96, dtype="float16", layout="channels-last")),
)


def matches(conv: Mapping[str, Any], x: Sequence[int], w: Sequence[int]) -> bool:
    """Whether a recorded conv call (its arguments as the profiler reads them, the input's
    and the weight's shapes) is this op's: 2-D, not transposed, a 1x1 kernel, stride 1, no
    padding."""
    stride, padding = list(conv["stride"]), conv["padding"]
    return (
        len(x) == 4
        and len(w) == 4
        and not conv["transposed"]
        and list(w[2:]) == [1, 1]
        and stride in ([1], [1, 1])
        and (padding in ("valid", "same") or list(padding) in ([0], [0, 0]))
        and not any(conv.get("pad_far") or ())
    )


OP = Op(
    name="pointwise-conv",
    title="1x1 conv",
    native="F.conv2d, 1x1",
    schemes=(
        Scheme(
            "gemm",
            "one vendor GEMM (rocBLAS/hipBLASLt) per 1x1 conv, batched over groups, no Triton",
            "GEMM",
            "pointwise_conv_gemm.py",
            ("rocmfix_kernel_support.py",),
        ),
    ),
    cases=CASES,
    harness="pointwise_conv",
    label=label,
    function="pointwise_conv2d",
    fallback="gemm",
    measured_verdict=True,
    order=50,
    matches=matches,
    replay="conv2d",
)
