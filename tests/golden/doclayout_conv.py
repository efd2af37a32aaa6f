"""A conv-norm-act layer in DocLayout-YOLO's ``Conv`` shape (written for rocmfix's tests)."""
import torch.nn as nn


class Conv(nn.Module):
    default_act = nn.SiLU()

    def __init__(self, c1, c2, k=1, s=1, g=1):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2, groups=g, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = self.default_act

    def forward(self, x):
        """conv, norm, act in one line."""
        return self.act(self.bn(self.conv(x)))

    def forward_fuse(self, x):
        return self.act(self.conv(x))


class Conv2(Conv):
    def forward(self, x):
        return self.act(self.bn(self.conv(x) + x))
