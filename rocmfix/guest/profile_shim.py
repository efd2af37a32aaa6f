"""The ``sitecustomize`` that ``rocmfix profile`` puts first on the command's PYTHONPATH.

rocmfix copies this file, as ``sitecustomize.py``, into a folder of its own (mode 0700, outside
the cwd) and names that folder in ``ROCMFIX_PROFILE_DIR``. Every Python process the command
starts then runs it at startup, children included, and nothing is written into the target
environment. It must never change what the command does:

* the environment's own ``sitecustomize`` still runs (imported again with this folder hidden);
  ``usercustomize`` is imported by ``site`` itself afterwards, as always;
* nothing happens until the process imports torch (a finder on ``sys.meta_path`` notices);
  a process that never does writes nothing;
* each process's events go to the folder when it ends: ``atexit``, multiprocessing's own exit
  path (fork and forkserver children leave through ``os._exit``), and SIGTERM;
* every failure here is swallowed: profiling is lost, the command is not.

Python 3.9+, standard library and torch only.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import sys
import threading
import time
import warnings
from typing import Any

_DIR = os.environ.get("ROCMFIX_PROFILE_DIR", "")
_HERE = os.path.dirname(os.path.abspath(__file__))
_PREFIX = "rocmfix.module:"
# The line that called a conv/matmul-family function, from a TorchFunctionMode active only
# inside profiled model calls (cheap: one frame walk per such call, no Python-stack tracer).
_SRC = "rocmfix.src:"
_state: dict[str, Any] = dict(prof=None, done=False, pid=None, t0=0.0, calls=0, set_log=False)
# Profilers stopped around a fork (a profiler running across a fork deadlocks the child), each
# with its start time; written out together at exit.
_finished: list[Any] = []
_window: dict[str, Any] = {}
_tls = threading.local()


def _chain() -> None:
    """Run the environment's own sitecustomize, with this folder out of sys.path."""
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    me = sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # type: ignore[import-not-found]  # noqa: F401 - the env's own
    except ImportError as exc:
        if exc.name != "sitecustomize":
            _note(f"the environment's sitecustomize failed: {exc!r}")
        if me is not None:
            sys.modules["sitecustomize"] = me
    except Exception as exc:  # noqa: BLE001 - site.py reports these the same way
        _note(f"the environment's sitecustomize failed: {exc!r}")


def _note(message: str) -> None:
    path = os.path.join(_DIR, f"notes-{os.getpid()}.txt")
    with contextlib.suppress(Exception), open(path, "a") as handle:
        handle.write(message + "\n")


