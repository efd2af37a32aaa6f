"""lmdeploy's PyTorch-engine Qwen-VL vision towers (MinerU 4 runs lmdeploy on Windows): the
patch-embed Conv3d as a GEMM.

``lmdeploy/pytorch/models/qwen2_vl.py`` and its siblings build the patch embed with
``nn.Conv3d(kernel_size=k, stride=k)`` and run it on the patches viewed as ``[L, C, T, P, P]``:
MIOpen's slow path on ROCm. Decided by that code shape, release by release.
"""

from __future__ import annotations

from rocmfix.patch import MinerUUse

from ._patch_embed import in_folder, patch_embed_patches

MODELS = "lmdeploy/pytorch/models"
KERNELS = f"{MODELS}/rocmfix_patch_embed.py"

# (patch id suffix, modeling file, patch-embed class, family, known); MinerU's model is the first.
ROWS = (
    ("qwen2-vl", "qwen2_vl.py", "PatchEmbed", "Qwen2-VL (MinerU2.5)", ()),
    ("qwen2.5-vl", "qwen2_5_vl.py", "Qwen2_5_PatchEmbed", "Qwen2.5-VL", ()),
    ("qwen3-vl", "qwen3_vl.py", "Qwen3VLVisionPatchEmbed", "Qwen3-VL", ()),
)

MINERU = MinerUUse("MinerU 4's lmdeploy backend loads MinerU2.5, a Qwen2-VL", imports=("lmdeploy",))

PATCHES = patch_embed_patches("lmdeploy", KERNELS, MINERU, in_folder("lmdeploy", MODELS, ROWS))
