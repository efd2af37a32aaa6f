"""A model in the shape of MinerU's PaddleOCR BaseModel (written for rocmfix's tests): a
backbone (PP-FormulaNet's encoder), an optional neck, a head (its autoregressive decoder)."""
from torch import nn


class BaseModel(nn.Module):
    def __init__(self, backbone, head):
        super().__init__()
        self.backbone, self.head = backbone, head
        self.use_backbone, self.use_head = True, True

    def forward(self, x):
        y = dict()
        if self.use_backbone:
            x = self.backbone(x)
        if isinstance(x, dict):
            y.update(x)
        if self.use_head:
            x = self.head(x)
        return x


class Other(nn.Module):
    def forward(self, x):
        out = self.backbone(x)  # not BaseModel: left alone
        return out
