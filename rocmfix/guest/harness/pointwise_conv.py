"""The 1x1 conv, as a conv-norm-act layer calls it: ``conv(x)`` with its ``nn.Conv2d``
(1x1, stride 1, dense or grouped); a scheme's ``pointwise_conv2d(x, conv)`` stands in for it."""

from __future__ import annotations

import math
from typing import Any

from .. import context
from ..context import Context
from ..protocol import OpSpec
from . import base


class Bench(base.LayerBench):
    ENTRY = "pointwise_conv2d"

    def __init__(self, ctx: Context, op: OpSpec | None, shape: dict[str, Any]) -> None:
        super().__init__(ctx, op, shape)
        torch, s, generator = context.torch, shape, self.generator
        cin, cout, g = s["cin"], s["cout"], s["g"]
        x = torch.randn(s["n"], cin, s["h"], s["w"], generator=generator, device=ctx.device)
        conv = torch.nn.Conv2d(cin, cout, 1, groups=g, bias=bool(s["bias"]))
        with torch.no_grad():
            w = torch.randn(cout, cin // g, 1, 1, generator=generator, device=ctx.device)
            conv.weight.copy_(w.cpu() / math.sqrt(cin // g))
            if conv.bias is not None:
                conv.bias.copy_(torch.randn(cout, generator=generator, device=ctx.device).cpu())
        self.layer = conv.to(ctx.device, self.dtype).eval()
        self.x = x.to(self.dtype)
        if s["layout"] == "channels-last":
            self.x = self.x.contiguous(memory_format=torch.channels_last)
            self.layer = self.layer.to(memory_format=torch.channels_last)
        self.ref = base.conv_reference(self.x, self.layer.weight, self.layer.bias, groups=g)
