"""A model in the shape of MinerU's PaddleOCR BaseModel (written for rocmfix's tests): a
backbone (PP-FormulaNet's encoder), an optional neck, a head (its autoregressive decoder)."""
from torch import nn

# rocmfix: rocmfix_graphs was dropped here by rocmfix; revert removes it
try:
    from .rocmfix_graphs import forward as _rocmfix_graph_forward
except (ImportError, OSError):
    _rocmfix_graph_forward = None


class BaseModel(nn.Module):
    def __init__(self, backbone, head):
        super().__init__()
        self.backbone, self.head = backbone, head
        self.use_backbone, self.use_head = True, True

    def forward(self, x):
        y = dict()
        if self.use_backbone:
            # rocmfix: CUDA/HIP graph replay per input shape (rocmfix_graphs)
            if _rocmfix_graph_forward is not None:
                x = _rocmfix_graph_forward(self.backbone, x)
            else:
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
