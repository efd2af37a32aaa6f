"""A depthwise-separable backbone in PP-LCNetV4's shape (written for rocmfix's tests)."""
import torch
from torch import nn

# rocmfix: rocmfix_depthwise_conv was dropped here by rocmfix; revert removes it
try:
    from ..rocmfix_depthwise_conv import depthwise_conv2d as _rocmfix_depthwise_conv2d
except Exception:
    _rocmfix_depthwise_conv2d = None


class PPLCNetV4ConvLayer(nn.Module):
    def __init__(self, cin, cout, k, stride=1, groups=1):
        super().__init__()
        self.convolution = nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False)
        self.normalization = nn.BatchNorm2d(cout)
        self.activation = nn.Identity()

    def forward(self, hidden_states):
        # rocmfix: MIOpen runs depthwise convs on a grouped GEMM; GPU inputs go around it
        if _rocmfix_depthwise_conv2d is not None and hidden_states.is_cuda and getattr(self.convolution, "groups", 1) > 1:
            hidden_states = _rocmfix_depthwise_conv2d(hidden_states, self.convolution, bn=self.normalization, act=self.activation)
        else:
            hidden_states = self.convolution(hidden_states)
            hidden_states = self.normalization(hidden_states)
            hidden_states = self.activation(hidden_states)
        return hidden_states


class PPLCNetV4DepthwiseSeparableConvLayer(nn.Module):
    def __init__(self, c, k, stride):
        super().__init__()
        if stride == 1:
            self.token_conv = nn.Conv2d(c, c, k, 1, k // 2, groups=c, bias=True)
        else:
            self.token_conv = PPLCNetV4ConvLayer(c, c, k, stride, groups=c)
        self.channel_conv = PPLCNetV4ConvLayer(c, c, 1)

    def forward(self, hidden_states):
        # rocmfix: MIOpen runs depthwise convs on a grouped GEMM; GPU inputs go around it
        if _rocmfix_depthwise_conv2d is not None and hidden_states.is_cuda and getattr(self.token_conv, "groups", 1) > 1:
            hidden_states = _rocmfix_depthwise_conv2d(hidden_states, self.token_conv)
        else:
            hidden_states = self.token_conv(hidden_states)
        residual = hidden_states
        hidden_states = self.channel_conv(hidden_states)
        return torch.relu(residual + hidden_states)
