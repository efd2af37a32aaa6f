"""A patch embed whose proj is already a linear layer (written for rocmfix's tests)."""

import torch.nn as nn


class Qwen2VisionPatchEmbed(nn.Module):
    def __init__(self, in_features: int = 1176, embed_dim: int = 1152) -> None:
        super().__init__()
        self.proj = nn.Linear(in_features, embed_dim, bias=False)

    def forward(self, x):
        return self.proj(x)
