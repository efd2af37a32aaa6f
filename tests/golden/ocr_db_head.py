"""A text-detection head with 2x2 stride-2 transposed convs (written for rocmfix's tests)."""
import torch
from torch import nn


class Head(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv2 = nn.ConvTranspose2d(c, c, 2, 2)
        self.conv_bn2 = nn.BatchNorm2d(c)
        self.conv3 = nn.ConvTranspose2d(c, 1, 2, 2)

    def forward(self, x, return_f=False):
        x = self.conv2(x)
        x = self.conv_bn2(x)
        f = x
        x = self.conv3(x)
        x = torch.sigmoid(x)
        return (x, f) if return_f else x


class DBHead(nn.Module):
    def __init__(self, c, mode=None):
        super().__init__()
        self.mode = mode
        self.conv_final = nn.ConvTranspose2d(c, 1, 2, 2)
        self.binarize = Head(c)

    def forward(self, x):
        if self.mode == "v6":
            maps = self.conv_final(x)
            return {"maps": torch.sigmoid(maps)}
        return {"maps": self.binarize(x)}
