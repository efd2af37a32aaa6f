"""The Conv3dLayer shape of vllm >= 0.11.1 (written for rocmfix's tests)."""

import torch
import torch.nn as nn

from vllm.model_executor.layers.conv import Conv3dLayer

from .helpers import unused
# rocmfix: qwen2_vl_vision_kernels was dropped here by rocmfix; revert removes it
try:
    from .qwen2_vl_vision_kernels import triton_conv3d_patchify
except Exception:  # the kernel must never break the model's import: the stock op
    def triton_conv3d_patchify(x, weight, bias=None):
        import torch.nn.functional as F
        return F.conv3d(x, weight, bias, stride=tuple(weight.shape[2:]))


class Qwen2VisionPatchEmbed(nn.Module):
    def __init__(self, patch_size: int = 14, temporal_patch_size: int = 2,
                 in_channels: int = 3, embed_dim: int = 1152) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.temporal_patch_size = temporal_patch_size
        self.embed_dim = embed_dim
        kernel_size = (temporal_patch_size, patch_size, patch_size)
        self.proj = Conv3dLayer(in_channels, embed_dim, kernel_size=kernel_size,
                                stride=kernel_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        L, C = x.shape
        x = x.view(L, -1, self.temporal_patch_size, self.patch_size, self.patch_size)
        # rocmfix: Conv3d with kernel == stride is a GEMM; MIOpen has no fast kernel
        x = triton_conv3d_patchify(x, self.proj.weight, self.proj.bias).view(L, self.embed_dim)
        return x
