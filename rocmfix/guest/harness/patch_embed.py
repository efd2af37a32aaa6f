"""The patch embed: ``x[M, C, T, P, P]`` through a Conv3d with kernel == stride, as a GEMM."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .. import context
from ..context import Context
from ..protocol import OpSpec
from ..timing import dtype
from . import base


class Bench(base.Bench):
    def __init__(self, ctx: Context, op: OpSpec | None, shape: dict[str, Any]) -> None:
        super().__init__(ctx, op, shape)
        torch, s = context.torch, shape
        k = s["c"] * s["t"] * s["p"] * s["p"]
        patch = (s["c"], s["t"], s["p"], s["p"])
        x = torch.randn(s["m"], *patch, generator=self.generator, device=ctx.device)
        w = torch.randn(s["n"], *patch, generator=self.generator, device=ctx.device)
        self.x, self.w = x.to(self.dtype), (w / math.sqrt(k)).to(self.dtype)
        self.ref = self.x.flatten(1).double() @ self.w.flatten(1).double().T
        self.config_args = (self.dtype,)

    def native(self) -> Callable[[], Any]:
        s, x, w = self.shape, self.x, self.w
        stride = (s["t"], s["p"], s["p"])
        return lambda: context.F.conv3d(x, w, None, stride=stride).reshape(s["m"], s["n"])

    def entry(self, module: Any) -> Callable[[], Any]:
        x, w = self.x, self.w
        return lambda: module.triton_conv3d_patchify(x, w, None)


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
        bench = Bench(ctx, None, shape)
        super().__init__(ctx, module, shape, [bench])
        self.tolerance = bench.tolerance()
        self.precision = self.key = str(module.precision_class(bench.dtype))

    def run(self, bench: Any, config: dict[str, Any]) -> Any:
        return self.module.patchify_gemm(bench.x.flatten(1), bench.w.flatten(1), None, config)
