"""A sequence neck in LightSVTR's shape: a 1x1 skip, a 1x1 reduce and a 1xk depthwise local
mixer, each conv -> BatchNorm -> SiLU (written for rocmfix's tests)."""
import torch
from torch import nn

# rocmfix: rocmfix_depthwise_conv was dropped here by rocmfix; revert removes it
try:
    from ..rocmfix_depthwise_conv import depthwise_conv2d as _rocmfix_depthwise_conv2d
except Exception:
    _rocmfix_depthwise_conv2d = None


class LightSVTRConvLayer(nn.Module):
    def __init__(self, cin, cout, kernel=(1, 1), groups=1):
        super().__init__()
        pad = (kernel[0] // 2, kernel[1] // 2)
        self.convolution = nn.Conv2d(cin, cout, kernel, 1, pad, groups=groups, bias=False)
        self.normalization = nn.BatchNorm2d(cout)
        self.activation = nn.SiLU()

    def forward(self, hidden_states):
        # The local mixer is the depthwise one; the 1x1 instances share this forward.
        # rocmfix: MIOpen runs depthwise convs on a grouped GEMM; GPU inputs go around it
        if _rocmfix_depthwise_conv2d is not None and hidden_states.is_cuda and getattr(self.convolution, "groups", 1) > 1:
            hidden_states = _rocmfix_depthwise_conv2d(hidden_states, self.convolution, bn=self.normalization, act=self.activation)
        else:
            hidden_states = self.convolution(hidden_states)
            hidden_states = self.normalization(hidden_states)
            hidden_states = self.activation(hidden_states)
        return hidden_states


class TinyNeck(nn.Module):
    def __init__(self, cin, dims, k=7):
        super().__init__()
        self.skip = LightSVTRConvLayer(cin, dims)
        self.reduce = LightSVTRConvLayer(cin, dims)
        self.local = LightSVTRConvLayer(dims, dims, (1, k), groups=dims)

    def forward(self, x):
        hidden = self.reduce(x)
        hidden = hidden + self.local(hidden)
        return torch.flatten(hidden + self.skip(x), 2)
