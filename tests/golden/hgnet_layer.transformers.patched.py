"""A conv-norm-act layer in HGNetV2's shape (written for rocmfix's tests)."""
from torch import Tensor, nn

# rocmfix: rocmfix_depthwise_conv was dropped here by rocmfix; revert removes it
try:
    from ..rocmfix_depthwise_conv import depthwise_conv2d as _rocmfix_depthwise_conv2d
except Exception:
    _rocmfix_depthwise_conv2d = None


class HGNetV2ConvLayer(nn.Module):
    def __init__(self, cin, cout, k, stride=1, groups=1):
        super().__init__()
        self.convolution = nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False)
        self.normalization = nn.BatchNorm2d(cout)
        self.activation = nn.ReLU()
        self.lab = nn.Identity()

    def forward(self, input: Tensor) -> Tensor:
        # conv, then norm, then act, then the affine block
        # rocmfix: MIOpen runs depthwise convs on a grouped GEMM; GPU inputs go around it
        if _rocmfix_depthwise_conv2d is not None and input.is_cuda and getattr(self.convolution, "groups", 1) > 1:
            hidden_state = _rocmfix_depthwise_conv2d(input, self.convolution, bn=self.normalization, act=self.activation)
        else:
            hidden_state = self.convolution(input)
            hidden_state = self.normalization(hidden_state)
            hidden_state = self.activation(hidden_state)
        hidden_state = self.lab(hidden_state)
        return hidden_state
