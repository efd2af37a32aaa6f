"""The op registry: the one place that knows which ops rocmfix replaces.

An op is a slow native call (``F.conv3d`` for the Qwen-VL patch embed, a dilated ``F.conv2d``
for DocLayout-YOLO, a depthwise conv) and everything rocmfix knows about it, as data: its
schemes (which template each drops, which function the patched code calls), MinerU's shapes
that ``doctor`` measures, the kernels ``tune`` searches and their grids, the key of the tuned
file, the config variable and the no-Triton fallback scheme. Each op lives in its own module
here, which defines ``OP``; the registry finds those modules by listing this package, so a new
op is a new module and nothing here changes. Patches, doctor, tune, kernels, the worker, the
renderer, the CLI and the tests read ops from :data:`OPS` and never restate them.

Code that runs inside the user's interpreter (the per-op harness in
:mod:`rocmfix.guest.harness`) gets this data in its request, as JSON.
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import TRITON_SUPPORT, Case, GridGroup, Op, Scheme

__all__ = [
    "DILATED_CONV",
    "OPS",
    "PATCH_EMBED",
    "TRITON_SUPPORT",
    "Case",
    "GridGroup",
    "Op",
    "Scheme",
    "op",
]


def _discover() -> tuple[Op, ...]:
    """Every ``OP`` of a module of this package, by (order, name)."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        each = getattr(module, "OP", None)
        if isinstance(each, Op):
            found.append(each)
    names = [each.name for each in found]
    assert len(names) == len(set(names)), "op names must be unique"
    return tuple(sorted(found, key=lambda each: (each.order, each.name)))


OPS: tuple[Op, ...] = _discover()


def op(name: str) -> Op:
    for each in OPS:
        if each.name == name:
            return each
    raise KeyError(name)


# The ops the patches of older targets name directly.
PATCH_EMBED = op("patch-embed")
DILATED_CONV = op("dilated-conv")
