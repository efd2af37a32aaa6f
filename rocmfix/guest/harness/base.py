"""What a harness's doctor bench and tune kernel share, whatever the op."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from .. import context
from ..context import Context
from ..protocol import OpSpec
from ..timing import dtype, poison, rel_err

# Relative error allowed per precision class: bf16/fp16 operands, fp32 through TF32 dots (what
# torch lets cuDNN/MIOpen do by default, which the Triton kernels follow), strict fp32.
TOLERANCE = {"f16": 1e-2, "tf32": 5e-3, "fp32": 1e-4}


def fresh_generator(ctx: Context) -> Any:
    """A generator seeded afresh each run: a kernel must compute the function, not one lucky
    input."""
    generator = context.torch.Generator(device=ctx.device)
    generator.manual_seed(int(time.time() * 1e6) % (2**31))
    return generator


def resolved(ctx: Context, module: Any, *args: Any) -> dict[str, Any] | None:
    """The tile config a template resolves for a call (``args``: its ``resolve_config``'s
    after the device), its own warnings forwarded; None for a template without configs."""
    if not hasattr(module, "resolve_config"):
        return None
    return dict(ctx.with_warnings(lambda: module.resolve_config(ctx.device, *args)))


def random_batchnorm(ctx: Context, c: int, generator: Any) -> Any:
    """An eval BatchNorm of ``c`` channels on the device, with random statistics."""
    torch = context.torch
    bn = torch.nn.BatchNorm2d(c).to(ctx.device).eval()
    with torch.no_grad():
        for t, low, high in ((bn.running_mean, -0.5, 0.5), (bn.running_var, 0.5, 1.5),
                             (bn.weight, 0.5, 1.5), (bn.bias, -0.5, 0.5)):  # fmt: skip
            t.copy_(torch.rand(c, generator=generator, device=ctx.device) * (high - low) + low)
    return bn


def conv_reference(
    x: Any,
    weight: Any,
    bias: Any = None,
    stride: tuple[int, int] = (1, 1),
    padding: tuple[int, int] = (0, 0),
    dilation: tuple[int, int] = (1, 1),
    groups: int = 1,
) -> Any:
    """``F.conv2d`` in fp64 from its definition, a sum over the kernel's taps of each group's
    channels: no conv library in the reference, so a library that blocks or errs cannot take
    the check down with it."""
    torch = context.torch
    n, _, h, wd = x.shape
    cout, cig, kh, kw = weight.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    xp = context.F.pad(x.double(), (pw, pw, ph, ph))
    xp = xp.reshape(n, groups, cig, h + 2 * ph, wd + 2 * pw)
    w = weight.double().reshape(groups, cout // groups, cig, kh, kw)
    y = torch.zeros(n, groups, cout // groups, oh, ow, dtype=torch.float64, device=x.device)
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + sh * (oh - 1) + 1, sh)
            cols = slice(j * dw, j * dw + sw * (ow - 1) + 1, sw)
            y += torch.einsum("ngihw,goi->ngohw", xp[..., rows, cols], w[..., i, j])
    y = y.reshape(n, cout, oh, ow)
    return y if bias is None else y + bias.double().view(1, -1, 1, 1)


def bn_act_reference(y: Any, bn: Any, act: str) -> Any:
    """``act(bn(y))`` in fp64: the eval BatchNorm, then the activation by its name in
    ``torch.nn.functional`` ("none": none)."""
    torch = context.torch
    stats = [t.double().view(1, -1, 1, 1) for t in (bn.running_mean, bn.running_var,
                                                    bn.weight, bn.bias)]  # fmt: skip
    mean, var, gamma, beta = stats
    y = (y - mean) / torch.sqrt(var + bn.eps) * gamma + beta
    return y if act == "none" else getattr(context.F, act)(y)


class Bench:
    """Inputs and fp64 reference of one doctor case (``rocmfix.ops.Case``, a shape MinerU
    runs), and the calls doctor measures on them; built once per process. ``op`` is None
    where tune builds it for its kernel. ``x`` is the input whose dtype the output has;
    ``config_args``: what a scheme template's ``resolve_config`` takes after the device."""

    ref: Any
    x: Any
    config_args: tuple[Any, ...] = ()

    def __init__(self, ctx: Context, op: OpSpec | None, shape: dict[str, Any]) -> None:
        self.ctx, self.op, self.shape = ctx, op, shape
        self.dtype = dtype(shape["dtype"])
        self.generator = fresh_generator(ctx)

    @property
    def out_bytes(self) -> int:
        return int(self.ref.numel()) * int(self.x.element_size())

    def native(self) -> Callable[[], Any]:
        raise NotImplementedError

    def entry(self, module: Any) -> Callable[[], Any]:
        """The call of a scheme's template, through the entry point the patch calls."""
        raise NotImplementedError

    def scheme(self, module: Any) -> tuple[Callable[[], Any], dict[str, Any] | None]:
        """The call to measure for a scheme's template and the tile config it resolves to."""
        return self.entry(module), resolved(self.ctx, module, *self.config_args)

    def setting(self, scheme: str) -> Callable[[], Any]:
        """The call to measure for a scheme with no template: a setting of the user's own
        stack, run by name (raise ``context.Unavailable`` where it cannot run here)."""
        raise NotImplementedError

    def tolerance(self) -> float:
        return TOLERANCE["fp32" if self.shape["dtype"] == "float32" else "f16"]


