"""A detector in the shape of PP-DocLayoutV2's (written for rocmfix's tests): a conv encoder
whose backbone is ``self.model``, and a wrapper model whose ``self.model`` is the whole
detector (which the rewrite must leave alone)."""
import torch
from torch import nn


class PPDocLayoutV2ConvEncoder(nn.Module):
    def __init__(self, backbone):
        super().__init__()
        self.model = backbone

    def forward(self, pixel_values, pixel_mask):
        # the backbone's feature maps, one per stage
        features = self.model(pixel_values).feature_maps
        return [(f, pixel_mask) for f in features]


class TinyDetector(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        outputs = self.model(pixel_values)
        return outputs
