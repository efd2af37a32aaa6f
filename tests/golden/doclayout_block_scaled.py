"""A dilated block whose line is not act(bn(conv)) (written for rocmfix's tests)."""
import torch
import torch.nn.functional as F
from torch import nn


class DilatedBlock(nn.Module):
    def __init__(self, c, dilation, k):
        super().__init__()
        self.dilation = dilation
        self.k = k
        self.weight = nn.Parameter(torch.ones(c, c, k, k))

    def dilated_conv(self, x, dilation):
        padding = dilation * (self.k // 2)
        return 0.5 * F.conv2d(x, self.weight, stride=1, padding=padding, dilation=dilation)
