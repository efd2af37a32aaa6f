"""A patch embed in lmdeploy's PyTorch-engine shape (written for rocmfix's tests)."""
import torch
from torch import nn
# rocmfix: rocmfix_patch_embed was dropped here by rocmfix; revert removes it
try:
    from .rocmfix_patch_embed import triton_conv3d_patchify
except Exception:  # the kernel must never break the model's import: the stock op
    def triton_conv3d_patchify(x, weight, bias=None):
        import torch.nn.functional as F
        return F.conv3d(x, weight, bias, stride=tuple(weight.shape[2:]))


class PatchEmbed(nn.Module):
    def __init__(self, p=14, t=2, c=3, dim=64, dtype=None, device=None):
        super().__init__()
        self.patch_size, self.temporal_patch_size = p, t
        self.in_channels, self.embed_dim = c, dim
        self.proj = nn.Conv3d(
            c, dim, kernel_size=[t, p, p], stride=[t, p, p], bias=False, dtype=dtype, device=device
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        dtype = self.proj.weight.dtype
        hidden_states = hidden_states.view(
            -1, self.in_channels, self.temporal_patch_size, self.patch_size, self.patch_size
        )
        # rocmfix: Conv3d with kernel == stride is a GEMM; MIOpen has no fast kernel
        return triton_conv3d_patchify(hidden_states.to(dtype=dtype), self.proj.weight, self.proj.bias).view(-1, self.embed_dim)
