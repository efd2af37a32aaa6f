"""A patch embed in lmdeploy's PyTorch-engine shape (written for rocmfix's tests)."""
import torch
from torch import nn


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
        return self.proj(hidden_states.to(dtype=dtype)).view(-1, self.embed_dim)
