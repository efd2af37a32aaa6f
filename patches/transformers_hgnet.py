"""transformers' conv-norm-act layers with depthwise convs: HGNetV2 (PP-DocLayoutV2's backbone,
which MinerU 3.0+ runs for layout) and the detectors that share its layer shape.

``HGNetV2ConvLayer.forward`` runs ``self.convolution`` → ``self.normalization`` →
``self.activation`` (then ``self.lab``) on one variable in every release that has the model
(4.52.1, the first on PyPI, to 5.24.0); HGNetV2's light blocks build it with
``groups=out_channels``: PP-DocLayoutV2's 27 depthwise convs per page. The rewrite routes GPU
inputs through the dropped ``depthwise_conv2d`` with the layer's BatchNorm and activation (the
Triton scheme applies both as it stores); ``self.lab`` and everything after stay as they are.
The entry runs the stock modules for anything it does not handle (a dense stem conv, CPU,
training), so every instance of the layer may go through it.

Other modeling files of 5.24.0 with a conv-norm-act layer built with ``groups=`` and the same
forward: D-FINE's ``DFineConvNormLayer`` (its encoder's stride-2 depthwise downsampling; its
backbone is HGNetV2, covered above), DEIMv2's ``Deimv2ConvNormLayer`` (the same) and
PP-DocLayoutV3's ``PPDocLayoutV3ConvLayer``; each is a row below. Not covered: RT-DETR and
RT-DETRv2 (``RTDetrConvNormLayer``/``RTDetrV2ConvNormLayer`` take no ``groups``, ResNet
backbone: no depthwise conv), PP-DocLayoutV2's own ``PPDocLayoutV2ConvNormLayer`` (no
``groups``; its depthwise convs are all in HGNetV2), and transformers' PP-OCR ports
(``pp_lcnet_v4``, ``pp_ocrv6_*``): MinerU runs its own copies of those (mineru_pytorchocr.py),
and nothing else known to rocmfix loads them.
"""

from __future__ import annotations

from rocmfix.ops import op
from rocmfix.patch import MinerUUse, Patch

from ._conv_sites import Router, Site, patch

MODELS = "transformers/models"
KERNELS = f"{MODELS}/rocmfix_depthwise_conv.py"
WHY = "MIOpen runs depthwise convs on a grouped GEMM; GPU inputs go around it"
NEEDS = "depthwise convs in conv-norm-act layers; MIOpen has no fast depthwise path here"

# (patch id suffix, model folder, family, sites); MinerU's model is the first.
ROWS = (
    (
        "hgnet-v2",
        "hgnet_v2",
        "HGNetV2 (PP-DocLayoutV2, D-FINE, DEIMv2 backbones)",
        (Site("HGNetV2ConvLayer", "convolution", "normalization", "activation"),),
    ),
    ("d-fine", "d_fine", "D-FINE", (Site("DFineConvNormLayer", "conv", "norm", "activation"),)),
    ("deimv2", "deimv2", "DEIMv2", (Site("Deimv2ConvNormLayer", "conv", "norm", "activation"),)),
    (
        "pp-doclayout-v3",
        "pp_doclayout_v3",
        "PP-DocLayoutV3",
        (Site("PPDocLayoutV3ConvLayer", "convolution", "normalization", "activation"),),
    ),
)

# MinerU 3.0+ loads PP-DocLayoutV2 from transformers (4.0: PPDocLayoutV2ForObjectDetection;
# 3.x builds it on transformers' HGNetV2 backbone), as one of its small models: in torch only
# where its torch stack is installed, else in ONNX.
MINERU = MinerUUse(
    "PP-DocLayoutV2 layout, every tier",
    imports=("transformers.models.hgnet_v2", "transformers.models.pp_doclayout_v2"),
    names=("PPDocLayoutV2ForObjectDetection", "HGNetV2Backbone", "HGNetV2Config"),
    small_model=True,
)
OTHERS = MinerUUse("no MinerU release loads this model")


def _patch(suffix: str, folder: str, family: str, sites: tuple[Site, ...]) -> Patch:
    path = f"{MODELS}/{folder}/modeling_{folder}.py"
    router = Router(path, KERNELS, op("depthwise-conv"), sites, WHY, NEEDS, grouped=True)
    names = ", ".join(s.cls for s in sites)
    return patch(
        router,
        id=f"transformers-{suffix}",
        summary=f"Run {family}'s depthwise convs without MIOpen's grouped GEMM",
        distribution="transformers",
        package="transformers",
        missing_reason=f"transformers {{version}} has no {family} model",
        known=(f"{names}: conv → BatchNorm → activation, depthwise where groups == C",),
        mineru=MINERU if folder == "hgnet_v2" else OTHERS,
        focus=sites[0].cls if len(sites) == 1 else None,
    )


PATCHES = tuple(_patch(*row) for row in ROWS)
