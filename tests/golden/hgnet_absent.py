"""A modeling file without HGNetV2's layer (written for rocmfix's tests)."""
from torch import nn


class OtherLayer(nn.Module):
    def forward(self, x):
        return self.convolution(x)
