"""The transposed conv with kernel == stride, as the DB head calls it: ``deconv(x)`` with its
``nn.ConvTranspose2d``; a scheme's ``conv_transpose2d(x, deconv)`` stands in for it."""

from __future__ import annotations

import math
from typing import Any

from .. import context
from ..context import Context
from ..protocol import OpSpec
from . import base


def reference(x: Any, weight: Any, bias: Any) -> Any:
    """fp64 ``conv_transpose2d`` with kernel == stride from its definition: each input pixel
    times the weight is the k x k block it writes. No conv library."""
    torch = context.torch
    n, _, h, w = x.shape
    _, cout, kh, kw = weight.shape
    blocks = torch.einsum("nchw,cokl->nohkwl", x.double(), weight.double())
    out = blocks.reshape(n, cout, h * kh, w * kw)
    return out + bias.double().view(1, -1, 1, 1) if bias is not None else out


class Bench(base.LayerBench):
    ENTRY = "conv_transpose2d"

    def __init__(self, ctx: Context, op: OpSpec | None, shape: dict[str, Any]) -> None:
        super().__init__(ctx, op, shape)
        torch, s, generator = context.torch, shape, self.generator
        k = s["k"]
        x = torch.randn(s["n"], s["cin"], s["h"], s["w"], generator=generator, device=ctx.device)
        deconv = torch.nn.ConvTranspose2d(s["cin"], s["cout"], k, k)
        with torch.no_grad():
            w = torch.randn(s["cin"], s["cout"], k, k, generator=generator, device=ctx.device)
            deconv.weight.copy_(w.cpu() / math.sqrt(s["cin"]))
            deconv.bias.copy_(torch.randn(s["cout"], generator=generator, device=ctx.device).cpu())
        self.x = x.to(self.dtype)
        self.layer = deconv.to(ctx.device, self.dtype).eval()
        self.ref = reference(self.x, self.layer.weight, self.layer.bias)
