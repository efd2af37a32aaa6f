"""The kernels' repeat launches (``Launcher`` in templates/rocmfix_triton.py), on the CPU: a
stand-in kernel records what would reach the GPU through Triton's public interfaces
(``kernel[grid]``, ``kernel.warmup``, the compiled kernel's ``[grid]`` runner), so every
fallback and the order of the runner's arguments are checked here; tests/test_gpu.py checks
the same path against Triton's own launches on a real GPU.
"""

from __future__ import annotations

import contextlib
import re
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import load_template

torch = pytest.importorskip("torch")


class Compiled:
    """What ``kernel.warmup`` returns: a compiled kernel whose ``[grid]`` runner records."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.reject = False

    def __getitem__(self, grid: Any) -> Any:
        def runner(*args: Any, stream: Any = None) -> None:
            if self.reject:
                raise TypeError("function takes exactly 9 arguments")
            self.calls.append((grid, args, stream))

        return runner


class Kernel:
    """A JITFunction stand-in: four arguments and three constexprs, ``kernel[grid]`` counted."""

    def __init__(self) -> None:
        self.arg_names = ["a", "b", "out", "n", "BLOCK", "EVEN", "SCALE"]
        self.compiled = Compiled()
        self.runs: list[tuple[Any, ...]] = []
        self.warmups = 0
        self.pre_run_hooks: list[Any] = []

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: self.runs.append((grid, args, kwargs))

    def warmup(self, *args: Any, grid: Any, **kwargs: Any) -> Compiled:
        self.warmups += 1
        return self.compiled


KWARGS = {"BLOCK": 16, "EVEN": True, "SCALE": 2.0, "num_warps": 4}


@pytest.fixture
def rl() -> Iterator[types.ModuleType]:
    """The launcher module, with torch's current device a settable 0, its device guard
    recorded and each device's current stream named (the CPU has none of them)."""
    module = load_template("rocmfix_triton")
    current = [0]
    guards: list[int] = []

    @contextlib.contextmanager
    def guard(index: int) -> Iterator[None]:
        guards.append(index)
        saved, current[0] = current[0], index
        try:
            yield
        finally:
            current[0] = saved

    saved = torch.cuda.current_device, torch.cuda.device, list(module._public_only)
    torch.cuda.current_device, torch.cuda.device = lambda: current[0], guard
    module.current_stream = lambda: lambda device: f"stream of {device}"
    module._public_only.clear()
    module.current, module.guards = current, guards  # for the tests
    try:
        yield module
    finally:
        torch.cuda.current_device, torch.cuda.device = saved[0], saved[1]
        module._public_only[:] = saved[2]


def test_the_first_call_goes_through_triton_and_the_rest_through_the_compiled_runner(
    rl: types.ModuleType,
) -> None:
    kernel = Kernel()
    launcher = rl.Launcher(kernel, (3,), KWARGS, device=0)
    launcher("a0", "b0", "o0", 7)
    launcher("a1", "b1", "o1", 7)
    launcher("a2", "b2", "o2", 7)
    assert kernel.runs == [((3, 1, 1), ("a0", "b0", "o0", 7), KWARGS)]
    assert kernel.warmups == 1
    # Every parameter in the kernel's order, the constexprs included; launch options are not
    # parameters (the compiled kernel has them). The stream: the current one of the device.
    tail = (16, True, 2.0)
    assert kernel.compiled.calls == [
        ((3, 1, 1), ("a1", "b1", "o1", 7, *tail), "stream of 0"),
        ((3, 1, 1), ("a2", "b2", "o2", 7, *tail), "stream of 0"),
    ]


