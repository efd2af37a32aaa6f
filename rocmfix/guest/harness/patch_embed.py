"""The patch embed: ``x[M, C, T, P, P]`` through a Conv3d with kernel == stride, as a GEMM."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .. import context
from ..context import Context
from ..protocol import OpSpec
from ..timing import dtype, rel_err
from . import base


def _tolerance(name: str) -> float:
    return 1e-4 if name == "float32" else 1e-2


class Bench(base.Bench):
    def __init__(self, ctx: Context, op: OpSpec, shape: dict[str, Any]) -> None:
        torch = context.torch
        generator = base.fresh_generator(ctx)
        s = self.shape = shape
        self.ctx = ctx
        k = s["c"] * s["t"] * s["p"] * s["p"]
        patch = (s["c"], s["t"], s["p"], s["p"])
        self.x = torch.randn(s["m"], *patch, generator=generator, device=ctx.device)
        self.x = self.x.to(dtype(s["dtype"]))
        self.w = torch.randn(s["n"], *patch, generator=generator, device=ctx.device) / math.sqrt(k)
        self.w = self.w.to(dtype(s["dtype"]))
        self.ref = self.x.flatten(1).double() @ self.w.flatten(1).double().T
        self.out_bytes = s["m"] * s["n"] * self.x.element_size()

    def native(self) -> Callable[[], Any]:
        s, x, w = self.shape, self.x, self.w
        stride = (s["t"], s["p"], s["p"])
        return lambda: context.F.conv3d(x, w, None, stride=stride).reshape(s["m"], s["n"])

    def scheme(self, module: Any) -> tuple[Callable[[], Any], dict[str, Any] | None]:
        x, w = self.x, self.w
        config = base.resolved(self.ctx, module, x.dtype)
        return (lambda: module.triton_conv3d_patchify(x, w, None)), config

    def tolerance(self) -> float:
        return _tolerance(self.shape["dtype"])


def launch(
    module: Any, shape: dict[str, Any], dtype_name: str, config: dict[str, Any] | None = None
) -> base.Launch:
    """What one call of ``module`` (a Triton scheme's template) at ``shape`` launches, with
    ``config`` over the resolved one; CPU tensors stand in for the GPU's (only their dtypes
    and alignments are read)."""
    torch = context.torch
    kind = dtype(dtype_name)
    k = shape["c"] * shape["t"] * shape["p"] * shape["p"]
    a = torch.zeros(shape["m"], k, dtype=kind)
    w = torch.zeros(shape["n"], k, dtype=kind)
    kernel, _grid, args, kwargs = module.prepare(a, w, None, config=config)
    return kernel, args, kwargs, module.precision_class(kind)


class Kernel(base.Kernel):
    def __init__(self, ctx: Context, module: Any, shape: dict[str, Any]) -> None:
        super().__init__(ctx, module, shape)
        torch = context.torch
        s = shape
        k = s["c"] * s["t"] * s["p"] * s["p"]
        self.dtype = dtype(s["dtype"])
        self.a = torch.randn(s["m"], k, device=ctx.device).to(self.dtype)
        self.w = (torch.randn(s["n"], k, device=ctx.device) / math.sqrt(k)).to(self.dtype)
        self.out = torch.empty(s["m"], s["n"], device=ctx.device, dtype=self.dtype)
        self.ref = self.a.double() @ self.w.double().T
        self.tolerance = _tolerance(s["dtype"])
        self.precision = str(module.precision_class(self.dtype))
        self.key = self.precision
        self.config_args = (self.dtype,)

    def calls(self, config: dict[str, Any]) -> list[Callable[[], Any]]:
        m = self.module
        return [lambda: m.patchify_gemm(self.a, self.w, None, config=config, out=self.out)]

    def user_calls(self) -> list[Callable[[], Any]]:
        m = self.module
        return [lambda: m.triton_conv3d_patchify(self.a, self.w, None)]

    def check(self, config: dict[str, Any]) -> float:
        self.out.fill_(float("nan"))
        out = self.module.patchify_gemm(self.a, self.w, None, config=config, out=self.out)
        self.ctx.sync()
        return rel_err(out, self.ref)
