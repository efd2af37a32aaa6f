"""A ``Conv`` whose forward skips its BatchNorm (a hand edit; written for rocmfix's tests)."""
import torch.nn as nn


class Conv(nn.Module):
    def __init__(self, c1, c2):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, 1, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(self.conv(x))
