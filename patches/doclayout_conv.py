"""DocLayout-YOLO's ``Conv`` layer: its 1x1 convs as vendor GEMMs.

``Conv.forward`` (``doclayout_yolo/nn/modules/conv.py``, one byte-identical file in 0.0.2b1,
0.0.3 and 0.0.4) is ``return self.act(self.bn(self.conv(x)))``: every conv of the model but
the weight-shared dilated ones (doclayout_dilated_conv.py) and the head's last. A 1280x928 page
runs 105 1x1 convs, all but the head's 12 bare ``nn.Conv2d`` in this layer: the DilatedBlocks'
grouped ones (3 channels into 1 a group, g = 96 and 192), their depthwise gates, and the
C2f/SPPF/PSA projections (read by hooking a CPU forward of the shipped yaml). The rewrite sends GPU
inputs of a 1x1 conv (``self.conv.kernel_size == (1, 1)``; the 3x3s keep the stock line
without even the entry's checks) to the dropped ``pointwise_conv2d`` with the layer's
BatchNorm and activation; the entry runs the stock modules for anything it does not take.
Inference never fuses the BatchNorm (the predictor builds ``AutoBackend(fuse=False)``); a
fused model's ``forward_fuse`` is not routed.
"""

from __future__ import annotations

from rocmfix.ops import op
from rocmfix.patch import MinerUUse

from ._conv_sites import Router, Site, patch

PATH = "doclayout_yolo/nn/modules/conv.py"
KERNELS = "doclayout_yolo/nn/modules/rocmfix_pointwise_conv.py"
ROUTER = Router(
    PATH,
    KERNELS,
    op("pointwise-conv"),
    (Site("Conv", "conv", "bn", "act"),),
    "MIOpen runs 1x1 convs slower than a GEMM; GPU inputs go around it",
    "1x1 convs (grouped in DilatedBlock); MIOpen runs them slower than a GEMM",
    gate='getattr({conv}, "kernel_size", None) == (1, 1)',
)

PATCH = patch(
    ROUTER,
    id="doclayout-pointwise-conv",
    summary="Run DocLayout-YOLO's 1x1 convs as vendor GEMMs",
    distribution="doclayout-yolo",
    package="doclayout_yolo",
    missing_reason="doclayout-yolo {version} has no nn/modules/conv.py",
    known=(f"{ROUTER.sites[0].label}, 1x1 where kernel_size == (1, 1)",),
    # MinerU 2.x's pipeline backend; MinerU 3.0 replaced it with PP-DocLayoutV2.
    mineru=MinerUUse("its pipeline backend's layout model", imports=("doclayout_yolo",)),
    focus="Conv",
)
