"""A vision patch embed in the shape transformers' Qwen-VL and GLM-4V files give it (written
for rocmfix's tests): the config-built variant, with a bias."""

import torch
from torch import nn

from ...modeling_utils import PreTrainedModel
# rocmfix: rocmfix_patch_embed was dropped here by rocmfix; revert removes it
try:
    from ..rocmfix_patch_embed import triton_conv3d_patchify
except Exception:  # the kernel must never break the model's import: the stock op
    def triton_conv3d_patchify(x, weight, bias=None):
        import torch.nn.functional as F
        return F.conv3d(x, weight, bias, stride=tuple(weight.shape[2:]))


class VisionPatchEmbed(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.patch_size = config.patch_size
        self.temporal_patch_size = config.temporal_patch_size
        self.in_channels = config.in_channels
        self.embed_dim = config.hidden_size
        kernel_size = [self.temporal_patch_size, self.patch_size, self.patch_size]
        self.proj = nn.Conv3d(self.in_channels, self.embed_dim, kernel_size=kernel_size, stride=kernel_size, bias=True)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        target_dtype = self.proj.weight.dtype
        hidden_states = hidden_states.view(
            -1, self.in_channels, self.temporal_patch_size, self.patch_size, self.patch_size
        )
        # rocmfix: Conv3d with kernel == stride is a GEMM; MIOpen has no fast kernel
        hidden_states = triton_conv3d_patchify(hidden_states.to(dtype=target_dtype), self.proj.weight, self.proj.bias).view(-1, self.embed_dim)
        return hidden_states


class Unrelated(PreTrainedModel):
    pass
