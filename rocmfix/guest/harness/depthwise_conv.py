"""The depthwise conv as the patched conv-norm-act layers call it: ``depthwise_conv2d(x, conv,
bn, act)`` with the layer's ``nn.Conv2d`` (groups == channels, "same" padding), its eval-mode
BatchNorm and its activation. The native op is the three modules called in turn."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import context
from ..context import Context
from ..protocol import OpSpec
from ..timing import dtype
from . import base

# Activation codes of the kernel's store (templates/rocmfix_kernel_support.py).
ACT_CODES = {"none": 0, "relu": 1, "silu": 2, "gelu": 3, "hardswish": 4}


def _act(name: str) -> Any:
    nn = context.torch.nn
    return {"none": None, "relu": nn.ReLU, "silu": nn.SiLU, "gelu": nn.GELU,
            "hardswish": nn.Hardswish}[name]  # fmt: skip


def _modules(ctx: Context, s: dict[str, Any], generator: Any) -> tuple[Any, Any, Any, Any]:
    """x, the depthwise ``nn.Conv2d``, an eval BatchNorm with random statistics, the act."""
    torch = context.torch
    c, kh, kw, kind = s["c"], s["kh"], s["kw"], dtype(s["dtype"])
    x = torch.randn(s["n"], c, s["h"], s["w"], generator=generator, device=ctx.device)
    conv = torch.nn.Conv2d(
        c, c, (kh, kw), s["s"], ((kh - 1) // 2, (kw - 1) // 2), groups=c, bias=False
    )
    with torch.no_grad():
        conv.weight.copy_(
            torch.randn(c, 1, kh, kw, generator=generator, device=ctx.device).cpu() / (kh * kw)
        )
    conv = conv.to(ctx.device, kind).eval()
    bn = base.random_batchnorm(ctx, c, generator).to(kind)
    make = _act(s.get("act", "none"))
    return x.to(kind), conv, bn, (make() if make is not None else None)


class Bench(base.Bench):
    def __init__(self, ctx: Context, op: OpSpec | None, shape: dict[str, Any]) -> None:
        super().__init__(ctx, op, shape)
        self.x, self.conv, self.bn, self.act = _modules(ctx, shape, self.generator)
        conv = self.conv
        y = base.conv_reference(
            self.x, conv.weight, None, conv.stride, conv.padding, groups=conv.groups
        )
        self.ref = base.bn_act_reference(y, self.bn, shape.get("act", "none"))
        self.config_args = (shape["kh"], shape["kw"], shape["s"], self.x.dtype)

    def native(self) -> Callable[[], Any]:
        x, conv, bn, act = self.x, self.conv, self.bn, self.act
        if act is None:
            return lambda: bn(conv(x))
        return lambda: act(bn(conv(x)))

    def entry(self, module: Any) -> Callable[[], Any]:
        x, conv, bn, act = self.x, self.conv, self.bn, self.act
        return lambda: module.depthwise_conv2d(x, conv, bn, act)


def launch(
    module: Any, shape: dict[str, Any], dtype_name: str, config: dict[str, Any] | None = None
) -> base.Launch:
    """What one call of the kernel at ``shape`` launches, with ``config`` over the resolved
    one; CPU tensors stand in for the GPU's. No dot: no matrix instruction is expected."""
    torch = context.torch
    kind = dtype(dtype_name)
    x = torch.zeros(shape["n"], shape["c"], shape["h"], shape["w"], dtype=kind)
    w = torch.zeros(shape["c"], 1, shape["kh"], shape["kw"], dtype=kind)
    code = ACT_CODES[shape.get("act", "none")]
    kernel, _grid, args, kwargs = module.prepare(x, w, int(shape["s"]), config, act=code)
    return kernel, args, kwargs, None


class Kernel(base.Kernel):
    def __init__(self, ctx: Context, module: Any, shape: dict[str, Any]) -> None:
        bench = Bench(ctx, None, shape)
        super().__init__(ctx, module, shape, [bench])
        self.precision = str(module.precision_class(bench.x.dtype))
        self.key = str(module.shape_class(shape["kh"], shape["kw"], shape["s"]))
        self.key += "_" + self.precision
        self.tolerance = base.TOLERANCE[self.precision]
        bn = bench.bn
        with context.torch.no_grad():
            scale = context.torch.rsqrt(bn.running_var.float() + bn.eps) * bn.weight.float()
            self.shift = (bn.bias.float() - bn.running_mean.float() * scale).contiguous()
        self.scale = scale.contiguous()

    def run(self, bench: Any, config: dict[str, Any]) -> Any:
        conv = bench.conv
        act = ACT_CODES[bench.shape.get("act", "none")]
        return self.module.conv(
            bench.x,
            conv.weight,
            conv.stride,
            conv.padding,
            scale=self.scale,
            shift=self.shift,
            act=act,
            config=config,
        )
