"""The op registry: the one place that names an op rocmfix replaces.

An op is a slow native call (``F.conv3d`` for the Qwen-VL patch embed, a dilated ``F.conv2d``
for DocLayout-YOLO) and everything rocmfix knows about it, as data: its schemes (which
template each drops, which function the patched code calls), MinerU's shapes that ``doctor``
measures, the kernels ``tune`` searches and their grids, and the key of the tuned file. Each
op lives in its own module here; patches, doctor, tune, the renderer, the CLI and the tests
read it from :data:`OPS` and never restate it.

Code that runs inside the user's interpreter (the per-op harness in
:mod:`rocmfix.guest.harness`) gets this data in its request, as JSON.
"""

from __future__ import annotations

from . import dilated_conv, patch_embed
from .base import KERNEL_CONFIG_TEMPLATE, Case, GridGroup, Op, Scheme, TuneTarget

__all__ = [
    "DILATED_CONV",
    "KERNEL_CONFIG_TEMPLATE",
    "OPS",
    "PATCH_EMBED",
    "Case",
    "GridGroup",
    "Op",
    "Scheme",
    "TuneTarget",
    "op",
]

PATCH_EMBED = patch_embed.OP
DILATED_CONV = dilated_conv.OP
OPS: tuple[Op, ...] = (PATCH_EMBED, DILATED_CONV)


def op(name: str) -> Op:
    for each in OPS:
        if each.name == name:
            return each
    raise KeyError(name)
