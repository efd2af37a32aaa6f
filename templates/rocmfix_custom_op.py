"""How a rocmfix kernel plugs into torch: one opaque custom op for ``torch.compile``, and the
eager/compile switch of the entry the patched code calls (rocmfix template).

rocmfix drops this file, under this name, beside every Triton kernel module it drops;
``rocmfix revert`` removes it with them. Standard library and torch only.

An entry runs its eager path (the kernel through a cached launch, host-side state and all)
unless ``torch.compile`` is tracing it, where it must be one graph node: the op that
:func:`register_triton_op` defines. :data:`is_compiling` tells the two apart.

On torch 2.7 and later (``torch.library.triton_op``, with the strides the trace saw kept:
:func:`_strides_kept`), :func:`register_triton_op` makes the op a triton op: AOTAutograd
decomposes its node into the op's graph body, whose kernel launches go through
:func:`wrap_triton`, so Inductor sees the Triton kernel and launches it from its own
generated code (and captures it in a CUDA graph) instead of calling back into rocmfix's
Python per node. Anywhere that cannot be defined, the op is an opaque
``torch.library.Library`` op.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from . import rocmfix_kernel_config as kc
from . import rocmfix_triton as rt

OP_NAMESPACE = "rocmfix"

Impl = Callable[..., torch.Tensor]

# Inductor's buffers, and the graph inputs it checks at run time, are aligned to this.
GRAPH_ALIGN = 16


def offset_aligned(t: torch.Tensor) -> bool:
    """Whether a graph body may take the (fake) tensor's address as GRAPH_ALIGN-aligned: its
    storage offset proves it. Inductor allocates its buffers so, and copies a graph input it
    was told is aligned where it is not (compile_fx's copy_misaligned_inputs); an offset it
    cannot prove reads as unaligned, without a guard. Triton-op bodies only (torch >= 2.7)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(statically_known_true((t.storage_offset() * t.element_size()) % GRAPH_ALIGN == 0))


def _library_op(name: str, schema: str, cuda: Impl, cpu: Impl, fake: Impl) -> Any:
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
    return lib


def _strides_kept() -> bool:
    """Whether Inductor gives a user Triton kernel the strides its trace saw (torch >= 2.7,
    pytorch#147861). 2.6 has ``triton_op`` but keeps only the stride order and may pad the
    buffer that feeds the kernel (pytorch#147828): the graph bodies pass the traced strides
    as integers, so there they would read a padded input wrongly, without an error."""
    try:
        return bool(torch.torch_version.TorchVersion(torch.__version__) >= "2.7")
    except Exception:  # noqa: BLE001 - a version torch cannot compare: the opaque op
        return False


def triton_ops_available() -> bool:
    """Whether :func:`register_triton_op` defines triton ops here: Triton importable and
    torch's ``triton_op``/``wrap_triton`` there, torch >= 2.7 (:func:`_strides_kept`).
    ``ROCMFIX_TRITON_OP=0`` keeps the opaque op (for comparing the two; only that exact
    value is read)."""
    return (
        rt.HAS_TRITON
        and hasattr(torch.library, "triton_op")
        and hasattr(torch.library, "wrap_triton")
        and _strides_kept()
        and os.environ.get("ROCMFIX_TRITON_OP") != "0"
    )


def register_triton_op(
    name: str, schema: str, body: Impl, cuda: Impl, cpu: Impl, fake: Impl
) -> Any:
    """Define ``rocmfix::name`` once per process as a triton op (see the module docstring),
    else as an opaque ``torch.library`` op; its default overload, looked up once (resolving
    ``torch.ops.<ns>.<name>`` costs host time on every call).

    The definitions live in the process-wide holder, not in a kernel module: a second import
    of a kernel file (another module name, a reload, vllm and transformers both patched) must
    neither redefine the op nor let the first Library be garbage-collected, which would
    unregister it.

    ``body`` is the op as the compiler sees it: torch ops and :func:`wrap_triton` launches
    only, traceable on fake tensors (no addresses, no host-side caches), and it is the op's
    fake implementation too. Eager calls of the op on real tensors run ``cuda`` and ``cpu``, as
    the opaque op does. Any failure to define the triton op, before it was defined, leaves the
    opaque op, without a warning: the two compute the same."""
    with rt.LOCK:
        holder = rt.process_holder()
        if getattr(holder, name, None) is None:
            defined = _triton_op(name, schema, body, cuda, cpu) if triton_ops_available() else None
            if defined is None:
                try:
                    defined = _library_op(name, schema, cuda, cpu, fake)
                except RuntimeError:
                    # triton_op failed past defining the op: that op stands, its body the
                    # implementation and the fake (custom_op registered both first).
                    if not hasattr(getattr(torch.ops, OP_NAMESPACE), name):
                        raise
                    defined = _PARTIAL
            setattr(holder, name, defined)
    return getattr(getattr(torch.ops, OP_NAMESPACE), name).default


def _triton_op(name: str, schema: str, body: Impl, cuda: Impl, cpu: Impl) -> Any:
    qualname = f"{OP_NAMESPACE}::{name}"
    try:
        op: Any = torch.library.triton_op(qualname, body, mutates_args=(), schema=schema)
    except Exception:  # noqa: BLE001 - an older or newer torch's API: the opaque op serves
        return None
    # Defined from here on: a failure below cannot fall back to a second definition, and the
    # body alone computes the op right on every device (it is what the compiler runs).
    for device, impl in (("cuda", cuda), ("cpu", cpu)):
        try:
            op.register_kernel(device, impl)
        except Exception:  # noqa: BLE001 - the body serves that device's eager calls
            continue
    return op


_PARTIAL = "partial"


def launch_traced(kernel: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """``kernel[grid](*args, **kwargs)`` in a triton op's body, through
    ``torch.library.wrap_triton``: a node the compiler sees. Of the launch options only those
    Inductor takes for a user kernel: a HIP config's others (waves_per_eu, ...) are not kernel
    arguments it knows, so the graph launches without them."""
    kept = {k: v for k, v in kwargs.items() if k not in kc.HIP_LAUNCH_KEYS}
    torch.library.wrap_triton(kernel)[grid](*args, **kept)


_compiler = getattr(torch, "compiler", None)
if _compiler is not None and hasattr(_compiler, "is_compiling"):
    is_compiling: Callable[[], bool] = _compiler.is_compiling
else:  # torch < 2.3
    is_compiling = torch._dynamo.is_compiling
