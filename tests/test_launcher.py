"""The kernels' direct launch path (``Launcher`` in templates/rocmfix_launcher.py), on
the CPU: a stand-in kernel and launcher record what would reach the GPU, so every fallback
and the order of the launcher's arguments are checked here; tests/test_gpu.py checks the same
path against Triton's own launches on a real GPU.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import load_template

pytest.importorskip("torch")


class Compiled:
    """What Triton's ``kernel[grid](...)`` returns: a compiled kernel with its launcher."""

    def __init__(self) -> None:
        self.function = "function"
        self.packed_metadata = "metadata"
        self.calls: list[tuple[Any, ...]] = []

    def run(self, *args: Any) -> None:
        self.calls.append(args)


def _kernel_fn(
    a: Any, b: Any, out: Any, n: int, BLOCK: int, EVEN: bool, SCALE: float = 2.0
) -> None:
    """The signature of a kernel: four arguments, two constexprs, one with a default."""


class Kernel:
    """A JITFunction stand-in: ``fn``'s signature, ``kernel[grid](...)`` counted."""

    def __init__(self) -> None:
        self.fn = _kernel_fn
        self.compiled = Compiled()
        self.runs: list[tuple[Any, ...]] = []
        self.pre_run_hooks: list[Any] = []

    def __getitem__(self, grid: Any) -> Any:
        def launch(*args: Any, **kwargs: Any) -> Compiled:
            self.runs.append((grid, args, kwargs))
            return self.compiled

        return launch


class Tensor:
    def __init__(self, address: int) -> None:
        self.address = address

    def data_ptr(self) -> int:
        return self.address


class HookChain:
    def __init__(self) -> None:
        self.calls: list[Any] = []


@pytest.fixture
def kc() -> Iterator[types.ModuleType]:
    module = load_template("rocmfix_launcher", interpret=True)
    runtime = types.SimpleNamespace(
        launch_enter_hook=HookChain(), launch_exit_hook=HookChain(), debug=False
    )
    driver = types.SimpleNamespace(
        active=types.SimpleNamespace(
            device=0,
            get_current_device=lambda: driver.active.device,
            get_current_stream=lambda device: f"stream{device}",
        )
    )
    saved = list(module._launch_path)
    module._launch_path[:] = [(types.SimpleNamespace(runtime=runtime), driver)]
    try:
        yield module
    finally:
        module._launch_path[:] = saved


def _args(address: int = 1024) -> tuple[Any, ...]:
    return (Tensor(address), Tensor(2048), Tensor(address + 4096), 7)


def test_the_first_call_goes_through_triton_and_the_rest_straight_to_its_launcher(
    kc: types.ModuleType,
) -> None:
    kernel = Kernel()
    launcher = kc.Launcher(kernel, (5,), {"BLOCK": 64, "EVEN": True, "num_warps": 4})
    first, second = _args(), _args(4096)
    launcher(*first)
    launcher(*second)
    assert len(kernel.runs) == 1 and kernel.runs[0][1] == first
    # The grid padded to three, the stream, the kernel, no launch metadata or hooks, then
    # every parameter in signature order: positional, constexprs, defaults (not num_warps).
    assert kernel.compiled.calls == [
        (5, 1, 1, "stream0", "function", "metadata", None, None, None, *second, 64, True, 2.0)
    ]


@pytest.mark.parametrize(
    "change",
    ["enter-hook", "exit-hook", "replaced-chain", "debug", "device", "pre-run-hook",
     "unknown-triton"],
)  # fmt: skip
def test_anything_triton_would_see_otherwise_goes_through_triton(
    kc: types.ModuleType, change: str
) -> None:
    kernel = Kernel()
    launcher = kc.Launcher(kernel, (5,), {"BLOCK": 64, "EVEN": True})
    launcher(*_args())
    knobs, driver = kc._launch_path[0]
    args = _args()
    if change == "enter-hook":
        knobs.runtime.launch_enter_hook.calls.append(print)
    elif change == "exit-hook":
        knobs.runtime.launch_exit_hook = print
    elif change == "replaced-chain":  # empty, but not the chain seen: not known quiet
        knobs.runtime.launch_enter_hook = HookChain()
    elif change == "debug":
        knobs.runtime.debug = True
    elif change == "device":
        driver.active.device = 1
    elif change == "pre-run-hook":
        kernel.pre_run_hooks.append(print)
    launcher(*args)
    if change == "unknown-triton":
        fresh = Kernel()
        kc._launch_path[:] = [None]
        other = kc.Launcher(fresh, (5,), {"BLOCK": 64, "EVEN": True})
        other(*args)
        other(*args)
        assert len(fresh.runs) == 2 and fresh.compiled.calls == []
        return
    assert len(kernel.runs) == 2 and kernel.compiled.calls == []


