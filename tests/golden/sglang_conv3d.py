"""A patch embed in sglang's up-to-0.5.9 shape (written for rocmfix's tests)."""
import torch
from torch import nn


class Qwen2VisionPatchEmbed(nn.Module):
    def __init__(self, p=14, t=2, c=3, dim=64):
        super().__init__()
        self.patch_size, self.temporal_patch_size, self.embed_dim = p, t, dim
        ks = [t, p, p]
        self.proj = nn.Conv3d(c, dim, kernel_size=ks, stride=ks, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        x = x.view(n, -1, self.temporal_patch_size, self.patch_size, self.patch_size)
        return self.proj(x).view(n, self.embed_dim)
