"""How the rocmfix kernel templates reach Triton, and the state they share in a process
(rocmfix template).

rocmfix drops this file, under this name, beside every kernel module that imports it;
``rocmfix revert`` removes it with them. Standard library, and Triton where it imports.

- ``triton``, ``tl``: Triton and ``triton.language``, None where Triton does not import
  (not installed, or a broken install that fails on import: :data:`IMPORT_ERROR` says why);
  :data:`HAS_TRITON` says which;
- :data:`INTERPRETING`: whether the ``@triton.jit`` functions decorated in this import run in
  Triton's CPU interpreter (``TRITON_INTERPRET=1`` when they were decorated);
- :data:`LOCK`: the one lock the templates' writes to their caches take;
- :func:`process_holder`: a module object that lives as long as the process, for what every
  import of a template must share (a second import of a kernel file, under another package,
  must not register its op again).
"""

from __future__ import annotations

import sys
import threading
import types
from typing import Any

__all__ = [
    "HAS_TRITON",
    "IMPORT_ERROR",
    "INTERPRETING",
    "LOCK",
    "interpreted",
    "process_holder",
    "tl",
    "triton",
]

try:
    import triton
    import triton.language as tl
except Exception as _exc:  # noqa: BLE001 - a broken triton install must not break the model
    triton = None
    tl = None
    IMPORT_ERROR: Exception | None = _exc
else:
    IMPORT_ERROR = None

HAS_TRITON = triton is not None
LOCK = threading.Lock()


def interpreted(kernel: Any) -> bool:
    """Whether ``kernel`` (a ``@triton.jit`` function) runs in Triton's CPU interpreter."""
    return type(kernel).__name__ == "InterpretedFunction"


if triton is not None:
    # Triton picks interpreter or compiler when a function is decorated, not when it is
    # called: a probe decorated with the kernels that import this module tells which.

    @triton.jit
    def _probe():  # type: ignore[no-untyped-def]
        pass

    INTERPRETING = interpreted(_probe)
else:
    INTERPRETING = False

_HOLDER = "_rocmfix_op_registry"


def process_holder() -> types.ModuleType:
    """The process-wide holder, in ``sys.modules`` (made on first use)."""
    holder = sys.modules.get(_HOLDER)
    if holder is None:
        holder = types.ModuleType(_HOLDER)
        sys.modules[_HOLDER] = holder
    return holder
