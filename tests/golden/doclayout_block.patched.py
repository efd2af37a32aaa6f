"""A weight-shared dilated block in DocLayout-YOLO's shape (written for rocmfix's tests)."""
import torch
import torch.nn.functional as F
from torch import nn
from .conv import Conv

# rocmfix: g2l_crm_triton was dropped here by rocmfix; revert removes it
try:
    from .g2l_crm_triton import dilated_conv2d as _rocmfix_dilated_conv2d
except Exception:
    _rocmfix_dilated_conv2d = None

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
        # rocmfix: MIOpen runs dilation > 1 on a naive kernel; GPU inputs go around it
        if _rocmfix_dilated_conv2d is not None and x.is_cuda:
            return _rocmfix_dilated_conv2d(x, weight, dilation, padding, bn=bn, act=act)
        return act(bn(F.conv2d(x, weight, stride=1, padding=padding, dilation=dilation)))

    def forward(self, x):
        return sum(self.dilated_conv(x, d) for d in self.dilation)
