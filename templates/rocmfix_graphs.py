"""A model's forward replayed as a CUDA/HIP graph, one per input shape (rocmfix template).

rocmfix dropped this file beside a file of MinerU's that calls one of its small models
(``self.net(inp)`` in the PaddleOCR predictors, say) and rewrote that call to
:func:`forward`; ``rocmfix revert`` removes it. Once the slow ops are fast, these models are
bound by Python and kernel launches (docs/performance-graphs.md): a graph replays the whole
forward's launches at once.

What it does, per model (a weak reference: the model's lifetime is the caller's), at each
input signature (every input tensor's shape, strides, dtype and device, the constants beside
them, inference mode or not): eager until its :data:`MIN_SEEN`-th sighting (those runs are
the warm-up that puts MIOpen's Find and Triton's compiles outside any capture); then copies
of the inputs, one more warm-up and the capture on a side stream (a ``torch.cuda.CUDAGraph``
into a memory pool the model's graphs share), and a replay; later calls copy their inputs
into the captured ones, replay, and return clones of the outputs (nothing the caller keeps
is overwritten by a later call). What it keeps is bounded (:func:`_capture`): at most
:data:`MAX_GRAPHS` graphs a model, the least recently used dropped for a new shape once
unused for :data:`STALE_AFTER` x :data:`MAX_GRAPHS` calls (until then new shapes run eager,
or more shapes in turn than the cap would be captured again on every call); no new shape
while its graphs have paid back less than :data:`PAYBACK` replays a capture (once it has
:data:`PAYBACK_AFTER`; 0 turns this off); at most :data:`MAX_CAPTURES` captures a model, and
none once its pool holds :data:`MAX_BYTES` (passed by one capture's at most).
:func:`held_bytes` and :func:`stats` say what is held.

Anything it cannot or must not capture runs the stock eager call, and says so once per model
class and reason in a ``RuntimeWarning`` that cannot become an exception (not even under
``python -W error``): grad mode, autocast, a model in training, inputs or outputs other than
tensors and constants (tuples, lists and dicts of them are taken apart), a capture that
raised (no more captures for that model), a replay that failed (that graph dropped), a
shape past the caps.
Shapes that repeat (issue 41): short batches padded with rows (:func:`_pad`, exact), sizes
grown to a bucket's (:func:`_grow`, ``--scheme bucket``, not exact).
CPU inputs and ``torch.compile``'d callers are left to the stock call without a word: there
is nothing to replay on a CPU, and a warning would break the compiler's graph. So is a model
called inside another model's capture (PP-DocLayoutV2's backbone inside the whole detector):
the outer graph holds it; were that capture to fail, the inner one is replayed on its own.

:func:`constant` keeps on the device the host values patched files write into device tensors
(``torch.tensor(self.config.class_order, device=...)``): a capture refuses a host copy.
``ROCMFIX_GRAPHS=0`` in the environment (read at import) turns all of it off;
``ROCMFIX_GRAPHS_AFTER``, ``ROCMFIX_GRAPHS_PAYBACK`` and ``ROCMFIX_GRAPHS_MAX_MIB`` set
:data:`MIN_SEEN`, :data:`PAYBACK` and :data:`MAX_BYTES`.

What a replay assumes: the model's parameters and buffers stay where they were at capture
(checked on every replay: their storage addresses; values written in place are seen, as in
eager) and its Python-side structure does not change (a swapped submodule is not seen:
call :func:`reset` after changing a live model). Standard library and torch's public API.
"""

from __future__ import annotations

import os
import sys
import threading
import types
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

SCHEME = "graphs"
_OFF = ("0", "false", "no", "off")
ENABLED = os.environ.get("ROCMFIX_GRAPHS", "1").strip().lower() not in _OFF


def _count_from_env(name: str, default: int) -> int:
    """A whole number >= 0 from the environment; anything else is the default."""
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() else default


