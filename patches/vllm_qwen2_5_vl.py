"""vllm's Qwen2.5-VL vision tower: the same patch-embed Conv3d as Qwen2-VL."""

from ._vllm_patch_embed import patch_embed_patch

PATCH = patch_embed_patch(
    id="vllm-qwen2.5-vl",
    file="qwen2_5_vl.py",
    class_name="Qwen2_5_VisionPatchEmbed",
    family="Qwen2.5-VL",
    missing_reason="vllm {version} has no qwen2_5_vl.py",
    known=(
        "0.8.0-0.11.0: nn.Conv3d (needed on ROCm)",
        "0.11.1 and later: Conv3dLayer (a matmul when compiled)",
    ),
)
