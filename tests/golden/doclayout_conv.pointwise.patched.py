"""A conv-norm-act layer in DocLayout-YOLO's ``Conv`` shape (written for rocmfix's tests)."""
import torch.nn as nn

# rocmfix: rocmfix_pointwise_conv was dropped here by rocmfix; revert removes it
try:
    from .rocmfix_pointwise_conv import pointwise_conv2d as _rocmfix_pointwise_conv2d
except Exception:
    _rocmfix_pointwise_conv2d = None


class Conv(nn.Module):
    default_act = nn.SiLU()

    def __init__(self, c1, c2, k=1, s=1, g=1):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2, groups=g, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = self.default_act

    def forward(self, x):
        """conv, norm, act in one line."""
        # rocmfix: MIOpen runs 1x1 convs slower than a GEMM; GPU inputs go around it
        if _rocmfix_pointwise_conv2d is not None and x.is_cuda and getattr(self.conv, "kernel_size", None) == (1, 1):
            return _rocmfix_pointwise_conv2d(x, self.conv, bn=self.bn, act=self.act)
        else:
            return self.act(self.bn(self.conv(x)))

    def forward_fuse(self, x):
        return self.act(self.conv(x))


class Conv2(Conv):
    def forward(self, x):
        return self.act(self.bn(self.conv(x) + x))
