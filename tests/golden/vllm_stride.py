"""A Conv3d whose stride is not its kernel: not a plain GEMM (written for rocmfix's tests)."""

import torch.nn as nn


class Qwen2VisionPatchEmbed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Conv3d(3, 64, kernel_size=(2, 14, 14), stride=(1, 7, 7), bias=False)

    def forward(self, x):
        return self.proj(x)
