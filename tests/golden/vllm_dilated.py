"""A Conv3d with kernel == stride but dilation: not a plain GEMM (written for rocmfix's tests)."""

import torch.nn as nn


class Qwen2VisionPatchEmbed(nn.Module):
    def __init__(self, k=(2, 14, 14)) -> None:
        super().__init__()
        self.proj = nn.Conv3d(3, 64, kernel_size=k, stride=k, dilation=(1, 2, 2), bias=False)

    def forward(self, x):
        return self.proj(x)