class _TorchFinder:
    """Arms the profiler right after ``import torch`` has finished, in whatever finder found it."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            return None
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            with contextlib.suppress(Exception):
                loader.exec_module = original
            _arm(module)

        with contextlib.suppress(Exception):  # a loader that takes no attribute: not armed
            loader.exec_module = exec_module
        return spec


def _mark(kind: str) -> None:
    """An empty ``shim-PID`` or ``torch-PID``: what the report can say when no op was recorded."""
    with contextlib.suppress(Exception):
        os.close(os.open(os.path.join(_DIR, f"{kind}-{os.getpid()}"), os.O_CREAT | os.O_WRONLY))


def _arm(torch: Any) -> None:
    _mark("torch")
    try:
        _state["pid"] = os.getpid()
        _state["t0"] = time.time()
        # The profiler starts at the first model call (_window_tick), not here: with the Python
        # stack on, building a model (YAML parsing, thousands of module constructors) would
        # cost gigabytes of events that say nothing about the run.
        _hooks(torch)
        atexit.register(_dump)
        _mp_exit()
        main = threading.current_thread() is threading.main_thread()
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL and main:
            signal.signal(signal.SIGTERM, _on_term)
        os.register_at_fork(
            before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork
        )
    except Exception as exc:  # noqa: BLE001
        _note(f"profiling not armed: {exc!r}")


def _start() -> None:
    import torch

    if _state["prof"] is not None or _state["done"]:
        return
    activities = list(torch.profiler.supported_activities())  # type: ignore[no-untyped-call]
    # No with_stack (gigabytes of events). torch's warning about this profiler is not the command's.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events")
        prof = torch.profiler.profile(activities=activities, record_shapes=True)
        prof.start()
    _state["prof"] = prof
    _state["started"] = time.time()
    if _state["set_log"]:
        os.environ.pop("KINETO_LOG_LEVEL", None)


def _hooks(torch: Any) -> None:
    """Name each module call in the trace (``rocmfix.module:backbone.3.m``), and hold the
    profiled window to the options: one call is one forward of an outermost module."""
    from torch.nn.modules import module as nn_module

    names, roots = {}, set()
    mode_class = _source_mode(torch)

    def pre(mod: Any, _args: Any) -> None:
        stack = getattr(_tls, "stack", None)
        if stack is None:
            stack = _tls.stack = []
        if not stack:
            if _state.pop("pending", False):
                _restart()
            _window_tick()
            if id(mod) not in roots:
                # A new outermost module: the model itself is usually called after its parts
                # were (stride probes at build time), so its names win.
                roots.add(id(mod))
                for qual, sub in mod.named_modules():
                    names[id(sub)] = qual
            _enter_mode(torch, mode_class, mod)
        qual = names.get(id(mod))
        cls = type(mod).__name__
        if qual:
            path = f"{qual} ({cls})"
        elif qual is None and stack:
            path = f"{stack[-1][0]}/{cls}"
        else:
            path = cls
        rf = None
        if _state["prof"] is not None:
            try:
                code = getattr(type(mod).forward, "__code__", None)
                where = (
                    f"|{code.co_filename}:{code.co_firstlineno} {cls}.forward"
                    if code is not None
                    else ""
                )
                rf = torch.autograd.profiler.record_function(_PREFIX + path + where)
                rf.__enter__()
            except Exception:  # noqa: BLE001
                rf = None
        stack.append((path, rf, mod))

    def post(mod: Any, _args: Any, _out: Any) -> None:
        stack = getattr(_tls, "stack", None)
        while stack:
            _path, rf, owner = stack.pop()
            if rf is not None:
                with contextlib.suppress(Exception):
                    rf.__exit__(None, None, None)
            if owner is mod:
                break
        if not stack:
            _exit_mode()
            _window_end()

    nn_module.register_module_forward_pre_hook(pre)
    try:
        # Called when a forward raises too: the stack of module calls (and the source mode)
        # stays right after an exception the user's code catches.
        nn_module.register_module_forward_hook(post, always_call=True)
    except TypeError:  # torch before 2.1
        nn_module.register_module_forward_hook(post)


def _source_mode(torch: Any) -> Any:
    """A TorchFunctionMode that wraps each conv/matmul-family call in a record_function
    naming the first frame outside torch that issued it (``file:line func``)."""
    try:
        from torch.overrides import TorchFunctionMode
    except ImportError:
        return None
    fn = torch.nn.functional
    watched = set()
    for owner, names in (
        (fn, ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
              "conv_transpose3d", "linear", "scaled_dot_product_attention")),
        (torch, ("matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "conv1d", "conv2d",
                 "conv3d", "convolution")),
        (torch.Tensor, ("matmul", "__matmul__", "__rmatmul__", "mm", "bmm")),
    ):  # fmt: skip
        for name in names:
            with contextlib.suppress(Exception):
                watched.add(getattr(owner, name))
    skip = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep, os.path.abspath(__file__))

    class SourceMode(TorchFunctionMode):
        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            try:
                hit = func in watched and _state["prof"] is not None
            except TypeError:  # an unhashable callable
                hit = False
            if not hit:
                return func(*args, **kwargs)
            frame: Any = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith(skip):
                frame = frame.f_back
            if frame is None:
                return func(*args, **kwargs)
            code = frame.f_code
            label = f"{_SRC}{code.co_filename}:{frame.f_lineno} " + getattr(
                code, "co_qualname", code.co_name
            )
            with torch.autograd.profiler.record_function(label):
                return func(*args, **kwargs)

    return SourceMode


def _enter_mode(torch: Any, mode_class: Any, root: Any) -> None:
    """Enter the source mode for one outermost model call, while the profiler runs. Not under
    torch.compile: a mode there costs graph breaks, and compiled graphs issue fused kernels."""
    _exit_mode()  # one left behind by a forward that raised
    if mode_class is None or _state["prof"] is None or getattr(_tls, "mode", None) is not None:
        return
    with contextlib.suppress(Exception):
        if type(root).__name__ == "OptimizedModule" or torch.compiler.is_compiling():
            return
    try:
        mode = mode_class()
        mode.__enter__()
        _tls.mode = mode
    except Exception as exc:  # noqa: BLE001
        _note(f"source lines not recorded: {exc!r}")


def _exit_mode() -> None:
    mode = getattr(_tls, "mode", None)
    if mode is None:
        return
    # Exiting pops the top of the mode stack: only when that is ours. A forward that raised
    # may have left it under a mode the user entered since; it stays (and still works) until
    # it is on top again.
    top = True
    with contextlib.suppress(Exception):
        from torch import _C

        depth = _C._len_torch_function_stack()
        top = bool(depth) and _C._get_function_stack_at(depth - 1) is mode
    if not top:
        return
    _tls.mode = None
    with contextlib.suppress(Exception):
        mode.__exit__(None, None, None)


def _window_tick() -> None:
    _state["calls"] += 1
    if _state["prof"] is None and not _state["done"]:
        elapsed = time.time() - _state["t0"]
        if _state["calls"] > _window.get("skip_calls", 0) and elapsed >= _window.get("skip_s", 0):
            _state["first_call"] = _state["calls"]
            _start()


def _window_end() -> None:
    if _state["prof"] is None:
        return
    calls = _window.get("calls")
    seconds = _window.get("seconds")
    done = calls and _state["calls"] - _state.get("first_call", 1) + 1 >= calls
    if seconds and time.time() - _state["started"] >= seconds:
        done = True
    if done:
        _dump()


def _mp_exit() -> None:
    """fork and forkserver children end in os._exit: multiprocessing's finalizers are their
    last Python code, so the dump rides on one (registered again in each child)."""
    mp_util: Any = sys.modules.get("multiprocessing.util")
    if mp_util is None:
        import multiprocessing.util as mp_util
    mp_util.Finalize(None, _dump, exitpriority=-100)
    mp_util.register_after_fork(_HOLDER, lambda _obj: _child_finalizer())


class _Holder:
    """Something multiprocessing's after-fork registry can hold a weak reference to."""


