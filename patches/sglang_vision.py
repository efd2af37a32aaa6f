"""sglang's Qwen-VL vision towers (AMD publishes sglang images for ROCm; MinerU 2.x shipped an
sglang backend): the patch-embed Conv3d as a GEMM.

Up to 0.5.9 the class builds ``nn.Conv3d(kernel_size=k, stride=k)``: MIOpen on ROCm. From
0.5.10 it builds ``Conv3dLayer`` (``sglang/srt/layers/conv.py``), which runs unfold +
``F.linear`` whenever kernel == stride, on CUDA and HIP alike: read from conv.py, never from
sglang's version label. sglang's Qwen2.5-VL imports transformers' patch embed, which the
transformers patches cover.
"""

from __future__ import annotations

import libcst as cst

from rocmfix.patch import Classification, CodeShape, MinerUUse, Patch, TargetContext
from rocmfix.rewrite import call_name, find_class, find_method, nodes

from ._patch_embed import OTHER_MODELS, patch_embed_patch

MODELS = "sglang/srt/models"
KERNELS = f"{MODELS}/rocmfix_patch_embed.py"
CONV_PY = "sglang/srt/layers/conv.py"
CONV3D_LAYER = "0.5.10 and later: Conv3dLayer, unfold + F.linear on every platform (not needed)"


def conv3d_layer(ctx: TargetContext, family: str) -> Classification:
    """A Conv3dLayer proj: not needed where conv.py's ``forward_cuda`` (what HIP runs too)
    reaches ``self._forward_mulmat``."""
    source = ctx.related.get(CONV_PY)
    if source is None:
        return Classification(CodeShape.UNKNOWN, f"Conv3dLayer without {CONV_PY} to read")
    try:
        module = cst.parse_module(source)
    except (cst.ParserSyntaxError, UnicodeDecodeError, LookupError):
        return Classification(CodeShape.UNKNOWN, f"{CONV_PY} does not parse")
    cls = find_class(module, "Conv3dLayer")
    forward = find_method(cls, "forward_cuda") if cls is not None else None
    if forward is None or not any(
        call_name(c) == "self._forward_mulmat" for c in nodes(forward, cst.Call)
    ):
        return Classification(
            CodeShape.UNKNOWN, "Conv3dLayer.forward_cuda does not run _forward_mulmat"
        )
    return Classification(
        CodeShape.FIXED_UPSTREAM,
        f"{family}: Conv3dLayer runs unfold + F.linear (a GEMM) when kernel == stride, "
        "HIP included",
    )


MINERU = MinerUUse("MinerU 2.x's sglang backend loads MinerU2.5, a Qwen2-VL", imports=("sglang",))


def _sglang(id: str, file: str, class_name: str, family: str, *known: str) -> Patch:
    return patch_embed_patch(
        id=id,
        distribution="sglang",
        package="sglang",
        path=f"{MODELS}/{file}",
        kernel_module=KERNELS,
        class_name=class_name,
        family=family,
        missing_reason=f"sglang {{version}} has no {file}",
        known=known,
        layer=conv3d_layer,
        related=(CONV_PY,),
        mineru=MINERU if file == "qwen2_vl.py" else OTHER_MODELS,
    )


PATCHES = (
    _sglang(
        "sglang-qwen2-vl",
        "qwen2_vl.py",
        "Qwen2VisionPatchEmbed",
        "Qwen2-VL (MinerU2.5)",
        "up to 0.5.9: nn.Conv3d (needed on ROCm)",
        CONV3D_LAYER,
    ),
    _sglang(
        "sglang-qwen3-vl",
        "qwen3_vl.py",
        "Qwen3VLVisionPatchEmbed",
        "Qwen3-VL",
        "up to 0.5.9: nn.Conv3d with bias (needed on ROCm)",
        CONV3D_LAYER,
    ),
)
