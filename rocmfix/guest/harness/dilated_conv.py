"""The dilated conv as DocLayout-YOLO's ``DilatedBlock.dilated_conv`` runs it: one line,
``act(bn(F.conv2d(x, w, padding=d*(k//2), dilation=d)))``, with one weight, BatchNorm (eval)
and SiLU shared by several dilations. The schemes get the modules as the rewrite passes them."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .. import context
from ..context import Context
from ..protocol import OpSpec
from ..timing import dtype
from . import base


def _precision(ctx: Context, op: OpSpec | None, s: dict[str, Any]) -> str:
    """The kernel template's own precision class for these inputs on this device."""
    try:
        tri = ctx.module(op.kernel_template if op is not None else "")
        return str(tri.precision_class(dtype(s["dtype"]), tri.device_arch(ctx.device)))
    except Exception:  # noqa: BLE001 - no kernel template: the loosest fp32 class
        return "f16" if s["dtype"] != "float32" else ("tf32" if ctx.gpu else "fp32")


class Bench(base.Bench):
    """One dilation's line (``shape["d"]``), with its weight, BatchNorm and SiLU."""

    def __init__(self, ctx: Context, op: OpSpec | None, shape: dict[str, Any]) -> None:
        super().__init__(ctx, op, shape)
        torch, s, generator = context.torch, shape, self.generator
        c, k = s["c"], s["k"]
        x = torch.randn(s["n"], c, s["h"], s["w"], generator=generator, device=ctx.device)
        w = torch.randn(c, c, k, k, generator=generator, device=ctx.device)
        self.x, self.w = x.to(self.dtype), (w / math.sqrt(c * k * k)).to(self.dtype)
        self.bn = base.random_batchnorm(ctx, c, generator).to(self.dtype)
        self.act = torch.nn.SiLU()
        self.d = int(s["d"])
        self.p = self.d * (int(k) // 2)
        conv = base.conv_reference(self.x, self.w, None, (1, 1), (self.p,) * 2, (self.d,) * 2)
        self.ref = base.bn_act_reference(conv, self.bn, "silu")
        self.config_args = (c, c, k, self.dtype)

    def native(self) -> Callable[[], Any]:
        x, w, d, p, bn, act = self.x, self.w, self.d, self.p, self.bn, self.act
        return lambda: act(bn(context.F.conv2d(x, w, None, 1, p, d)))

    def entry(self, module: Any) -> Callable[[], Any]:
        x, w, d, p, bn, act = self.x, self.w, self.d, self.p, self.bn, self.act
        return lambda: module.dilated_conv2d(x, w, d, p, bn=bn, act=act)

    def tolerance(self) -> float:
        return base.TOLERANCE[_precision(self.ctx, self.op, self.shape)]


def launch(
    module: Any, shape: dict[str, Any], dtype_name: str, config: dict[str, Any] | None = None
) -> base.Launch:
    """What one call of the kernel at ``shape`` launches, with ``config`` over the resolved
    one (dilation and page size are not specialised on, so one dilation stands for all); CPU
    tensors stand in for the GPU's."""
    torch = context.torch
    kind = dtype(dtype_name)
    x = torch.zeros(shape["n"], shape["c"], shape["h"], shape["w"], dtype=kind)
    w = torch.zeros(shape["c"], shape["c"], shape["k"], shape["k"], dtype=kind)
    d = int(shape["d"]) if "d" in shape else max(shape["dilations"])  # a case, or a tune target
    # The kernel the block runs: BatchNorm and SiLU in its store.
    kernel, _grid, args, kwargs = module.prepare(x, w, d, d * (shape["k"] // 2), config, epilogue=2)
    operands = module.precision_class(kind, module.device_arch(x.device))
    return kernel, args, kwargs, operands


class Kernel(base.Kernel):
    def __init__(self, ctx: Context, module: Any, shape: dict[str, Any]) -> None:
        dilations = [int(d) for d in shape["dilations"]]
        # Calls at d = 1 go to the vendor's dense conv whatever the config: timing them would
        # add the same to every candidate.
        dilations = [d for d in dilations if d > 1] or dilations
        benches = [Bench(ctx, None, dict(shape, d=d)) for d in dilations]
        super().__init__(ctx, module, shape, benches)
        kind = benches[0].dtype
        self.precision = str(module.precision_class(kind, module.device_arch(ctx.device)))
        self.key = str(module.shape_class(shape["c"], shape["c"], shape["k"]))
        self.key += "_" + self.precision
        self.tolerance = base.TOLERANCE[self.precision]

    def stored(self, config: dict[str, Any]) -> dict[str, Any]:
        # The dot precision follows torch's TF32 switch at run time: not a tile choice.
        return {k: v for k, v in config.items() if k != "input_precision"}

    def run(self, bench: Any, config: dict[str, Any]) -> Any:
        return self.module.dilated_conv2d(
            bench.x, bench.w, bench.d, bench.p, bn=bench.bn, act=bench.act, config=config
        )
