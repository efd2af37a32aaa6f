"""A conv-norm-act layer in HGNetV2's shape (written for rocmfix's tests)."""
from torch import Tensor, nn


class HGNetV2ConvLayer(nn.Module):
    def __init__(self, cin, cout, k, stride=1, groups=1):
        super().__init__()
        self.convolution = nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False)
        self.normalization = nn.BatchNorm2d(cout)
        self.activation = nn.ReLU()
        self.lab = nn.Identity()

    def forward(self, input: Tensor) -> Tensor:
        # conv, then norm, then act, then the affine block
        hidden_state = self.convolution(input)
        hidden_state = self.normalization(hidden_state)
        hidden_state = self.activation(hidden_state)
        hidden_state = self.lab(hidden_state)
        return hidden_state