def test_stream_says_when_a_caller_may_launch_the_adopted_kernel_itself(
    kc: types.ModuleType,
) -> None:
    kernel = Kernel()
    launcher = kc.Launcher(kernel, (5,), {"BLOCK": 64, "EVEN": True})
    assert launcher.stream() is None  # nothing adopted yet
    launcher(*_args())
    assert launcher.stream() == "stream0"
    kernel.pre_run_hooks.append(print)
    assert launcher.stream() is None


def test_the_current_device_is_torchs_c_call_where_triton_asks_torch(
    kc: types.ModuleType,
) -> None:
    """Triton under torch asks ``torch.cuda.current_device`` (a lazy-init check, then the C
    call); an adopted kernel has run, so the Launcher asks the C call alone. Any other
    driver's getters are kept as they are."""
    torch = pytest.importorskip("torch")
    active = types.SimpleNamespace(
        get_current_device=torch.cuda.current_device, get_current_stream=print
    )
    assert kc._current_getters(active) == (torch._C._cuda_getDevice, print)
    other = types.SimpleNamespace(get_current_device=len, get_current_stream=print)
    assert kc._current_getters(other) == (len, print)


def test_parameters_passed_by_keyword_reach_the_launcher_in_signature_order(
    kc: types.ModuleType,
) -> None:
    kernel = Kernel()
    launcher = kc.Launcher(kernel, (5, 2), {"EVEN": False, "n": 9, "BLOCK": 32})
    args = _args()[:3]
    launcher(*args)
    launcher(*args)
    assert kernel.compiled.calls == [
        (5, 2, 1, "stream0", "function", "metadata", None, None, None, *args, 9, 32, False, 2.0)
    ]


def test_a_missing_constexpr_is_never_adopted(kc: types.ModuleType) -> None:
    kernel = Kernel()
    launcher = kc.Launcher(kernel, (5,), {"BLOCK": 64})  # EVEN has no default
    launcher(*_args())
    assert launcher.compiled is None


def test_this_tritons_launch_path_is_the_known_one() -> None:
    """The dev and CI Triton (the test extra pins torch, and with it Triton) ends
    ``JITFunction.run`` in the call Launcher makes: a Triton that changes it is noticed here,
    not only on a GPU."""
    triton = pytest.importorskip("triton")
    module = load_template("rocmfix_launcher", interpret=False)
    saved = list(module._launch_path)
    module._launch_path[:] = []
    try:
        assert module._direct_launch_path() is not None, triton.__version__
    finally:
        module._launch_path[:] = saved


