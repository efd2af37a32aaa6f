"""vllm's Qwen2-VL vision tower (MinerU2.5 runs on it): the patch-embed Conv3d as a GEMM."""

from ._vllm_patch_embed import patch_embed_patch

PATCH = patch_embed_patch(
    id="vllm-qwen2-vl",
    file="qwen2_vl.py",
    class_name="Qwen2VisionPatchEmbed",
    family="Qwen2-VL (MinerU2.5)",
    missing_reason="vllm {version} has no qwen2_vl.py",
    known=(
        "0.8.0-0.11.0: nn.Conv3d (needed on ROCm)",
        "0.11.1 and later: Conv3dLayer (a matmul when compiled; eager needs torch 2.9.x, "
        "or >= 2.9 from 0.19)",
    ),
)
