"""Launches of a compiled Triton kernel without Triton's per-call binding (rocmfix template).

rocmfix drops this file, under this name, beside every Triton kernel module it drops;
``rocmfix revert`` removes it with them. Standard library, torch, and Triton where it imports
(:class:`Launcher` reads Triton's runtime only once a kernel has run through it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from . import rocmfix_triton as rt

# Triton's JITFunction.run (3.5 to 3.8 at least) ends in these calls; Launcher makes the last
# one itself. The launcher's arguments are no public API, so they are read from the code.
_RUN_CALLS = (
    "bound_args, specialization, options = binder(*args, **kwargs)",
    "kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata,",
    "knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *bound_args.values())",
)
# What _direct_launch_path found, once per process: it is a fact of the process's Triton, and
# every import of a kernel module shares it.
with rt.LOCK:
    _launch_path: list[Any] = rt.process_holder().__dict__.setdefault("launch_path", [])


def _direct_launch_path() -> Any:
    """Triton's runtime pieces a direct launch needs, or None where this Triton's launch path
    is not the one :class:`Launcher` knows (then every call goes through ``kernel[grid]``)."""
    if not _launch_path:
        found: Any = None
        try:
            import inspect

            from triton import knobs
            from triton.runtime.driver import driver
            from triton.runtime.jit import JITFunction

            source = " ".join(inspect.getsource(JITFunction.run).split())
            if all(" ".join(call.split()) in source for call in _RUN_CALLS):
                found = (knobs, driver)
        except Exception:  # noqa: BLE001 - no triton, or one laid out otherwise
            found = None
        _launch_path.append(found)
    return _launch_path[0]


# Each kernel's parameters, by its function: inspect.signature costs tens of microseconds, and
# a layer adopts a kernel for each input layout it meets (a page or text-line size each).
_parameters: dict[Any, list[Any]] = {}


def layout_key(t: torch.Tensor) -> tuple[Any, ...]:
    """What Triton specialises on for a tensor argument, and what a launch prepared for it
    depends on, but its address: shape, strides, dtype, device and 16-byte alignment."""
    return (t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() % 16)


def device_index(t: torch.Tensor) -> int | None:
    """The GPU ``t`` is on, for :class:`Launcher`; None for a CPU tensor (the interpreter)."""
    index = t.get_device()
    return index if index >= 0 else None


def _current_getters(active: Any) -> tuple[Any, Any]:
    """Triton's active driver's getters of the current device and stream. Under torch, Triton
    asks ``torch.cuda.current_device``, which runs torch's lazy-init check before the C call
    ``torch._C._cuda_getDevice``; a kernel adopted here has run, so CUDA is initialised and
    the C call alone gives the same answer. The stream getter is already torch's C call
    (``_cuda_getCurrentRawStream``, HIP's under ROCm)."""
    device = active.get_current_device
    fast = getattr(torch._C, "_cuda_getDevice", None)
    if fast is not None and device is getattr(torch.cuda, "current_device", None):
        device = fast
    return device, active.get_current_stream


class _Mark:
    """A stand-in for one of the grid's sizes or the stream in :func:`direct_launch`'s probe:
    where it lands in the C launch's arguments says where those values go."""


def direct_launch(
    compiled: Any, grid: Sequence[int], args: Sequence[Any]
) -> tuple[Any, tuple[Any, ...], tuple[Any, ...], bool] | None:
    """``(launch, head, between, spread)`` where the compiled kernel's launcher (Triton's
    ``CudaLauncher`` or ``HIPLauncher``) does nothing per call but hand its arguments to its C
    ``launch``: then ``launch(*head, stream, *between, kernel_args)`` (the kernel's arguments
    one tuple, or spread where ``spread``; ``head`` ends in ``grid``) launches it as
    ``compiled.run(*grid, stream, function, metadata, None, None, None, *args)`` would, without
    the launcher's Python frame (its scratch checks, two closures). None where anything
    differs from that, and every call goes through ``compiled.run``: scratch memory (global,
    profile), an instrumented kernel, a launcher of another name or layout.

    The launcher's arguments are no public API and differ between Triton releases and
    backends (3.6: spread; 3.8: a tuple; HIP: another order), so they are read by one dry
    call of a copy of the launcher whose ``launch`` records: marks in place of the grid and
    the stream must land once each, in order, the kernel's arguments last and unchanged, and
    every other value must be the function, the metadata, None, a number or one of the
    launcher's own attributes (its annotations), fixed for every call of this kernel.
    """
    run = getattr(compiled, "run", None)
    state = getattr(run, "__dict__", None)
    if (
        type(run).__name__ not in ("CudaLauncher", "HIPLauncher")
        or state is None
        or not callable(state.get("launch"))
        or state.get("global_scratch_size", 0) != 0
        or state.get("profile_scratch_size", 0) != 0
        or state.get("gsan_enabled", False)
    ):
        return None
    function, meta = compiled.function, compiled.packed_metadata
    marks = (_Mark(), _Mark(), _Mark(), _Mark())
    seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    probe: Any = object.__new__(type(run))  # a copy: the shared one is never touched
    probe.__dict__.update(state)
    probe.launch = lambda *a, **k: seen.append((a, k))
    try:
        type(run).__call__(probe, *marks, function, meta, None, None, None, *args)
    except Exception:  # noqa: BLE001 - a launcher that uses the grid or stream otherwise
        return None
    if len(seen) != 1 or seen[0][1]:
        return None
    recorded = seen[0][0]
    spread = not (recorded and type(recorded[-1]) is tuple)
    if spread:
        if len(recorded) < len(args) or any(
            a is not b for a, b in zip(recorded[len(recorded) - len(args) :], args)
        ):
            return None
        fixed = recorded[: len(recorded) - len(args)]
    else:
        kernel_args = recorded[-1]
        if len(kernel_args) != len(args) or any(a is not b for a, b in zip(kernel_args, args)):
            return None
        fixed = recorded[:-1]
    at = [i for i, value in enumerate(fixed) if type(value) is _Mark]
    if len(at) != 4 or any(fixed[i] is not mark for i, mark in zip(at, marks)):
        return None
    if at != list(range(at[0], at[0] + 4)):
        return None
    known = list(state.values())
    for value in fixed[: at[0]] + fixed[at[0] + 4 :]:
        if not (
            value is None
            or value is function
            or value is meta
            or type(value) in (bool, int)
            or any(value is mine for mine in known)
        ):
            return None
    if not any(v is function for v in fixed) or not any(v is meta for v in fixed):
        return None
    return state["launch"], (*fixed[: at[0]], *grid), fixed[at[0] + 4 :], spread


class Launcher:
    """``kernel[grid](*args, **kwargs)`` for a call that repeats with new tensors.

    Triton's ``kernel[grid](...)`` binds, specialises and hashes every argument on every call:
    ~18 us of host time on an H200 host, against ~5 us for the compiled kernel's own launcher,
    which it ends in (bench/eager_host.py). A Launcher makes its first call through
    ``kernel[grid]`` and keeps the compiled kernel that Triton picked; later calls go straight
    to that kernel's launcher. The caller keeps one Launcher per key that fixes everything
    Triton specialises on (the dtypes, shapes, strides and 16-byte alignment of the tensors,
    the integers, the constexprs: see :func:`layout_key`); only the tensors' addresses change
    between calls. A launch hook or pre-run hook (profilers), another current device, a
    changed debug setting or a Triton whose launch path is not the known one take
    ``kernel[grid]``, as before.

    ``device`` is the index of the GPU the tensors are on: Triton launches on the current
    device, so a call made while another one is current goes through ``kernel[grid]`` under a
    device guard, as torch's own ops switch device for their inputs.
    """

    __slots__ = ("compiled", "current_device", "current_stream", "debug", "device", "direct",
                 "enter", "grid", "kernel", "kwargs", "launched_on", "leave", "runtime",
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
        self.compiled: Any = None
        self.tail: tuple[Any, ...] = ()
        # None: the tensors are not on a GPU (the interpreter), or the caller does not say.
        self.device = device
        self.launched_on: Any = None  # the current device when the compiled kernel was adopted
        self.debug: Any = None
        # Set when a compiled kernel is adopted: Triton's runtime knobs, the launch hook chains
        # seen then, and the current device's and stream's getters.
        self.runtime: Any = None
        self.enter: Any = None
        self.leave: Any = None
        self.current_device: Any = None
        self.current_stream: Any = None
        # replay_launch's probe of the adopted kernel's launcher, once: (found,) when made.
        self.direct: tuple[Any, ...] = ()

    def __call__(self, *args: Any) -> None:
        compiled = self.compiled
        if compiled is not None:
            stream = self.stream()
            if stream is not None:
                compiled.run(*self.grid, stream, compiled.function, compiled.packed_metadata,
                             None, None, None, *args, *self.tail)  # fmt: skip
                return
        if self.device is not None and torch.cuda.current_device() != self.device:
            self.launch_once(*args)
            return
        result = self.kernel[self.grid](*args, **self.kwargs)
        if compiled is None and result is not None and _direct_launch_path() is not None:
            self._adopt(result, args)

    def stream(self) -> Any:
        """The stream a direct launch of the adopted kernel goes on now, or None where the
        call must go through ``kernel[grid]``: nothing adopted, another current device, a
        launch hook (a profiler), a changed debug setting, a stages hook or a pre-run hook.
        A caller that keeps ``compiled.run``'s arguments itself launches with this (the
        depthwise conv's replay); every check costs one attribute read or C call."""
        if self.compiled is None:
            return None
        runtime = self.runtime
        enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
        device = self.current_device()
        if (
            device == self.launched_on
            and (enter is None or (enter is self.enter and not enter.calls))
            and (leave is None or (leave is self.leave and not leave.calls))
            and runtime.debug == self.debug
            and getattr(runtime, "add_stages_inspection_hook", None) is None
            and not getattr(self.kernel, "pre_run_hooks", None)
        ):
            return self.current_stream(device)
        return None

    def replay_launch(
        self, args: Sequence[Any], direct: bool = True
    ) -> tuple[Any, tuple[Any, ...], tuple[Any, ...], bool]:
        """``(launch, head, between, spread)`` for a caller that keeps the adopted kernel's
        arguments itself: ``launch(*head, stream, *between, *args, *self.tail)`` (the
        arguments one tuple where not ``spread``) with :meth:`stream`'s stream launches it.
        That is the C launch where :func:`direct_launch` finds its layout (and ``direct``),
        else ``compiled.run``; ``launch`` None where nothing is adopted."""
        compiled = self.compiled
        if compiled is None:
            return None, (), (), True
        found = None
        if direct:
            # The probe's answer is a fact of the compiled kernel's launcher and the grid, not
            # of the arguments' values: one probe per Launcher.
            if not self.direct:
                self.direct = (direct_launch(compiled, self.grid, (*args, *self.tail)),)
            found = self.direct[0]
        if found is not None:
            return found  # type: ignore[no-any-return]
        between = (compiled.function, compiled.packed_metadata, None, None, None)
        return compiled.run, self.grid, between, True

    def launch_once(self, *args: Any) -> None:
        """``kernel[grid](*args, **kwargs)`` on the tensors' device, adopting nothing: for a
        launch made once (an explicit config), where adopting would cost more than it saves."""
        if self.device is not None and torch.cuda.current_device() != self.device:
            with torch.cuda.device(self.device):
                self.kernel[self.grid](*args, **self.kwargs)
        else:
            self.kernel[self.grid](*args, **self.kwargs)

    def _adopt(self, compiled: Any, args: tuple[Any, ...]) -> None:
        """Keep ``compiled`` if the parameters after the positional ``args`` all come from
        the keywords or their defaults: the launcher takes every parameter in signature order.
        (Too many arguments, or a keyword naming a positional one, never get here: the
        first call raised.)"""
        import inspect

        knobs, driver = _launch_path[0]
        fn = self.kernel.fn
        params = _parameters.get(fn)
        if params is None:
            params = list(inspect.signature(fn).parameters.values())
            _parameters[fn] = params
        tail = []
        for param in params[len(args) :]:
            if param.name in self.kwargs:
                tail.append(self.kwargs[param.name])
            elif param.default is not inspect.Parameter.empty:
                tail.append(param.default)
            else:
                return
        self.tail = tuple(tail)
        active = driver.active
        self.current_device, self.current_stream = _current_getters(active)
        self.launched_on = self.current_device()
        runtime = knobs.runtime
        self.runtime, self.debug = runtime, runtime.debug
        # Triton >= 3.5 keeps launch hooks in a HookChain, empty unless a profiler added one;
        # a chain that is not the one seen here (replaced, or a plain hook) is not known quiet.
        self.enter, self.leave = (
            chain if type(chain).__name__ == "HookChain" else None
            for chain in (runtime.launch_enter_hook, runtime.launch_exit_hook)
        )
        self.compiled = compiled
