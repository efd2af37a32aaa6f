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


class PPDocLayoutV2Model(nn.Module):
    """Host values written into device tensors, the shapes the rewrite keeps on the device,
    and the ones it leaves (a slice, one boolean mask, a list that is no config's)."""

    def __init__(self, config):
        super().__init__()
        self.config = config

    def forward(self, sources, mask):
        spatial_shapes = torch.empty((len(sources), 2), dtype=torch.long, device=mask.device)
        for level, source in enumerate(sources):
            height, width = source.shape[-2:]
            spatial_shapes[level, 0] = height
            spatial_shapes[level, 1] = width
        ids = torch.zeros(mask.shape, dtype=torch.long, device=mask.device)
        ids[:, 0] = self.config.start_token_id
        ids[mask] = self.config.pred_token_id
        ids[torch.arange(len(ids), device=mask.device), mask.sum(1)] = self.config.end_token_id
        order = torch.tensor(self.config.class_order, dtype=torch.int32, device=mask.device)
        steps = torch.tensor([1, 2], device=mask.device)
        return spatial_shapes, ids, order[ids] + steps.sum()


class Elsewhere(nn.Module):
    """The same shapes in a class the rewrite does not name: left as they are."""

    def forward(self, x):
        x[0, 0] = 1
        return x + torch.tensor(self.config.offsets, device=x.device)
