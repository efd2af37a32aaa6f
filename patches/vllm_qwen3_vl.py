"""vllm's Qwen3-VL vision tower: the patch-embed Conv3d, with a bias this time."""

from ._vllm_patch_embed import patch_embed_patch

PATCH = patch_embed_patch(
    id="vllm-qwen3-vl",
    file="qwen3_vl.py",
    class_name="Qwen3_VisionPatchEmbed",
    family="Qwen3-VL",
    missing_reason="vllm {version} has no Qwen3-VL (it arrived in 0.11.0)",
    known=(
        "before 0.11.0: no qwen3_vl.py (not needed)",
        "0.11.0: nn.Conv3d with bias (needed on ROCm)",
        "0.11.1 and later: Conv3dLayer with bias (a matmul when compiled)",
    ),
)
