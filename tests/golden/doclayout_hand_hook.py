"""DocLayout's block after the forum's Triton hook (written for rocmfix's tests)."""
import torch.nn.functional as F
from torch import nn
from .g2l_crm_triton import dilated_conv_triton

class DilatedBlock(nn.Module):
    def dilated_conv(self, x, dilation):
        weight = self.dcv.conv.weight
        padding = dilation * (self.k // 2)
        return self.dcv.act(self.dcv.bn(dilated_conv_triton(x, weight, None, dilation, padding, 1)))
