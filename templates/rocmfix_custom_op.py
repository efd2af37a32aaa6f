"""How a rocmfix kernel plugs into torch: one opaque custom op for ``torch.compile``, and the
eager/compile switch of the entry the patched code calls (rocmfix template).

rocmfix drops this file, under this name, beside every Triton kernel module it drops;
``rocmfix revert`` removes it with them. Standard library and torch only.

An entry runs its eager path (the kernel through a cached launch, host-side state and all)
unless ``torch.compile`` is tracing it, where it must be one graph node: the op that
:func:`register_op` defines. :data:`is_compiling` tells the two apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import rocmfix_triton as rt

OP_NAMESPACE = "rocmfix"

Impl = Callable[..., torch.Tensor]


def register_op(name: str, schema: str, cuda: Impl, cpu: Impl, fake: Impl) -> Any:
    """Define ``rocmfix::name`` once per process; its default overload, looked up once (resolving
    ``torch.ops.<ns>.<name>`` costs host time on every call).

    The Library objects live in the process-wide holder, not in a kernel module: a second
    import of a kernel file (another module name, a reload, vllm and transformers both
    patched) must neither redefine the op nor let the first Library be garbage-collected,
    which would unregister it."""
    with rt.LOCK:
        holder = rt.process_holder()
        if getattr(holder, name, None) is None:
            lib = torch.library.Library(OP_NAMESPACE, "FRAGMENT")
            lib.define(f"{name}{schema}")
            lib.impl(name, cuda, "CUDA")
            lib.impl(name, cpu, "CPU")
            qualname = f"{OP_NAMESPACE}::{name}"
            if hasattr(torch.library, "register_fake"):  # torch >= 2.4
                torch.library.register_fake(qualname, fake, lib=lib)
            elif hasattr(torch.library, "impl_abstract"):
                torch.library.impl_abstract(qualname, fake, lib=lib)
            else:
                lib.impl(name, fake, "Meta")
            setattr(holder, name, lib)
    return getattr(getattr(torch.ops, OP_NAMESPACE), name).default


_compiler = getattr(torch, "compiler", None)
if _compiler is not None and hasattr(_compiler, "is_compiling"):
    is_compiling: Callable[[], bool] = _compiler.is_compiling
else:  # torch < 2.3
    is_compiling = torch._dynamo.is_compiling