class LayerBench(Bench):
    """A layer's bench: native is ``layer(x)``, a scheme is its template's ``ENTRY(x, layer)``."""

    ENTRY = ""
    layer: Any

    def native(self) -> Callable[[], Any]:
        return functools.partial(self.layer, self.x)

    def entry(self, module: Any) -> Callable[[], Any]:
        return functools.partial(getattr(module, self.ENTRY), self.x, self.layer)


# One launch for the ahead-of-time check: kernel, args, launch keywords, operand class.
Launch = tuple[Any, tuple[Any, ...], dict[str, Any], "str | None"]


class Kernel:
    """One tunable kernel at one of MinerU's shapes: resolve, run and check a config over the
    calls it makes there, one doctor bench each (``benches``). A harness defines ``run``
    (the kernel's own launch with an explicit config), ``precision``, ``key`` and
    ``tolerance``."""

    def __init__(self, ctx: Context, module: Any, shape: dict[str, Any], benches: list[Any]):
        self.ctx, self.module, self.shape, self.benches = ctx, module, shape, benches
        self.key = ""
        self.precision = ""
        self.tolerance = 0.0

    def arch(self) -> str:
        return str(self.module.device_arch(self.ctx.device))

    def stored(self, config: dict[str, Any]) -> dict[str, Any]:
        """The part of a resolved config that goes into the tuned file."""
        return dict(config)

    def resolve(self) -> dict[str, Any]:
        """The config the template resolves now (its cache cleared: the tuned file or the
        environment may have changed since)."""
        self.module.clear_config_cache()
        return resolved(self.ctx, self.module, *self.benches[0].config_args) or {}

    def run(self, bench: Any, config: dict[str, Any]) -> Any:
        raise NotImplementedError

    def calls(self, config: dict[str, Any]) -> list[Callable[[], Any]]:
        return [functools.partial(self.run, b, self.stored(config)) for b in self.benches]

    def user_calls(self) -> list[Callable[[], Any]]:
        """The calls the patched model makes, through the template's entry point and its
        own config resolution (tune installs each candidate as the config it resolves)."""
        return [b.entry(self.module) for b in self.benches]

    def check(self, config: dict[str, Any]) -> float:
        """The worst relative error of the calls with ``config``, each output poisoned first."""
        worst = 0.0
        for bench, call in zip(self.benches, self.calls(config)):
            poison(self.ctx, bench.out_bytes)
            out = call()
            self.ctx.sync()
            err = rel_err(out.reshape(bench.ref.shape), bench.ref)
            if not err <= worst:  # NaN is the worst
                worst = err
        return worst
