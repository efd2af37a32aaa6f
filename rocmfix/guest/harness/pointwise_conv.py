"""The 1x1 conv, as a conv-norm-act layer calls it: ``conv(x)`` with its ``nn.Conv2d``
(1x1, stride 1, dense or grouped); a scheme's ``pointwise_conv2d(x, conv)`` stands in for it."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .. import context
from ..context import Context
from ..protocol import OpSpec
from ..timing import dtype
from . import base


def reference(x: Any, weight: Any, bias: Any, groups: int) -> Any:
    """fp64 grouped 1x1 conv from its definition, per group a sum over its input channels.
    No conv library."""
    torch = context.torch
    n, cin, h, w = x.shape
    cout = weight.shape[0]
    xg = x.double().reshape(n, groups, cin // groups, h * w)
    wg = weight.double().reshape(groups, cout // groups, cin // groups)
    out = torch.einsum("ngip,goi->ngop", xg, wg).reshape(n, cout, h, w)
    return out + bias.double().view(1, -1, 1, 1) if bias is not None else out


class Bench(base.Bench):
    def __init__(self, ctx: Context, op: OpSpec, shape: dict[str, Any]) -> None:
        torch = context.torch
        generator = base.fresh_generator(ctx)
        s = self.shape = shape
        kind = dtype(s["dtype"])
        cin, cout, g = s["cin"], s["cout"], s["g"]
        x = torch.randn(s["n"], cin, s["h"], s["w"], generator=generator, device=ctx.device)
        conv = torch.nn.Conv2d(cin, cout, 1, groups=g, bias=bool(s["bias"]))
        with torch.no_grad():
            w = torch.randn(cout, cin // g, 1, 1, generator=generator, device=ctx.device)
            conv.weight.copy_(w.cpu() / math.sqrt(cin // g))
            if conv.bias is not None:
                conv.bias.copy_(torch.randn(cout, generator=generator, device=ctx.device).cpu())
        self.conv = conv.to(ctx.device, kind).eval()
        self.x = x.to(kind)
        if s["layout"] == "channels-last":
            self.x = self.x.contiguous(memory_format=torch.channels_last)
            self.conv = self.conv.to(memory_format=torch.channels_last)
        self.ref = reference(self.x, self.conv.weight, self.conv.bias, g)
        self.out_bytes = int(self.ref.numel()) * self.x.element_size()

    def native(self) -> Callable[[], Any]:
        x, conv = self.x, self.conv
        return lambda: conv(x)

    def scheme(self, module: Any) -> tuple[Callable[[], Any], dict[str, Any] | None]:
        x, conv = self.x, self.conv
        return (lambda: module.pointwise_conv2d(x, conv)), None

    def tolerance(self) -> float:
        return 1e-4 if self.shape["dtype"] == "float32" else 1e-2