def test_a_call_from_another_current_device_launches_on_the_tensors_device(
    kc: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Triton launches on the current device; torch's ops follow their inputs. A Launcher
    for tensors on GPU 1 called while GPU 0 is current goes through ``kernel[grid]`` inside a
    device guard, and adopts nothing there."""
    import contextlib

    torch = pytest.importorskip("torch")
    _knobs, driver = kc._launch_path[0]
    entered: list[int] = []

    @contextlib.contextmanager
    def guard(index: int) -> Iterator[None]:
        entered.append(index)
        saved, driver.active.device = driver.active.device, index
        try:
            yield
        finally:
            driver.active.device = saved

    monkeypatch.setattr(torch.cuda, "current_device", lambda: driver.active.device)
    monkeypatch.setattr(torch.cuda, "device", guard)
    kernel = Kernel()
    launcher = kc.Launcher(kernel, (5,), {"BLOCK": 64, "EVEN": True}, device=1)
    launcher(*_args())
    assert entered == [1] and len(kernel.runs) == 1 and launcher.compiled is None
    driver.active.device = 1
    launcher(*_args())  # adopted here, where the tensors are
    launcher(*_args())
    assert len(kernel.runs) == 2 and len(kernel.compiled.calls) == 1
    driver.active.device = 0
    launcher(*_args())
    assert entered == [1, 1] and len(kernel.runs) == 3 and len(kernel.compiled.calls) == 1
    launcher.launch_once(*_args())
    assert entered == [1, 1, 1] and len(kernel.runs) == 4


# Stand-ins for Triton's compiled-kernel launchers, written here after the layouts the
# releases use (read from Triton 3.3, 3.6 and 3.8's drivers): each __call__ hands its
# arguments to ``self.launch``, which records what the C launch would get.
class CudaLauncher:
    """3.8's NVIDIA layout: grid, stream, function first, the kernel's arguments one tuple."""

    def __init__(self, scratch: int = 0, gsan: bool = False) -> None:
        self.launch_cooperative_grid, self.launch_pdl = False, False
        self.global_scratch_size = scratch
        self.profile_scratch_size = 0
        self.gsan_enabled = gsan
        self.arg_annotations, self.kernel_signature = ["ann"], b"sig"
        self.calls: list[tuple[Any, ...]] = []
        self.launch = lambda *args: self.calls.append(args)

    def __call__(self, gx: Any, gy: Any, gz: Any, stream: Any, function: Any, meta: Any,
                 launch_meta: Any, enter: Any, leave: Any, *args: Any) -> None:  # fmt: skip
        scratch = gx * gy * gz if self.global_scratch_size else None
        self.launch(gx, gy, gz, stream, function, self.launch_cooperative_grid,
                    self.launch_pdl, meta, launch_meta, enter, leave, scratch, None,
                    self.arg_annotations, self.kernel_signature, args)  # fmt: skip


class HIPLauncher(CudaLauncher):
    """AMD's layout: the cooperative flag before the grid, the warp size after the hooks."""

    def __call__(self, gx: Any, gy: Any, gz: Any, stream: Any, function: Any, meta: Any,
                 launch_meta: Any, enter: Any, leave: Any, *args: Any) -> None:  # fmt: skip
        scratch = gx * gy * gz if self.global_scratch_size else None
        self.launch(self.launch_cooperative_grid, gx, gy, gz, stream, function, scratch, None,
                    meta, launch_meta, enter, leave, 64, self.arg_annotations,
                    self.kernel_signature, args)  # fmt: skip


class SpreadLauncher(CudaLauncher):
    """3.6's layout: the kernel's arguments spread after the hooks."""

    def __call__(self, gx: Any, gy: Any, gz: Any, stream: Any, function: Any, *args: Any) -> None:
        self.launch(gx, gy, gz, stream, function, self.launch_cooperative_grid, None, *args)


SpreadLauncher.__name__ = "CudaLauncher"


class LaunchedCompiled(Compiled):
    def __init__(self, run: Any) -> None:
        super().__init__()
        self.run = run  # type: ignore[method-assign]


@pytest.mark.parametrize("make", [CudaLauncher, HIPLauncher, SpreadLauncher])
def test_the_c_launch_is_called_as_the_launcher_would_call_it(
    kc: types.ModuleType, make: Any
) -> None:
    """Where the launcher only hands its arguments on, a direct call of its ``launch`` with
    the layout read by the probe gets exactly what a call of the launcher gives it."""
    run = make()
    compiled = LaunchedCompiled(run)
    args = (*_args(), 64, True, 2.0)
    found = kc.direct_launch(compiled, (5, 1, 1), args)
    assert found is not None and run.calls == []  # the probe launched nothing
    launch, head, between, spread = found
    assert launch is run.launch
    later = (*_args(8192), 64, True, 2.0)
    run((5), 1, 1, "stream3", "function", "metadata", None, None, None, *later)
    want = run.calls.pop()
    if spread:
        launch(*head, "stream3", *between, *later)
    else:
        launch(*head, "stream3", *between, later)
    assert run.calls == [want]


class Extra(CudaLauncher):
    def __call__(self, *args: Any) -> None:
        super().__call__(*args)
        self.launch(*self.calls.pop())  # twice


class Fresh(CudaLauncher):
    def __call__(self, gx: Any, gy: Any, gz: Any, stream: Any, function: Any, meta: Any,
                 *args: Any) -> None:  # fmt: skip
        self.launch(gx, gy, gz, stream, function, object(), meta, args[3:])  # a per-call value


class Reordered(CudaLauncher):
    def __call__(self, gx: Any, gy: Any, gz: Any, stream: Any, function: Any, meta: Any,
                 *args: Any) -> None:  # fmt: skip
        self.launch(stream, gx, gy, gz, function, meta, args[3:])


class Converted(CudaLauncher):
    def __call__(self, gx: Any, gy: Any, gz: Any, stream: Any, function: Any, meta: Any,
                 *args: Any) -> None:  # fmt: skip
        self.launch(gx, gy, gz, stream, function, meta, tuple(map(str, args[3:])))


for _cls in (Extra, Fresh, Reordered, Converted):
    _cls.__name__ = "CudaLauncher"


@pytest.mark.parametrize(
    "make",
    [lambda: CudaLauncher(scratch=128), lambda: HIPLauncher(scratch=128),
     lambda: CudaLauncher(gsan=True), Extra, Fresh, Reordered, Converted,
     lambda: type("XPULauncher", (CudaLauncher,), {})(), lambda: Compiled().run],
    ids=["scratch", "hip-scratch", "gsan", "two-launches", "per-call-value", "reordered",
         "converted-args", "other-launcher", "not-a-launcher"],
)  # fmt: skip
def test_a_launcher_of_any_other_structure_is_called_as_triton_calls_it(
    kc: types.ModuleType, make: Any
) -> None:
    """Anything but a launcher that only hands on its arguments (scratch memory, an
    instrumented kernel, another layout or name) gets no direct launch, and a caller's
    replay calls ``compiled.run`` with Triton's arguments."""
    run = make()
    compiled = LaunchedCompiled(run)
    args = (*_args(), 64, True, 2.0)
    assert kc.direct_launch(compiled, (5, 1, 1), args) is None
    assert getattr(run, "calls", []) == []
    kernel = Kernel()
    kernel.compiled = compiled
    launcher = kc.Launcher(kernel, (5,), {"BLOCK": 64, "EVEN": True})
    launcher(*_args())
    launch, head, between, spread = launcher.replay_launch(_args())
    assert launch is run and spread
    assert (*head, "s", *between) == (5, 1, 1, "s", "function", "metadata", None, None, None)


@pytest.mark.parametrize("backend", ["nvidia", "amd"])
def test_this_tritons_own_launchers_are_read_and_called_as_they_call_their_launch(
    kc: types.ModuleType, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The installed Triton's ``CudaLauncher`` and ``HIPLauncher`` (AMD's cannot run here:
    each is built without its driver, ``launch`` recording): the probe reads their layout,
    and the direct call gives ``launch`` exactly what the launcher's own call gives it."""
    pytest.importorskip("triton")
    module = pytest.importorskip(f"triton.backends.{backend}.driver")
    from triton.runtime.driver import driver as config

    cls = module.CudaLauncher if backend == "nvidia" else module.HIPLauncher
    monkeypatch.setattr(config, "_active", types.SimpleNamespace(), raising=False)
    run = object.__new__(cls)
    calls: list[tuple[Any, ...]] = []
    run.__dict__.update(
        arg_annotations=["annotations"], kernel_signature=b"signature", num_ctas=1,
        launch=lambda *a: calls.append(a), global_scratch_size=0, global_scratch_align=1,
        profile_scratch_size=0, profile_scratch_align=1, launch_cooperative_grid=False,
        launch_pdl=False, gsan_enabled=False, warp_size=64,
    )  # fmt: skip
    compiled = LaunchedCompiled(run)
    args = (*_args(), 64, True, 2.0)
    found = kc.direct_launch(compiled, (5, 1, 1), args)
    assert found is not None and calls == []
    launch, head, between, spread = found
    later = (*_args(8192), 64, True, 2.0)
    run(5, 1, 1, "stream3", "function", "metadata", None, None, None, *later)
    want = calls.pop()
    launch(*head, "stream3", *between, *later) if spread else launch(
        *head, "stream3", *between, later
    )
    assert calls == [want]
    # With scratch memory the launcher allocates per call: Triton's run, as before.
    run.global_scratch_size = 256
    assert kc.direct_launch(compiled, (5, 1, 1), args) is None
