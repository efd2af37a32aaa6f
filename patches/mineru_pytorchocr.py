"""MinerU's torch ports of PaddleOCR: the depthwise convs of PP-OCRv6 and PP-FormulaNet, and the
DB head's kernel == stride transposed convs.

MinerU 2.7-3.x keeps the package at ``mineru/model/utils/pytorchocr/``, 4.0.x at
``mineru/model/_internal/pytorchocr/``; the five files have the same shapes in both (read
from the wheels up to 4.0.12; ``rec_lcnetv4.py``, RepLKFPN and LightSVTR arrived with
PP-OCRv6 in 3.x, and before it the DB head has only the older ``Head``). One patch per file
and layout; a layout the installed MinerU does not have reads ``not-needed``. MinerU 2.x runs
these files in torch always; 3.0+ only as described below.

- ``backbones/rec_lcnetv4.py``: ``PPLCNetV4ConvLayer`` (conv → BatchNorm → activation;
  depthwise for the stride-2 token convs) and ``PPLCNetV4DepthwiseSeparableConvLayer``'s bare
  ``token_conv`` (a re-parameterised depthwise conv with bias): PP-OCRv6 det tiny (4.0; small
  in 3.x) and rec small.
- ``backbones/rec_pphgnetv2.py``: ``ConvBNAct`` (conv → BatchNorm; its activation and
  learnable affine block are conditional and stay as they are): the PP-FormulaNet_plus-M
  encoder (PPHGNetV2_B6) and PP-OCRv5 server's backbone.
- ``necks/db_fpn.py``: ``RepLKFPNDepthwiseSeparableConvLayer``'s large-kernel depthwise conv:
  PP-OCRv6 det's neck.
- ``necks/rnn.py``: ``LightSVTRConvLayer`` (conv → BatchNorm → SiLU), whose one depthwise
  instance is ``EncoderWithLightSVTR``'s 1x7 local mixer: PP-OCRv6 rec's neck (the dense
  instances keep the stock call: the guard routes groups > 1 only).
- ``heads/det_db_head.py``: the DB head's ``nn.ConvTranspose2d`` with kernel 2, stride 2
  (PP-OCRv6's ``PPOCRV6DBConvBatchnormLayer`` and ``conv_final``; the older ``Head``'s
  ``conv2``/``conv3``), routed to the ``conv-transpose`` op's GEMM and pixel shuffle.

MinerU is AGPL-3.0: rocmfix patches the user's installed files and ships none of their code.
MinerU runs these files in torch only where its small-model torch stack is installed (4.0:
``TORCH_REQUIRED_MODULES`` in ``mineru/model/runtime/device.py``) and a GPU is visible;
otherwise its ONNX models run and these files do not (rocmfix/mineru.py reads which).
"""

from __future__ import annotations

from rocmfix.ops import op
from rocmfix.patch import MinerUUse, Patch

from ._conv_sites import Router, Site, patch

# (patch id prefix, package folder, the MinerU releases that have it)
LAYOUTS = (
    ("mineru-ocr", "mineru/model/_internal/pytorchocr", "4.0.x"),
    ("mineru-utils-ocr", "mineru/model/utils/pytorchocr", "2.7-3.x"),
)
DEPTHWISE = ("depthwise-conv", "rocmfix_depthwise_conv.py")
TRANSPOSE = ("conv-transpose", "rocmfix_conv_transpose.py")
NOUNS = {"depthwise-conv": "depthwise convs", "conv-transpose": "transposed convs"}
WHY_DW = "MIOpen runs depthwise convs on a grouped GEMM; GPU inputs go around it"
WHY_T = "MIOpen's transposed conv is slow; kernel == stride is a GEMM and a pixel shuffle"

# (patch id suffix, file under modeling/, op, sites, what MinerU runs it for, why)
FILES = (
    (
        "lcnetv4",
        "backbones/rec_lcnetv4.py",
        DEPTHWISE,
        (
            Site("PPLCNetV4ConvLayer", "convolution", "normalization", "activation"),
            Site("PPLCNetV4DepthwiseSeparableConvLayer", "token_conv"),
        ),
        "PP-OCRv6 det and rec backbone (PPLCNetV4): OCR, every tier",
        "3x3/5x5 depthwise convs; MIOpen has no fast depthwise path here",
    ),
    (
        "hgnetv2",
        "backbones/rec_pphgnetv2.py",
        DEPTHWISE,
        (Site("ConvBNAct", "conv", "bn"),),
        "PP-FormulaNet_plus-M encoder (PPHGNetV2_B6): formulas",
        "5x5 depthwise convs in ConvBNAct; MIOpen has no fast depthwise path here",
    ),
    (
        "replkfpn",
        "necks/db_fpn.py",
        DEPTHWISE,
        (Site("RepLKFPNDepthwiseSeparableConvLayer", "depthwise_convolution"),),
        "PP-OCRv6 det neck (RepLKFPN): OCR, every tier",
        "large-kernel depthwise convs; MIOpen has no fast depthwise path here",
    ),
    (
        "lightsvtr",
        "necks/rnn.py",
        DEPTHWISE,
        (Site("LightSVTRConvLayer", "convolution", "normalization", "activation"),),
        "PP-OCRv6 rec neck (LightSVTR): OCR, every tier",
        "a 1x7 depthwise conv; MIOpen has no fast depthwise path here",
    ),
    (
        "db-head",
        "heads/det_db_head.py",
        TRANSPOSE,
        (
            Site("PPOCRV6DBConvBatchnormLayer", "convolution"),
            Site("DBHead", "conv_final"),
            Site("Head", "conv2"),
            Site("Head", "conv3"),
        ),
        "PP-OCR det head (DBHead): OCR, every tier",
        "2x2 stride-2 transposed convs; MIOpen's transposed conv is slow",
    ),
)


def _patch(
    prefix: str,
    package: str,
    releases: str,
    suffix: str,
    rel: str,
    kind: tuple[str, str],
    sites: tuple[Site, ...],
    what: str,
    needs: str,
) -> Patch:
    op_name, module = kind
    path = f"{package}/modeling/{rel}"
    why = WHY_T if op_name == "conv-transpose" else WHY_DW
    grouped = op_name != "conv-transpose"
    router = Router(path, f"{package}/modeling/{module}", op(op_name), sites, why, needs, grouped)
    return patch(
        router,
        id=f"{prefix}-{suffix}",
        summary=f"Route {rel.rsplit('/', 1)[1]}'s {NOUNS[op_name]} around MIOpen",
        distribution="mineru",
        package="mineru",
        # One wording for the package's five files, so that status and apply group them.
        missing_reason=f"mineru {{version}} has no {package}/ (MinerU {releases} has it)",
        known=tuple(s.label for s in sites),
        mineru=MinerUUse(what, own=True, small_model=True),
    )


PATCHES = tuple(_patch(*layout, *row) for layout in LAYOUTS for row in FILES)