_HOLDER = _Holder()


def _child_finalizer() -> None:
    import multiprocessing.util as mp_util

    mp_util.Finalize(None, _dump, exitpriority=-100)
    if _state.pop("pending", False):
        _restart()


def _before_fork() -> None:
    """A profiler running across a fork deadlocks the child's first op: stop it here, and
    start a fresh one on each side."""
    prof, _state["prof"] = _state["prof"], None
    _state["forked_from"] = prof is not None
    if prof is not None:
        try:
            prof.stop()
            _finished.append(prof)
        except Exception as exc:  # noqa: BLE001
            _note(f"profiler not stopped at fork: {exc!r}")


def _after_fork_parent() -> None:
    if _state.pop("forked_from", False):
        _restart()


def _after_fork() -> None:
    # Starting a profiler inside the at-fork hook hangs the child: it starts at the child's
    # first Python step instead (multiprocessing's after-fork hooks, or its first module call).
    _state["pid"] = os.getpid()
    _state["done"] = False
    del _finished[:]
    _state["pending"] = _state.pop("forked_from", False)


def _restart() -> None:
    try:
        _start()
    except Exception as exc:  # noqa: BLE001
        _note(f"profiler not restarted after fork: {exc!r}")


def _on_term(signum: int, _frame: Any) -> None:
    _dump()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _dump() -> None:
    if _state["done"] or _state["pid"] != os.getpid():
        return
    _state["done"] = True
    prof, _state["prof"] = _state["prof"], None
    try:
        if prof is not None:
            prof.stop()
            _finished.append(prof)
        _write(_finished)  # with no profiler too: torch imported, no model call (or none kept)
    except Exception as exc:  # noqa: BLE001
        _note(f"profile not written: {exc!r}")


