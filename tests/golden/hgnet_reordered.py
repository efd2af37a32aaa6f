"""HGNetV2's layer with its norm before its conv (written for rocmfix's tests)."""
from torch import nn


class HGNetV2ConvLayer(nn.Module):
    def forward(self, input):
        hidden_state = self.normalization(input)
        hidden_state = self.convolution(hidden_state)
        hidden_state = self.activation(hidden_state)
        return hidden_state
