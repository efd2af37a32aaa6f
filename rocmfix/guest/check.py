"""Ahead-of-time compiles, in the target interpreter: a Triton scheme's kernel at one of
MinerU's shapes and in one dtype, prepared as the template prepares a launch on a GPU (its own
config resolution, tuned file included, or an explicit config over it) and compiled for that
GPU with this Triton, without that GPU.

``rocmfix kernels`` sends no items and gets the whole sweep (every Triton scheme x tune shape x
dtype x arch); ``doctor`` and ``tune`` send their own (the GPU they run on, the config they
ran or are about to time).
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import traceback
from collections.abc import Iterator
from typing import Any

from . import aot, harness
from .context import Context, one_line
from .protocol import Checked, CompileItem, Request


def sweep(request: Request) -> Iterator[CompileItem]:
    archs = request.archs or list(aot.TARGETS)
    for op in request.ops.values():
        every = itertools.product(op.triton_schemes, op.tune, op.dtypes, archs)
        for scheme, target, dtype, arch in every:
            gpu = dict(op.tune[target].gpu)
            yield CompileItem(
                op=op.name, scheme=scheme, shape=target, gpu=gpu, dtype=dtype, arch=arch
            )


def compile_item(ctx: Context, item: CompileItem) -> Checked:
    """One compile as an event: the compiler's numbers, or why there are none."""
    op = ctx.request.ops[item.op]
    template = op.schemes[item.scheme]
    # The item it was (but its shape's sizes: ``shape`` names them), and the template.
    fields: dict[str, Any] = dict(dataclasses.asdict(item), template=template)
    del fields["gpu"]
    row = aot.describe(item.arch)
    if row is None:
        return Checked(ok=False, problems=[f"no compile target known for {item.arch}"], **fields)
    try:
        module = ctx.module(template)
        kc = importlib.import_module(module.__package__ + ".rocmfix_kernel_config")
        launch = harness.module(op.harness).launch
        backend, _warp, cc, *_ = row
        emulation = kc.Emulation(item.arch.split(":")[0], backend == "hip", cc // 10, 132)
        with kc.emulating(emulation):
            module.clear_config_cache()
            try:
                kernel, args, kwargs, operands = ctx.with_warnings(
                    lambda: launch(module, dict(item.gpu), item.dtype, item.config)
                )
                stats = aot.check(kernel, args, kwargs, item.arch, operands or "")
            finally:
                module.clear_config_cache()
        fields.update(stats)
        fields["kernel"] = kernel.__name__
        fields["operands"] = operands
        fields["options"] = {k: v for k, v in kwargs.items() if not k[0].isupper()}
        fields["constexprs"] = {k: v for k, v in kwargs.items() if k[0].isupper()}
    except Exception as exc:  # noqa: BLE001 - one launch's failure is a row
        fields.update(
            ok=False,
            error=one_line(exc),
            problems=["cannot prepare: " + one_line(exc)],
            traceback=traceback.format_exc()[-1500:],
        )
    fields.setdefault("ok", True)
    return Checked(**fields)


def check(ctx: Context) -> None:
    items = ctx.request.compiles or list(sweep(ctx.request))
    for item in items:
        ctx.channel.send(compile_item(ctx, item))