# MinerU's page mix shows most shapes once or twice (docs/performance-graphs.md): a capture
# costs several forwards, so a shape seen twice does not pay one back.
MIN_SEEN = max(1, _count_from_env("ROCMFIX_GRAPHS_AFTER", 3))
PAYBACK = _count_from_env("ROCMFIX_GRAPHS_PAYBACK", 4)
PAYBACK_AFTER = 2
MAX_GRAPHS = 8
MAX_CAPTURES = 64
STALE_AFTER = 4
# A model's graph memory cap (MiB; ROCMFIX_GRAPHS_MAX_MIB): PP-DocLayoutV2 at MinerU's batch of
# two 800x800 pages holds 1,061 MiB in its one graph, the model that gains most from replay
# (docs/performance-graphs.md); the formula encoder's batch of 32 crops stays past it.
MAX_BYTES = _count_from_env("ROCMFIX_GRAPHS_MAX_MIB", 2048) << 20
PAD_BATCH = os.environ.get("ROCMFIX_GRAPHS_PAD_BATCH", "1").strip().lower() not in _OFF
# Bounds, not policies: signatures counted per model (then the count starts again); values
# :func:`constant` keeps (then each call makes one).
_MAX_SEEN = 1024
_MAX_CONSTANTS = 1024

__all__ = ["ENABLED", "SCHEME", "constant", "forward", "held_bytes", "reset", "stats"]


class _Unsupported(Exception):
    """A value the runner does not capture (the message says which)."""


# -- trees of tensors ----------------------------------------------------------------------
# A spec is hashable and names the container types; ("T",) is a tensor leaf, ("C", value) a
# constant (of the inputs: part of the signature).

_CONSTANTS = (bool, int, float, str, bytes, type(None), torch.dtype, torch.device)


def _flatten(value: Any, leaves: list[torch.Tensor], inputs: bool) -> Any:
    if isinstance(value, torch.Tensor):
        leaves.append(value)
        return ("T",)
    kind = type(value)
    if kind in (tuple, list) or (isinstance(value, tuple) and hasattr(kind, "_fields")):
        return (kind, tuple(_flatten(v, leaves, inputs) for v in value))
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        keys = tuple(value)
        return (kind, keys, tuple(_flatten(value[k], leaves, inputs) for k in keys))
    if kind in _CONSTANTS:
        # In an output too: a forward that can be captured makes no host value out of device
        # data (that needs a sync, which a capture refuses), so a constant stays one.
        return ("C", value)
    raise _Unsupported(f"{'an input' if inputs else 'an output'} of type {kind.__name__}")


def _rebuild(spec: Any, leaves: list[torch.Tensor], at: list[int]) -> Any:
    tag = spec[0]
    if tag == "T":
        at[0] += 1
        return leaves[at[0] - 1]
    if tag == "C":
        return spec[1]
    if len(spec) == 3:
        kind, keys, children = spec
        items = {k: _rebuild(c, leaves, at) for k, c in zip(keys, children)}
        return items if kind is dict else kind(**items)
    kind, children = spec
    built = [_rebuild(c, leaves, at) for c in children]
    if kind is list:
        return built
    return kind(built) if kind is tuple else kind(*built)


# -- saying so -----------------------------------------------------------------------------

_told: set[tuple[str, str]] = set()
_told_lock = threading.Lock()


def _tell(model: Any, reason: str, detail: str) -> None:
    """One RuntimeWarning per model class and reason, which no warnings filter can turn into
    an exception in the caller's forward."""
    key = (type(model).__qualname__, reason)
    # CUDA's errors run to several lines of advice: the first says what happened.
    detail = (detail.strip().splitlines() or [""])[0]
    with _told_lock:
        if key in _told:
            return
        _told.add(key)
    message = (
        f"rocmfix graphs: {type(model).__name__} runs eager ({reason}: {detail}); "
        "ROCMFIX_GRAPHS=0 turns graph replay off"
    )
    try:
        # Said at the caller's line (MinerU's), however deep in this file it was found.
        level, frame = 1, sys._getframe()  # type: int, types.FrameType | None
        while frame is not None and frame.f_code.co_filename == __file__:
            level, frame = level + 1, frame.f_back
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            warnings.warn(message, RuntimeWarning, stacklevel=level)
    except Exception:  # noqa: BLE001 - a broken warnings hook must not break the model
        pass


# -- the device side: the one place that touches CUDA/HIP graphs ----------------------------


