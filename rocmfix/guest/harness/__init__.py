"""Per-op harness: how to build one op's inputs at a shape, call the native op or a scheme's
template on them, check the result against fp64, and run the op's tunable kernel with a
given config. One module per op, named by the op registry's ``harness`` field.

A harness module defines ``Case(ctx, shape)`` (for doctor) and ``Kernel(ctx, op, spec)``
(for tune); :mod:`rocmfix.guest.doctor` and :mod:`rocmfix.guest.tune` do the rest the same
way for every op.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def module(name: str) -> ModuleType:
    if not name.isidentifier():
        raise ValueError("unknown harness " + repr(name))
    return importlib.import_module(__name__ + "." + name)
