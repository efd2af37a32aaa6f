"""A weight-shared dilated block in DocLayout-YOLO's shape (written for rocmfix's tests)."""
import torch
import torch.nn.functional as F
from torch import nn
from .conv import Conv

class DilatedBlock(nn.Module):
    def __init__(self, c, dilation, k):
        super().__init__()
        self.dilation = dilation
        self.k = k
        self.dcv = Conv(c, c, k=self.k, s=1)

    def dilated_conv(self, x, dilation):
        act = self.dcv.act
        bn = self.dcv.bn
        weight = self.dcv.conv.weight
        padding = dilation * (self.k // 2)
        return act(bn(F.conv2d(x, weight, stride=1, padding=padding, dilation=dilation)))

    def forward(self, x):
        return sum(self.dilated_conv(x, d) for d in self.dilation)