class _Backend:
    """torch.cuda's graphs. Tests put a stand-in here to run the logic on a CPU."""

    def __init__(self) -> None:
        self._streams: dict[Any, Any] = {}

    def on_device(self, t: torch.Tensor) -> bool:
        return bool(t.is_cuda)

    def new_pool(self, device: torch.device) -> Any:
        return torch.cuda.graph_pool_handle()

    def reserve(self, device: torch.device) -> int:
        """Bytes the caching allocator holds on ``device``. A capture's pool takes new
        segments of its own (it cannot use the free blocks of eager calls), so the growth
        across a capture is what the graph holds."""
        return int(torch.cuda.memory_reserved(device))

    def capture(self, device: torch.device, pool: Any, run: Callable[[], Any]) -> tuple[Any, Any]:
        """(graph, outputs) of ``run`` captured on a side stream, after a warm-up there."""
        stream = self._streams.get(device) or self._streams.setdefault(
            device, torch.cuda.Stream(device)
        )
        current = torch.cuda.current_stream(device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            run()
        current.wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # What torch.cuda.graph() does, less its empty_cache(): that would hand the eager
        # calls' cached blocks back to the driver, for later eager forwards to allocate again.
        torch.cuda.synchronize(device)
        with torch.cuda.stream(stream):
            graph.capture_begin(pool=pool, capture_error_mode="thread_local")
            try:
                out = run()
            finally:
                graph.capture_end()
        return graph, out

    def replay(self, graph: Any) -> None:
        graph.replay()


_BACKEND = _Backend()


# -- per model -------------------------------------------------------------------------------


class _Graph:
    __slots__ = ("addresses", "graph", "inputs", "last", "outputs", "spec", "weights")

    def __init__(self, graph: Any, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
                 spec: Any, weights: list[torch.Tensor]) -> None:  # fmt: skip
        self.graph = graph
        self.inputs = inputs
        self.outputs = outputs
        self.spec = spec
        self.weights = weights
        self.addresses = list(map(torch.Tensor.data_ptr, weights))
        self.last = 0  # the model's call count at this graph's last replay


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: dict[Any, int] = {}
        self.graphs: OrderedDict[Any, _Graph] = OrderedDict()
        self.pools: dict[Any, Any] = {}
        self.failed: set[Any] = set()
        self.held = 0
        self.captures = 0
        self.broken: str | None = None
        self.full = False
        self.counts: dict[str, int] = {}
        self.calls = 0
        self.batch = 0  # the largest batch seen; -1 once padding is off for this model
        self.no_bucket = False  # a bucket failed: this model runs at its own sizes

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1


_states: weakref.WeakKeyDictionary[Any, _State] = weakref.WeakKeyDictionary()
_states_lock = threading.Lock()


def _state(model: Any) -> _State:
    found = _states.get(model)
    if found is None:
        with _states_lock:
            found = _states.setdefault(model, _State())
    return found


def _is_compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    check = getattr(compiler, "is_compiling", None)
    return bool(check()) if check is not None else False


def _autocast(device_type: str) -> bool:
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except TypeError:  # torch before 2.4 takes no device type (and means CUDA's)
        return bool(torch.is_autocast_enabled())


def _eager_reason(model: Any, device_type: str) -> tuple[str, str] | None:
    if torch.is_grad_enabled():
        return "grad mode", "call it under torch.inference_mode() or torch.no_grad()"
    if _autocast(device_type):
        return "autocast", "a graph would freeze autocast's casts"
    if getattr(model, "training", False):
        return "training", "the model is in train mode"
    return None


# Set while this thread runs a capture (and its warm-up): a model the captured forward calls
# through the runner runs as it is, inside the outer graph. One flag for every copy of this
# file in the process: each patched file imports the copy dropped beside it (MinerU's layout
# call and transformers' backbone call are two).
_capturing: threading.local = sys.modules.setdefault(
    "_rocmfix_graphs_shared", types.ModuleType("_rocmfix_graphs_shared")
).__dict__.setdefault("capturing", threading.local())


def forward(model: Any, *args: Any, rocmfix_width_bucket: int = 0, rocmfix_size_bucket: int = 0,
            **kwargs: Any) -> Any:  # fmt: skip
    """``model(*args, **kwargs)``, replayed from a graph where one was captured for these
    inputs; the stock call wherever it cannot be (see the module's docstring)."""
    if not ENABLED or _is_compiling() or getattr(_capturing, "on", False):
        return model(*args, **kwargs)
    leaves: list[torch.Tensor] = []
    try:
        spec = _flatten((args, kwargs), leaves, inputs=True)
    except _Unsupported as exc:
        _tell(model, "inputs", str(exc))
        return model(*args, **kwargs)
    if not leaves or not all(_BACKEND.on_device(t) for t in leaves):
        return model(*args, **kwargs)
    state = _state(model)
    reason = _eager_reason(model, leaves[0].device.type)
    if reason is not None:
        state.count(reason[0])
        _tell(model, *reason)
        return model(*args, **kwargs)
    bucket = (rocmfix_width_bucket or rocmfix_size_bucket) * (not state.no_bucket)
    if bucket > 0 and len(args) == 1 and not kwargs and leaves[0] is args[0]:
        grown = _grow(state, args[0], bucket, both=not rocmfix_width_bucket)
        if grown is not args[0]:
            try:
                out = forward(model, grown)
                return _crop(out, args[0], grown) if rocmfix_size_bucket else out
            except Exception as exc:  # noqa: BLE001 - out of memory on the grown batch, say
                state.no_bucket = True  # this call, and the model's next, at their own size
                grown = out = None  # its memory, let go before the stock call needs it
                state.count("not bucketed")
                _tell(model, "bucket", f"{type(exc).__name__}: {exc}")
    try:
        with state.lock:
            rows, padded = _pad(state, leaves)
            key = (
                spec,
                tuple((t.shape, t.stride(), t.dtype, t.device) for t in padded),
                torch.is_inference_mode_enabled(),
            )
            state.calls += 1
            found = state.graphs.get(key)
            if found is not None:
                return _replay(model, state, key, found, padded, rows)
            if state.broken is None and key not in state.failed and _due(state, key):
                return _capture(model, state, key, spec, padded, rows)
    except _Fallback:
        pass
    state.count("eager")
    return model(*args, **kwargs)


class _Fallback(Exception):
    """The graph path gave up on this call: run the stock one."""


def _due(state: _State, key: Any) -> bool:
    seen = state.seen.get(key, 0) + 1
    if len(state.seen) >= _MAX_SEEN and key not in state.seen:
        state.seen.clear()
    state.seen[key] = seen
    return seen >= MIN_SEEN


def _grow(state: _State, x: Any, bucket: int, both: bool) -> Any:
    """``x`` padded on the right (and, ``both``, at the bottom) up to multiples of
    ``bucket``, where it is a batch of images: rec's width with zeros, as MinerU pads a batch
    of lines (what it would compute had it padded that wide); det's sides with their edge
    repeated, as a wider margin of MinerU's white round a crop (:func:`_crop` cuts the maps
    back). Not the stock values (docs/performance-graphs.md measures both); where it is not
    a batch of images, or the padding fails, ``x`` as it is. A call left to the stock call
    keeps its shape."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        return x
    right, down = -x.shape[-1] % bucket, -x.shape[-2] % bucket if both else 0
    if not right and not down:
        return x
    try:
        grown = torch.nn.functional.pad(
            x, (0, right, 0, down), mode="replicate" if both else "constant"
        )
    except Exception:  # noqa: BLE001 - out of memory, say: this call runs as it came
        return x
    state.count("bucketed")
    return grown


def _crop(out: Any, x: torch.Tensor, grown: torch.Tensor) -> Any:
    """A call's outputs on the ``grown`` batch cut back to the size of ``x``, the batch it
    was given (DB's maps, before MinerU scales its boxes); an error where one is not the
    grown batch's size (:func:`forward` then makes the stock call)."""
    leaves: list[torch.Tensor] = []
    spec = _flatten(out, leaves, inputs=False)
    if not leaves or any(t.dim() < 2 or t.shape[-2:] != grown.shape[-2:] for t in leaves):
        raise _Unsupported("an output is not its input's size")
    height, width = x.shape[-2:]
    return _rebuild(spec, [t[..., :height, :width] for t in leaves], [0])


def _pad(state: _State, leaves: list[torch.Tensor]) -> tuple[int, list[torch.Tensor]]:
    """(rows asked for, the input padded with rows of zeros up to the largest batch seen,
    where that at most doubles them: a graph of its own costs less) where padding applies
    (``ROCMFIX_GRAPHS_PAD_BATCH``), else (0, the input as it is): MinerU's short batch at the
    end of a group or window replays the full batch's graph. Each row is what eager gives it
    where a batch's rows are independent, as in every model the patches route: the same
    values, though a GPU library may pick another kernel for more rows, so not the same bits."""
    if not PAD_BATCH or state.batch < 0 or state.broken or len(leaves) != 1 or leaves[0].dim() < 2:
        return 0, leaves
    x = leaves[0]
    rows = x.shape[0]
    if rows >= state.batch:
        state.batch = rows
    if not 2 * rows >= state.batch > rows:
        return 0, leaves
    try:
        padded = torch.nn.functional.pad(x, (*(0, 0) * (x.dim() - 1), 0, state.batch - rows))
    except Exception:  # noqa: BLE001 - out of memory, say: this call runs as it came
        return 0, leaves
    state.count("padded")
    return rows, [padded]


def _replay(model: Any, state: _State, key: Any, found: _Graph, leaves: list[torch.Tensor],
            rows: int = 0) -> Any:  # fmt: skip
    try:
        if list(map(torch.Tensor.data_ptr, found.weights)) != found.addresses:
            _drop(state, key)
            state.count("moved")
            raise _Fallback
        for static, t in zip(found.inputs, leaves):
            static.copy_(t)
        _BACKEND.replay(found.graph)
        outputs = found.outputs
        if rows:  # a padded batch (_pad): the rows asked for; the stock call where an output
            if not all(t.dim() and t.shape[0] == leaves[0].shape[0] for t in outputs):
                state.batch = -1  # does not have the batch first, never padded again
                state.count("not padded")
                raise _Fallback
            outputs = [t[:rows] for t in outputs]
        outputs = [t.clone() for t in outputs]
    except _Fallback:
        raise
    except Exception as exc:
        _drop(state, key)
        state.failed.add(key)
        state.count("replay failed")
        _tell(model, "replay failed", f"{type(exc).__name__}: {exc}")
        raise _Fallback from exc
    state.graphs.move_to_end(key)
    found.last = state.calls
    state.count("replayed")
    return _rebuild(found.spec, outputs, [0])


def _drop(state: _State, key: Any) -> None:
    """Forget a graph. Its captured inputs go back to the allocator; what it held in the pool
    stays there for the model's next capture, and in :func:`held_bytes`."""
    found = state.graphs.pop(key, None)
    state.seen.pop(key, None)  # a shape dropped is captured again once seen again as often
    if found is not None:
        state.held -= sum(t.numel() * t.element_size() for t in found.inputs)


def _in_use(state: _State) -> bool:
    """Whether the least recently used graph was replayed lately (a new shape waits, eager,
    until one has gone stale: see the module's docstring)."""
    oldest = next(iter(state.graphs.values()))
    return state.calls - oldest.last <= STALE_AFTER * MAX_GRAPHS


def _capture(model: Any, state: _State, key: Any, spec: Any, leaves: list[torch.Tensor],
             rows: int = 0) -> Any:  # fmt: skip
    backend = _BACKEND
    busy = len(state.graphs) >= MAX_GRAPHS and _in_use(state)
    if state.full or state.captures >= MAX_CAPTURES or busy:
        state.count("past the cap")
        why = "graph memory" if state.full else "graphs" if busy else "captures"
        _tell(model, "shape past the cap", f"no new graph past the {why} cap")
        raise _Fallback
    captured = state.counts.get("captured", 0)
    replays = state.counts.get("replayed", 0) - captured
    if PAYBACK and captured >= PAYBACK_AFTER and replays < PAYBACK * captured:
        state.count("not paying")  # a choice, not a failure: no warning
        raise _Fallback
    device = leaves[0].device
    try:
        static = [torch.empty_like(t).copy_(t) for t in leaves]
        call_args, call_kwargs = _rebuild(spec, static, [0])
        pool = state.pools.get(device) or state.pools.setdefault(device, backend.new_pool(device))
        before = backend.reserve(device)
        state.captures += 1
        _capturing.on = True
        try:
            graph, out = backend.capture(device, pool, lambda: model(*call_args, **call_kwargs))
        finally:
            _capturing.on = False
        outputs: list[torch.Tensor] = []
        out_spec = _flatten(out, outputs, inputs=False)
        _rebuild(out_spec, outputs, [0])  # a container type that cannot be rebuilt fails here
        held = max(0, backend.reserve(device) - before)
        held += sum(t.numel() * t.element_size() for t in static)
        weights = [*model.parameters(), *model.buffers()] if hasattr(model, "parameters") else []
    except Exception as exc:
        if isinstance(exc, _Unsupported):
            state.failed.add(key)
            state.count("outputs")
            _tell(model, "outputs", f"{exc}: not tensors")
        else:
            state.broken = f"{type(exc).__name__}: {exc}"
            state.count("capture failed")
            _tell(model, "capture failed", state.broken)
        raise _Fallback from exc
    state.held += held
    if state.held > MAX_BYTES:
        # This graph goes (its captured inputs with it); what it took in the pool stays for
        # the graphs the model keeps, or, where it keeps none, goes back with the pool.
        state.held -= sum(t.numel() * t.element_size() for t in static)
        detail = f"graph memory {state.held >> 20} MiB"
        if not state.graphs:
            del graph
            state.pools.pop(device, None)
            state.held = 0
        state.full = True
        state.count("past the cap")
        _tell(model, "shape past the cap", detail)
        raise _Fallback
    found = _Graph(graph, static, outputs, out_spec, weights)
    state.graphs[key] = found
    state.count("captured")
    while len(state.graphs) > MAX_GRAPHS:
        _drop(state, next(iter(state.graphs)))
        state.count("dropped")
    return _replay(model, state, key, found, leaves, rows)


# -- host values as device tensors ----------------------------------------------------------

_constants: dict[Any, torch.Tensor] = {}
_constants_lock = threading.Lock()


def _frozen(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(map(_frozen, value))
    return (type(value), value)  # 1, 1.0 and True are equal keys otherwise


def constant(value: Any, dtype: torch.dtype | None = None, device: Any = None) -> torch.Tensor:
    """``torch.tensor(value, dtype=dtype, device=device)``, made once per value, dtype and
    device and kept: the same numbers as the stock call, with no copy from the host after the
    first call (the eager warm-up makes it before any capture). Callers only read it. Under
    ``torch.compile`` it is the stock call (the compiler sees a plain factory)."""
    if not ENABLED or _is_compiling():
        return torch.tensor(value, dtype=dtype, device=device)
    try:
        key = (_frozen(value), dtype, torch.device(device) if device is not None else None)
        found = _constants.get(key)
    except TypeError:  # a value that cannot be a key: the stock call
        return torch.tensor(value, dtype=dtype, device=device)
    if found is None:
        found = torch.tensor(value, dtype=dtype, device=device)
        with _constants_lock:
            if len(_constants) < _MAX_CONSTANTS:
                found = _constants.setdefault(key, found)
    return found


# -- what is held --------------------------------------------------------------------------


def held_bytes(model: Any = None) -> int:
    """Device memory the graphs hold: one model's, or every live model's (approximate: the
    growth of the allocator's reserve across each capture, plus the captured inputs)."""
    if model is not None:
        return (_states.get(model) or _State()).held
    return sum(s.held for s in list(_states.values()))


def stats(model: Any) -> dict[str, Any]:
    """What the runner did with ``model``: graphs kept, bytes held, and counts of captures,
    replays and eager runs by reason."""
    found = _states.get(model) or _State()
    return {
        "graphs": len(found.graphs),
        "held_bytes": found.held,
        "captures": found.captures,
        "broken": found.broken,
        "counts": dict(found.counts),
    }


def reset(model: Any) -> None:
    """Forget ``model``'s graphs (their pool is freed once none is left) and counts."""
    with _states_lock:
        _states.pop(model, None)
