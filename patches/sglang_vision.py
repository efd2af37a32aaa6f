"""sglang's Qwen-VL vision towers (AMD publishes sglang images for ROCm; MinerU 2.x shipped an
sglang backend): the patch-embed Conv3d as a GEMM.

Up to 0.5.9 the class builds ``nn.Conv3d(kernel_size=k, stride=k)``: MIOpen on ROCm. From
0.5.10 it builds ``Conv3dLayer`` (``sglang/srt/layers/conv.py``), which runs unfold +
``F.linear`` whenever kernel == stride, on CUDA and HIP alike: read from conv.py, never from
sglang's version label. sglang's Qwen2.5-VL imports transformers' patch embed, which the
transformers patches cover.
"""

from __future__ import annotations

from rocmfix.patch import Classification, CodeShape, MinerUUse, TargetContext
from rocmfix.rewrite import UNREADABLE

from ._conv3d_layer import forward_cuda, runs_mulmat
from ._patch_embed import in_folder, patch_embed_patches

MODELS = "sglang/srt/models"
KERNELS = f"{MODELS}/rocmfix_patch_embed.py"
CONV_PY = "sglang/srt/layers/conv.py"
PLAIN = "up to 0.5.9: nn.Conv3d (needed on ROCm)"
BIAS = "up to 0.5.9: nn.Conv3d with bias (needed on ROCm)"
LAYER = "0.5.10 and later: Conv3dLayer, unfold + F.linear on every platform (not needed)"


def conv3d_layer(ctx: TargetContext, family: str) -> Classification:
    """A Conv3dLayer proj: not needed where conv.py's ``forward_cuda`` (what HIP runs too)
    reaches ``self._forward_mulmat``."""
    source = ctx.related.get(CONV_PY)
    if source is None:
        return Classification(CodeShape.UNKNOWN, f"Conv3dLayer without {CONV_PY} to read")
    try:
        _, forward = forward_cuda(source)
    except UNREADABLE:
        return Classification(CodeShape.UNKNOWN, f"{CONV_PY} does not parse")
    if forward is None or not runs_mulmat(forward):
        return Classification(
            CodeShape.UNKNOWN, "Conv3dLayer.forward_cuda does not run _forward_mulmat"
        )
    return Classification(
        CodeShape.FIXED_UPSTREAM,
        f"{family}: Conv3dLayer runs unfold + F.linear (a GEMM) when kernel == stride, "
        "HIP included",
    )


MINERU = MinerUUse("MinerU 2.x's sglang backend loads MinerU2.5, a Qwen2-VL", imports=("sglang",))

ROWS = (
    ("qwen2-vl", "qwen2_vl.py", "Qwen2VisionPatchEmbed", "Qwen2-VL (MinerU2.5)", (PLAIN, LAYER)),
    ("qwen3-vl", "qwen3_vl.py", "Qwen3VLVisionPatchEmbed", "Qwen3-VL", (BIAS, LAYER)),
)

PATCHES = patch_embed_patches(
    "sglang", KERNELS, MINERU, in_folder("sglang", MODELS, ROWS), conv3d_layer, (CONV_PY,)
)
