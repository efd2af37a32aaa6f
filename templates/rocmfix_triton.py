"""How the rocmfix kernel templates reach Triton, the state they share in a process, and
their launches that repeat (rocmfix template).

rocmfix drops this file, under this name, beside every kernel module that imports it;
``rocmfix revert`` removes it with them. Standard library and torch, and Triton where it
imports (Triton's objects come in as the kernels the callers pass, launched through its
public interfaces only).

- ``triton``, ``tl``: Triton and ``triton.language``, None where Triton does not import
  (not installed, or a broken install that fails on import: :data:`IMPORT_ERROR` says why);
  :data:`HAS_TRITON` says which;
- :data:`INTERPRETING`: whether the ``@triton.jit`` functions decorated in this import run in
  Triton's CPU interpreter (``TRITON_INTERPRET=1`` when they were decorated);
- :data:`LOCK`: the one lock the templates' writes to their caches take;
- :func:`process_holder`: a module object that lives as long as the process, for what every
  import of a template must share (a second import of a kernel file, under another package,
  must not register its op again);
- :class:`Launcher`, :func:`layout_key`, :func:`device_index`: a launch that repeats with new
  tensors.
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

__all__ = [
    "HAS_TRITON",
    "IMPORT_ERROR",
    "INTERPRETING",
    "LOCK",
    "Launcher",
    "device_index",
    "interpreted",
    "layout_key",
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


# Set for good once a compiled kernel's runner rejected the arguments Launcher passes it (a
# Triton whose runner takes them otherwise): every launch goes through ``kernel[grid]`` then.
with LOCK:
    _public_only: list[bool] = process_holder().__dict__.setdefault("public_only", [])


def layout_key(t: torch.Tensor) -> tuple[Any, ...]:
    """What Triton specialises on for a tensor argument, and what a launch prepared for it
    depends on, but its address: shape, strides, dtype, device and 16-byte alignment."""
    return (t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() % 16)


def device_index(t: torch.Tensor) -> int | None:
    """The GPU ``t`` is on, for :class:`Launcher`; None for a CPU tensor (the interpreter)."""
    index = t.get_device()
    return index if index >= 0 else None


def current_stream() -> Callable[[int], Any]:
    """Triton's ``get_current_stream(device)``, which the runner calls when given no stream."""
    return triton.runtime.driver.active.get_current_stream  # type: ignore[union-attr,no-any-return]


class Launcher:
    """``kernel[grid](*args, **kwargs)`` for a call that repeats with new tensors.

    Triton's ``kernel[grid](...)`` binds, specialises and hashes every argument on every call
    (about 20 us of host time on an H100 host). A Launcher makes its first call through it,
    then asks ``kernel.warmup`` (same arguments, launches nothing) for the kernel Triton
    compiled, and launches later calls through that kernel's own ``compiled[grid]``: the
    call interface ``triton.compile``'s result offers, which takes every parameter in the
    kernel's order (constexprs included), and honours Triton's launch hooks. The caller keeps
    one Launcher per key that fixes everything Triton specialises on (the tensors' layouts,
    see :func:`layout_key`, the integers, the constexprs); only the tensors' addresses change
    between calls. The interpreter, a kernel whose parameters the keywords do not all give, a
    pre-run hook and a Triton whose runner rejects those arguments take ``kernel[grid]``.

    ``device`` is the index of the GPU the tensors are on: Triton launches on the current
    device, so a call made while another one is current goes through ``kernel[grid]`` under a
    device guard, as torch's own ops switch device for their inputs. That check is a call's
    one device query: the runner is given that device's current stream, not asking again.
    """

    __slots__ = ("compiled", "device", "grid", "hooks", "kernel", "kwargs", "runner", "stream",
                 "tail")  # fmt: skip

    def __init__(
        self,
        kernel: Any,
        grid: Sequence[int],
        kwargs: Mapping[str, Any],
        device: int | None = None,
    ) -> None:
        self.kernel = kernel
        self.grid = (*grid, 1, 1)[:3]
        self.kwargs = dict(kwargs)
        self.device = device  # None: the tensors are not on a GPU (the interpreter)
        self.compiled: Any = None  # the kernel Triton compiled, once adopted
        self.runner: Any = None  # compiled[grid]
        self.stream: Any = None  # Triton's get_current_stream, once adopted
        self.tail: tuple[Any, ...] = ()  # the keywords' values, in parameter order
        self.hooks: Any = ()  # the kernel's pre-run hooks (a live list), where it has them

    def __call__(self, *args: Any) -> None:
        if self.runner is not None and not self.hooks and not _public_only:
            device = torch.cuda.current_device()
            if device == self.device:
                try:
                    self.runner(*args, *self.tail, stream=self.stream(device))
                    return
                except TypeError:
                    # The runner parses its arguments before it launches: nothing ran.
                    _public_only.append(True)
        self.launch_once(*args)
        if self.runner is None and self.device is not None and not _public_only:
            self._adopt(args)

    def launch_once(self, *args: Any) -> None:
        """``kernel[grid](*args, **kwargs)`` on the tensors' device, adopting nothing: for a
        launch made once (an explicit config), where adopting would cost more than it saves."""
        if self.device is not None and torch.cuda.current_device() != self.device:
            with torch.cuda.device(self.device):
                self.kernel[self.grid](*args, **self.kwargs)
        else:
            self.kernel[self.grid](*args, **self.kwargs)

    def _adopt(self, args: tuple[Any, ...]) -> None:
        """Keep the compiled kernel's runner where the keywords give every parameter after
        the positional ``args`` (a default left out is not known here: no runner)."""
        kernel = self.kernel
        names = list(getattr(kernel, "arg_names", ()))[len(args) :]
        if interpreted(kernel) or any(name not in self.kwargs for name in names):
            return
        try:
            stream = current_stream()
        except AttributeError:  # a Triton without the driver's stream query: kernel[grid]
            return
        with torch.cuda.device(self.device):
            compiled = kernel.warmup(*args, grid=self.grid, **self.kwargs)
        if compiled is not None:
            self.tail = tuple(self.kwargs[name] for name in names)
            self.hooks = getattr(kernel, "pre_run_hooks", ())
            self.stream = stream
            self.compiled, self.runner = compiled, compiled[self.grid]