def test_a_runner_that_rejects_the_arguments_sends_every_launch_through_triton_for_good(
    rl: types.ModuleType,
) -> None:
    """A Triton whose runner takes its arguments otherwise raises TypeError before it
    launches: that call, and every later one of every Launcher, goes through
    ``kernel[grid]``, and nothing is adopted again."""
    kernel = Kernel()
    launcher = rl.Launcher(kernel, (3,), KWARGS, device=0)
    launcher("a0", "b0", "o0", 7)
    kernel.compiled.reject = True
    launcher("a1", "b1", "o1", 7)
    assert [run[1][0] for run in kernel.runs] == ["a0", "a1"]
    kernel.compiled.reject = False
    launcher("a2", "b2", "o2", 7)
    other = Kernel()
    second = rl.Launcher(other, (3,), KWARGS, device=0)
    second("a", "b", "o", 7)
    second("a", "b", "o", 7)
    assert len(kernel.runs) == 3 and kernel.compiled.calls == []
    assert len(other.runs) == 2 and other.warmups == 0


def test_a_missing_constexpr_an_interpreted_kernel_or_a_cpu_call_is_never_adopted(
    rl: types.ModuleType,
) -> None:
    """A parameter the keywords do not give (a default Launcher cannot see), the CPU
    interpreter's kernels and CPU tensors (no device) launch through ``kernel[grid]``."""
    missing = Kernel()
    rl.Launcher(missing, (1,), {"BLOCK": 16, "EVEN": True}, device=0)("a", "b", "o", 1)

    class InterpretedFunction(Kernel):
        pass

    interpreted = InterpretedFunction()
    rl.Launcher(interpreted, (1,), KWARGS, device=0)("a", "b", "o", 1)
    cpu = Kernel()
    rl.Launcher(cpu, (1,), KWARGS)("a", "b", "o", 1)
    for kernel in (missing, interpreted, cpu):
        assert kernel.warmups == 0, type(kernel).__name__


def test_a_pre_run_hook_sends_the_launch_through_triton(rl: types.ModuleType) -> None:
    kernel = Kernel()
    launcher = rl.Launcher(kernel, (2,), KWARGS, device=0)
    launcher("a0", "b0", "o0", 7)
    kernel.pre_run_hooks.append(lambda *a, **k: None)
    launcher("a1", "b1", "o1", 7)
    assert len(kernel.runs) == 2 and kernel.compiled.calls == []


def test_a_call_from_another_current_device_launches_on_the_tensors_device(
    rl: types.ModuleType,
) -> None:
    """Triton launches on the current device; torch's ops follow their inputs. A call made
    while another GPU is current goes through ``kernel[grid]`` under a guard of the tensors'
    device, never through the runner adopted on theirs."""
    kernel = Kernel()
    launcher = rl.Launcher(kernel, (2,), KWARGS, device=1)
    launcher("a0", "b0", "o0", 7)  # adopted under the guard too
    assert rl.guards == [1, 1] and kernel.warmups == 1
    launcher("a1", "b1", "o1", 7)
    assert len(kernel.runs) == 2 and kernel.compiled.calls == []
    rl.current[0] = 1
    launcher("a2", "b2", "o2", 7)
    assert len(kernel.runs) == 2 and len(kernel.compiled.calls) == 1


def test_no_template_reads_tritons_source_or_its_launcher() -> None:
    """Issue 40: no template reads Triton's source text, its JITFunction internals or its
    private launchers."""
    banned = re.compile(r"JITFunction|CudaLauncher|HIPLauncher|inspect\.getsource")
    templates = Path(__file__).resolve().parents[1] / "templates"
    found = [
        f"{path.name}:{number}"
        for path in sorted(templates.glob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if banned.search(line)
    ]
    assert found == []


def test_a_full_plan_cache_forgets_the_key_stored_first() -> None:
    """``BoundedCache`` (every entry's plans and folds) is read by ``dict.get``; beyond its
    size it forgets the entry stored first, and a key stored again is the newest."""
    ks = load_template("rocmfix_kernel_support")
    cache = ks.BoundedCache(2)
    for key, value in (("a", 1), ("b", 2), ("a", 3), ("c", 4)):
        cache.put(key, value)
    assert cache.get("b") is None and len(cache) == 2
    assert list(cache.items()) == [("a", 3), ("c", 4)] and list(cache.values()) == [3, 4]
    cache.clear()
    assert len(cache) == 0 and cache.get("a") is None
