"""A text-detection head with 2x2 stride-2 transposed convs (written for rocmfix's tests)."""
import torch
from torch import nn

# rocmfix: rocmfix_conv_transpose was dropped here by rocmfix; revert removes it
try:
    from ..rocmfix_conv_transpose import conv_transpose2d as _rocmfix_conv_transpose2d
except Exception:
    _rocmfix_conv_transpose2d = None


class Head(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv2 = nn.ConvTranspose2d(c, c, 2, 2)
        self.conv_bn2 = nn.BatchNorm2d(c)
        self.conv3 = nn.ConvTranspose2d(c, 1, 2, 2)

    def forward(self, x, return_f=False):
        # rocmfix: MIOpen's transposed conv is slow; kernel == stride is a GEMM and a pixel shuffle
        if _rocmfix_conv_transpose2d is not None and x.is_cuda:
            x = _rocmfix_conv_transpose2d(x, self.conv2)
        else:
            x = self.conv2(x)
        x = self.conv_bn2(x)
        f = x
        # rocmfix: MIOpen's transposed conv is slow; kernel == stride is a GEMM and a pixel shuffle
        if _rocmfix_conv_transpose2d is not None and x.is_cuda:
            x = _rocmfix_conv_transpose2d(x, self.conv3)
        else:
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
            # rocmfix: MIOpen's transposed conv is slow; kernel == stride is a GEMM and a pixel shuffle
            if _rocmfix_conv_transpose2d is not None and x.is_cuda:
                maps = _rocmfix_conv_transpose2d(x, self.conv_final)
            else:
                maps = self.conv_final(x)
            return {"maps": torch.sigmoid(maps)}
        return {"maps": self.binarize(x)}
