"""transformers' Qwen-VL and GLM-4V vision towers (MinerU's ``vlm-transformers`` backend loads
MinerU2.5 as ``Qwen2VLForConditionalGeneration``): the patch-embed Conv3d as a GEMM.

One row per modeling file whose vision patch embed has the shape, from transformers 4.45.0
(Qwen2-VL) to 5.24.0: ``self.proj = nn.Conv3d(..., kernel_size=k, stride=k)`` in ``__init__``
and ``self.proj(x.view(-1, C, T, P, P).to(dtype)).view(-1, embed_dim)`` in ``forward``. The
class names are stable across those releases. The kernel module is dropped once, into
``transformers/models/``, and every patched file imports it from there. transformers 5.x's
opt-in ``fusion_config={"patch_embeddings": True}`` does not load the weight (shared notes,
stack.md), so nothing upstream replaces this yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from rocmfix.patch import MinerUUse

from ._patch_embed import Row, patch_embed_patches

MODELS = "transformers/models"
KERNELS = f"{MODELS}/rocmfix_patch_embed.py"

# (patch id suffix, model folder, patch-embed class, family); MinerU's model is the first.
ROWS = (
    ("qwen2-vl", "qwen2_vl", "PatchEmbed", "Qwen2-VL (MinerU2.5)"),
    ("qwen2.5-vl", "qwen2_5_vl", "Qwen2_5_VisionPatchEmbed", "Qwen2.5-VL"),
    ("qwen2.5-omni", "qwen2_5_omni", "Qwen2_5_VisionPatchEmbed", "Qwen2.5-Omni"),
    ("qwen3-vl", "qwen3_vl", "Qwen3VLVisionPatchEmbed", "Qwen3-VL"),
    ("qwen3-vl-moe", "qwen3_vl_moe", "Qwen3VLMoeVisionPatchEmbed", "Qwen3-VL-MoE"),
    ("qwen3-omni-moe", "qwen3_omni_moe", "Qwen3OmniMoeVisionPatchEmbed", "Qwen3-Omni-MoE"),
    ("qwen3.5", "qwen3_5", "Qwen3_5VisionPatchEmbed", "Qwen3.5"),
    ("qwen3.5-moe", "qwen3_5_moe", "Qwen3_5MoeVisionPatchEmbed", "Qwen3.5-MoE"),
    ("qwen4-exp", "qwen4_exp", "Qwen4ExpVisionPatchEmbed", "Qwen4-Exp"),
    ("glm4v", "glm4v", "Glm4vVisionPatchEmbed", "GLM-4V"),
    ("glm4v-moe", "glm4v_moe", "Glm4vMoeVisionPatchEmbed", "GLM-4V-MoE"),
    ("glm-ocr", "glm_ocr", "GlmOcrVisionPatchEmbed", "GLM-OCR"),
    ("glm5-next", "glm5_next", "Glm5NextVisionPatchEmbed", "GLM-5-Next"),
    ("exaone4.5", "exaone4_5", "Exaone4_5_PatchEmbed", "EXAONE 4.5"),
    ("minimax-m3-vl", "minimax_m3_vl", "MiniMaxM3VLVisionEmbeddings", "MiniMax-M3-VL"),
    ("cohere-compass", "cohere_compass", "CohereCompassVisionPatchEmbed", "Cohere Compass"),
)


# MinerU 2.5-3.x import the class themselves; MinerU 4 loads it through mineru-vl-utils.
MINERU = MinerUUse(
    "its transformers backend loads MinerU2.5 as Qwen2VLForConditionalGeneration",
    imports=("mineru_vl_utils.transformers_loading",),
    names=("Qwen2VLForConditionalGeneration",),
)


def rows(models: Iterable[tuple[str, str, str, str]]) -> Iterator[Row]:
    """The patch row of each (id suffix, model folder, patch-embed class, family)."""
    for suffix, folder, class_name, family in models:
        path = f"{MODELS}/{folder}/modeling_{folder}.py"
        missing = f"transformers {{version}} has no {family} model"
        yield suffix, path, class_name, family, missing, ()


PATCHES = patch_embed_patches("transformers", KERNELS, MINERU, rows(ROWS))
