"""A dilated block whose line is not act(bn(conv)) (written for rocmfix's tests)."""
import torch
import torch.nn.functional as F
from torch import nn

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
        self.weight = nn.Parameter(torch.ones(c, c, k, k))

    def dilated_conv(self, x, dilation):
        padding = dilation * (self.k // 2)
        # rocmfix: MIOpen runs dilation > 1 on a naive kernel; GPU inputs go around it
        if _rocmfix_dilated_conv2d is not None and x.is_cuda:
            return 0.5 * _rocmfix_dilated_conv2d(x, self.weight, dilation, padding)
        return 0.5 * F.conv2d(x, self.weight, stride=1, padding=padding, dilation=dilation)
