"""lmdeploy's PyTorch-engine Qwen-VL vision towers (MinerU 4 runs lmdeploy on Windows): the
patch-embed Conv3d as a GEMM.

``lmdeploy/pytorch/models/qwen2_vl.py`` and its siblings build the patch embed with
``nn.Conv3d(kernel_size=k, stride=k)`` and run it on the patches viewed as ``[L, C, T, P, P]``:
MIOpen's slow path on ROCm. Decided by that code shape, release by release.
"""

from __future__ import annotations

from rocmfix.patch import MinerUUse, Patch

from ._patch_embed import OTHER_MODELS, patch_embed_patch

MODELS = "lmdeploy/pytorch/models"
KERNELS = f"{MODELS}/rocmfix_patch_embed.py"

# (patch id suffix, modeling file, patch-embed class, family); MinerU's model is the first.
ROWS = (
    ("qwen2-vl", "qwen2_vl.py", "PatchEmbed", "Qwen2-VL (MinerU2.5)"),
    ("qwen2.5-vl", "qwen2_5_vl.py", "Qwen2_5_PatchEmbed", "Qwen2.5-VL"),
    ("qwen3-vl", "qwen3_vl.py", "Qwen3VLVisionPatchEmbed", "Qwen3-VL"),
)

MINERU = MinerUUse("MinerU 4's lmdeploy backend loads MinerU2.5, a Qwen2-VL", imports=("lmdeploy",))


def _patch(suffix: str, file: str, class_name: str, family: str) -> Patch:
    return patch_embed_patch(
        id=f"lmdeploy-{suffix}",
        distribution="lmdeploy",
        package="lmdeploy",
        path=f"{MODELS}/{file}",
        kernel_module=KERNELS,
        class_name=class_name,
        family=family,
        missing_reason=f"lmdeploy {{version}} has no {file}",
        known=(f"{class_name}: nn.Conv3d(kernel_size=k, stride=k) (needed on ROCm)",),
        mineru=MINERU if file == "qwen2_vl.py" else OTHER_MODELS,
    )


PATCHES = tuple(_patch(*row) for row in ROWS)
