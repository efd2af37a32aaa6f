"""The dilated conv as DocLayout-YOLO's ``DilatedBlock.dilated_conv`` runs it: one line,
``act(bn(F.conv2d(x, w, padding=d*(k//2), dilation=d)))``, with one weight, BatchNorm (eval)
and SiLU shared by several dilations. The schemes get the modules as the rewrite passes them."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from .. import context
from ..context import Context
from ..protocol import OpSpec
from ..timing import dtype, poison, rel_err
from . import base

# Relative error allowed per precision class: bf16/fp16 operands, fp32 through TF32 dots (what
# torch lets cuDNN/MIOpen do by default, which the Triton kernel follows), strict fp32.
TOLERANCE = {"f16": 1e-2, "tf32": 5e-3, "fp32": 1e-4}


def reference(x: Any, w: Any, d: int, p: int) -> Any:
    """fp64 conv as unfold + matmul: no conv library in the reference, so a library that
    blocks or errs cannot take the check down with it."""
    n, _, h, wd = x.shape
    co, _, k, _ = w.shape
    oh = h + 2 * p - d * (k - 1)
    ow = wd + 2 * p - d * (k - 1)
    cols = context.F.unfold(x.double(), k, dilation=d, padding=p)
    out = w.reshape(co, -1).double() @ cols
    return out.reshape(n, co, oh, ow)


def _inputs(ctx: Context, s: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """x, the shared weight, an eval BatchNorm with random statistics and the SiLU."""
    torch = context.torch
    generator = base.fresh_generator(ctx)
    c, kind = s["c"], dtype(s["dtype"])
    x = torch.randn(s["n"], c, s["h"], s["w"], generator=generator, device=ctx.device)
    fan_in = c * s["k"] * s["k"]
    w = torch.randn(c, c, s["k"], s["k"], generator=generator, device=ctx.device)
    bn = base.random_batchnorm(ctx, c, generator)
    return x.to(kind), (w / math.sqrt(fan_in)).to(kind), bn.to(kind), torch.nn.SiLU()


def line_reference(conv: Any, bn: Any) -> Any:
    """``act(bn(conv))`` in fp64 from the fp64 conv: eval BatchNorm, then SiLU."""
    return base.bn_act_reference(conv, bn, "silu")


def _precision(ctx: Context, op: OpSpec, s: dict[str, Any]) -> str:
    """The kernel template's own precision class for these inputs on this device."""
    try:
        tri = ctx.module(op.kernel_template)
        return str(tri.precision_class(dtype(s["dtype"]), tri.device_arch(ctx.device)))
    except Exception:  # noqa: BLE001 - no kernel template: the loosest fp32 class
        return "f16" if s["dtype"] != "float32" else ("tf32" if ctx.gpu else "fp32")


class Bench(base.Bench):
    def __init__(self, ctx: Context, op: OpSpec, shape: dict[str, Any]) -> None:
        self.ctx = ctx
        self.op = op
        self.shape = shape
        self.x, self.w, self.bn, self.act = _inputs(ctx, shape)
        self.d = int(shape["d"])
        self.p = self.d * (int(shape["k"]) // 2)
        self.ref = line_reference(reference(self.x, self.w, self.d, self.p), self.bn)
        self.out_bytes = int(self.ref.numel()) * self.x.element_size()

    def native(self) -> Callable[[], Any]:
        x, w, d, p, bn, act = self.x, self.w, self.d, self.p, self.bn, self.act
        return lambda: act(bn(context.F.conv2d(x, w, None, 1, p, d)))

    def scheme(self, module: Any) -> tuple[Callable[[], Any], dict[str, Any] | None]:
        x, w, d, p = self.x, self.w, self.d, self.p
        c, k = self.shape["c"], self.shape["k"]
        config = base.resolved(self.ctx, module, c, c, k, x.dtype)
        bn, act = self.bn, self.act
        return (lambda: module.dilated_conv2d(x, w, d, p, bn=bn, act=act)), config

    def tolerance(self) -> float:
        return TOLERANCE[_precision(self.ctx, self.op, self.shape)]


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
        super().__init__(ctx, module, shape)
        self.c, self.k = int(shape["c"]), int(shape["k"])
        self.x, self.w, self.bn, self.act = _inputs(ctx, shape)
        self.dtype = self.x.dtype
        dilations = [int(d) for d in shape["dilations"]]
        # Calls at d = 1 go to the vendor's dense conv whatever the config: timing them would
        # add the same to every candidate.
        self.dilations = [d for d in dilations if d > 1] or dilations
        self.refs = {
            d: line_reference(reference(self.x, self.w, d, d * (self.k // 2)), self.bn)
            for d in self.dilations
        }
        self.precision = str(module.precision_class(self.dtype, module.device_arch(ctx.device)))
        self.key = str(module.shape_class(self.c, self.c, self.k)) + "_" + self.precision
        self.tolerance = TOLERANCE[self.precision]
        self.config_args = (self.c, self.c, self.k, self.dtype)

    def stored(self, config: dict[str, Any]) -> dict[str, Any]:
        # The dot precision follows torch's TF32 switch at run time: not a tile choice.
        return {k: v for k, v in config.items() if k != "input_precision"}

    def calls(self, config: dict[str, Any]) -> list[Callable[[], Any]]:
        cfg = self.stored(config)
        return [functools.partial(self._line, d, config=cfg) for d in self.dilations]

    def user_calls(self) -> list[Callable[[], Any]]:
        return [functools.partial(self._line, d) for d in self.dilations]

    def _line(self, d: int, config: dict[str, Any] | None = None) -> Any:
        return self.module.dilated_conv2d(
            self.x, self.w, d, d * (self.k // 2), bn=self.bn, act=self.act, config=config
        )

    def check(self, config: dict[str, Any]) -> float:
        worst = 0.0
        cfg = self.stored(config)
        for d in self.dilations:
            poison(self.ctx, int(self.refs[d].numel()) * self.x.element_size())
            out = self._line(d, config=cfg)
            self.ctx.sync()
            err = rel_err(out, self.refs[d])
            if not err <= worst:
                worst = err
        return worst
