"""Per-op harness: how to build one op's inputs at a shape, call the native op or a scheme's
template on them, check the result against fp64, and run the op's tunable kernel with a
given config. One module per op, named by the op registry's ``harness`` field.

A harness module defines ``Bench(ctx, op, shape)`` (doctor: :class:`.base.Bench`, with the
op's :class:`..protocol.OpSpec`) and, for an op with a Triton kernel, ``Kernel(ctx, module,
shape)`` (tune: :class:`.base.Kernel`) and ``launch(module, shape, dtype_name, config)`` (the
ahead-of-time compile check: one call's kernel, arguments, launch keywords and operand class).
:mod:`rocmfix.guest.doctor`, :mod:`rocmfix.guest.tune` and :mod:`rocmfix.guest.check` do the
rest the same way for every op. :mod:`.call` is the bench of ``rocmfix profile``'s replay: a
call the profiled command made, for whichever op it is.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def module(name: str) -> ModuleType:
    if not name.isidentifier():
        raise ValueError("unknown harness " + repr(name))
    return importlib.import_module(__name__ + "." + name)