def _backend() -> dict[str, Any]:
    import torch

    out = {}
    for key, get in (
        ("cudnn.enabled", lambda: torch.backends.cudnn.enabled),
        ("cudnn.benchmark", lambda: torch.backends.cudnn.benchmark),
        ("cudnn.deterministic", lambda: torch.backends.cudnn.deterministic),
        ("cudnn.allow_tf32", lambda: torch.backends.cudnn.allow_tf32),
        ("matmul.allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32),
        ("float32_matmul_precision", torch.get_float32_matmul_precision),
        ("num_threads", torch.get_num_threads),
    ):
        with contextlib.suppress(Exception):
            out[key] = get()
    return out


_NOT_OPS = ("autograd", "profiler", "cuda", "c10d_profiler")


def _is_op(name: str) -> bool:
    """An operator's event (``aten::conv2d``, a custom op's ``ns::name``), not an annotation."""
    space, sep, rest = name.partition("::")
    ok = bool(sep) and space.isidentifier() and space not in _NOT_OPS
    return ok and rest.replace(".", "_").isidentifier()


def _is_torch_file(path: str) -> bool:
    norm = path.replace("\\", "/")
    return norm.startswith("torch/") or "/site-packages/torch/" in norm or "/torch/nn/" in norm


def _dtypes_by_id(prof: Any) -> dict[int, list[Any]]:
    """Input dtypes by event id, from the profiler's raw events: torch before 2.12 keeps them
    there and not on its FunctionEvent (whose id is the raw event's correlation id)."""
    out = {}
    with contextlib.suppress(Exception):
        for raw in prof.profiler.kineto_results.events():
            out[raw.correlation_id()] = list(raw.dtypes())
    return out


def _op_record(event: Any, dtypes_by_id: dict[int, list[Any]] | None = None) -> Any:
    """One top-level op: everything the report and the replay need, or None."""
    module, source, line = "", None, None
    parent = event.cpu_parent
    while parent is not None:
        name = parent.name
        if line is None and name.startswith(_SRC):
            place, _, func = name[len(_SRC) :].partition(" ")
            path, _, number = place.rpartition(":")
            if number.isdigit():
                line = (path, int(number), func)
        elif name.startswith(_PREFIX):
            label, _, where = name[len(_PREFIX) :].partition("|")
            module = module or label
            if source is None and where:
                place, _, func = where.partition(" ")
                path, _, line_no = place.rpartition(":")
                if line_no.isdigit() and not _is_torch_file(path):
                    source = (path, int(line_no), func)
        elif _is_op(name):
            return None  # not top level: its time is counted in its caller
        parent = parent.cpu_parent
    # The line that issued the call where the source mode saw it, else the def line of the
    # forward of the innermost module outside torch.
    source = line or source
    kernels: dict[str, float] = {}
    selves: dict[str, float] = {}

    def walk(node: Any, depth: int) -> None:
        for kernel in getattr(node, "kernels", ()) or ():
            kernels[kernel.name] = kernels.get(kernel.name, 0.0) + float(kernel.duration)
        if depth:
            selves[node.name] = selves.get(node.name, 0.0) + float(node.self_cpu_time_total)
        for child in node.cpu_children:
            if _is_op(child.name):
                walk(child, depth + 1)

    walk(event, 0)
    # On CPU the callee that spends the time names the implementation (mkldnn_convolution,
    # slow_conv_dilated2d), as a kernel name does on a GPU.
    leaves = sorted(selves, key=lambda n: -selves[n])[:3]
    concrete = []
    for value in list(getattr(event, "concrete_inputs", None) or []):
        concrete.append(value if isinstance(value, (int, float, bool, list, str)) else None)
    if event.name in ("aten::conv1d", "aten::conv2d", "aten::conv3d") and concrete[4:5] == [None]:
        concrete[4] = _string_padding(event)
    strides = getattr(event, "structured_input_strides", None) or []
    return {
        "name": event.name,
        "shapes": [list(s) if isinstance(s, (list, tuple)) else [] for s in event.input_shapes],
        "dtypes": [
            str(d)
            for d in (
                getattr(event, "input_dtypes", None)
                or (dtypes_by_id or {}).get(getattr(event, "id", -1))
                or []
            )
        ],
        "strides": [
            list(s) if isinstance(s, (list, tuple)) and all(isinstance(x, int) for x in s) else []
            for s in strides
        ],
        "concrete": concrete,
        "start_us": float(event.time_range.start),
        "cpu_us": float(event.cpu_time_total),
        "device_us": float(event.device_time_total),
        "kernels": kernels,
        "leaves": leaves,
        # The ops it called, by name: which implementation ran (SDPA's math fallback, say).
        "callees": sorted({c.name for c in event.cpu_children if _is_op(c.name)})[:12],
        "module": module,
        "source": list(source) if source else None,
        "thread": int(event.thread),
    }


def _string_padding(event: Any) -> Any:
    """conv1d/2d/3d's padding="same" or "valid", which the profiler records as None: the
    aten::convolution torch's _convolution_mode issued has padding, or a padded input, if "same"."""
    for mode in event.cpu_children:
        for child in mode.cpu_children if mode.name == "aten::_convolution_mode" else ():
            if child.name == "aten::convolution":
                pad = (list(child.concrete_inputs or []) + [None] * 5)[4] or [0]
                moved = list(child.input_shapes[0]) != list(event.input_shapes[0])
                return "same" if moved or any(pad) else "valid"
    return None


def _write(profs: list[Any]) -> None:
    import torch

    ops = []
    for prof in profs:
        dtypes = _dtypes_by_id(prof)
        for event in prof.events():
            name = event.name
            if not _is_op(name) or getattr(event, "is_python_function", False):
                continue
            record = _op_record(event, dtypes)
            if record is not None:
                ops.append(record)
    ops.sort(key=lambda op: op["start_us"])
    pid = os.getpid()
    cuda = False
    with contextlib.suppress(Exception):
        cuda = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    body = {
        "schema": "rocmfix-profile-process/1",
        "pid": pid,
        "ppid": os.getppid(),
        "argv": list(sys.argv),
        "python": sys.executable,
        "torch": torch.__version__,
        "hip": getattr(torch.version, "hip", None),
        "cuda_used": bool(cuda),
        "backend": _backend(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("MIOPEN_", "TORCH_"))},
        "calls": int(_state["calls"]),
        "ops": ops,
    }
    if os.environ.get("ROCMFIX_PROFILE_TRACE") == "1":
        try:
            for n, prof in enumerate(profs):
                suffix = "" if n == 0 else f"-{n}"
                prof.export_chrome_trace(os.path.join(_DIR, f"trace-{pid}{suffix}.json"))
        except Exception as exc:  # noqa: BLE001
            _note(f"trace not written: {exc!r}")
    tmp = os.path.join(_DIR, f".events-{pid}.tmp")
    with open(tmp, "w") as handle:
        json.dump(body, handle)
    os.replace(tmp, os.path.join(_DIR, f"events-{pid}.json"))


def _install() -> None:
    if not _DIR or not os.path.isdir(_DIR):
        return
    with contextlib.suppress(ValueError):
        _window.update(json.loads(os.environ.get("ROCMFIX_PROFILE_WINDOW") or "{}"))
    # Kineto logs its start and stop on stderr; the command's stderr must stay its own.
    if "KINETO_LOG_LEVEL" not in os.environ:
        os.environ["KINETO_LOG_LEVEL"] = "6"
        _state["set_log"] = True
    _mark("shim")
    sys.meta_path.insert(0, _TorchFinder())


with contextlib.suppress(Exception):
    _install()
_chain()
