"""The one protocol between rocmfix and its worker in the target interpreter: the request the
host sends (base64 JSON on the command line), the device facts and events the worker answers
(one JSON object per line), and the id of a doctor item.

Both sides import this module: the host as ``rocmfix.guest.protocol``, the guest through the
package :data:`rocmfix.guest.BOOT` loads. It is standard library only and runs on Python 3.8
(annotations are never evaluated, so the builtin generics in them cost nothing there).

Each side parses once, where the JSON arrives (:meth:`Request.from_json` in the worker,
:func:`parse_event` on the host): a value of the wrong type or a missing key raises one
:class:`ProtocolError` whose message fits on a line; keys a message does not define are
ignored. What the worker answers is untrusted input to the host.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, Union, get_args

# Changed whenever a message changes shape: a worker from another rocmfix is refused, not
# half understood. (2 was the untyped worker's ``hello["worker"]``; 4 added doctor's
# ``Graphs`` and the profile's replay: ``OpSpec.replay``, ``Request.calls`` and ``backend``;
# 5 dropped tune's ``compile`` mode and ``Request.jobs``.)
VERSION = 5


class ProtocolError(ValueError):
    """A message that is not what this protocol says: its text is one line."""


def item_id(case: str, impl: str) -> str:
    """A doctor item's id: one case of one op, run natively or by one scheme."""
    return case + "/" + impl


_M = TypeVar("_M", bound="Message")
# Every message class by name, for the annotations that name one (filled by Message).
_CLASSES: dict[str, type[Message]] = {}
# Each scalar annotation: the JSON values it takes, and its words in an error.
_SCALARS: dict[str, tuple[tuple[type, ...], str]] = {
    "str": ((str,), "a string"),
    "int": ((int,), "an integer"),
    "float": ((int, float), "a number"),
    "bool": ((bool,), "true or false"),
}
# What a JSON value is, in words (bool before the numbers: it is an int to Python).
_KINDS = ((bool, "a boolean"), ((int, float), "a number"), (str, "a string"), (list, "a list"),
          (dict, "an object"))  # fmt: skip
# How an item, a candidate or a tune target ended: a closed set, checked where it arrives.
# timeout, crashed and missing are written by the host for a worker it killed or lost.
Status = Literal[
    "ok", "failed", "error", "unavailable", "rejected", "skipped", "timeout", "crashed", "missing"
]
_CHOICES: dict[str, tuple[str, ...]] = {"Status": get_args(Status)}


def _kind(value: object) -> str:
    if value is None:
        return "null"
    return next((word for kind, word in _KINDS if isinstance(value, kind)), type(value).__name__)


def _value(value: object, annotation: str, where: str) -> Any:
    """``value`` checked against a field's annotation, which is read as text (never
    evaluated, so this runs on Python 3.8): ``X | None``, ``str``, ``int``, ``float``,
    ``bool``, ``Any``, ``list[X]``, ``dict[str, X]`` and the name of a message class."""
    if annotation.endswith(" | None"):
        if value is None:
            return None
        annotation = annotation[: -len(" | None")]
    if annotation == "Any":
        return value
    choices = _CHOICES.get(annotation)
    if choices is not None:
        if isinstance(value, str) and value in choices:
            return value
        got = repr(value[:40]) if isinstance(value, str) else _kind(value)
        raise ProtocolError(f"{where} must be one of {', '.join(choices)}, got {got}")
    if annotation in _SCALARS:
        kinds, words = _SCALARS[annotation]
        # bool is an int to Python, never to this protocol.
        if isinstance(value, kinds) and (annotation == "bool" or not isinstance(value, bool)):
            return value
        raise ProtocolError(f"{where} must be {words}, got {_kind(value)}")
    if annotation.startswith("list["):
        if not isinstance(value, list):
            raise ProtocolError(f"{where} must be a list, got {_kind(value)}")
        inner = annotation[len("list[") : -1]
        return [_value(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
    if annotation.startswith("dict[str, "):
        if not isinstance(value, dict):
            raise ProtocolError(f"{where} must be an object, got {_kind(value)}")
        inner = annotation[len("dict[str, ") : -1]
        return {str(k): _value(v, inner, f"{where}[{str(k)[:40]!r}]") for k, v in value.items()}
    cls = _CLASSES.get(annotation)
    if cls is None:  # a field this module declared in a form _value does not read
        raise TypeError(f"{where}: unreadable annotation {annotation!r}")
    return cls.parse(value, where)


@dataclass(frozen=True)
class Message:
    """A dataclass that travels as JSON: :meth:`to_json`, and back through :meth:`parse`,
    which checks every field against its annotation. A field with a default may be left out;
    keys the class does not define are ignored."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _CLASSES[cls.__name__] = cls

    @classmethod
    def parse(cls: type[_M], data: object, where: str | None = None) -> _M:
        where = where or cls.__name__
        if not isinstance(data, dict):
            raise ProtocolError(f"{where} must be an object, got {_kind(data)}")
        cls._precheck(data, where)
        values = {}
        for f in dataclasses.fields(cls):
            if f.name in data:
                values[f.name] = _value(data[f.name], str(f.type), f"{where}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ProtocolError(f"{where}.{f.name} is missing")
        return cls(**values)

    @classmethod
    def _precheck(cls, data: dict[str, Any], where: str) -> None:
        """What must hold before the fields are read (the version)."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# The request -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ShapePair(Message):
    """One shape as it runs on a GPU and scaled down for Triton's CPU interpreter."""

    gpu: dict[str, Any]
    cpu: dict[str, Any]

    def on(self, variant: str) -> dict[str, Any]:
        return dict(self.gpu if variant == "gpu" else self.cpu)


@dataclass(frozen=True)
class GridSpec(Message):
    """Tile configs tune tries where every condition in ``when`` holds (an ops GridGroup)."""

    when: list[str]
    configs: list[dict[str, Any]]


@dataclass(frozen=True)
class OpSpec(Message):
    """What the worker needs to know of one op (``rocmfix.ops.Op`` as data)."""

    name: str
    harness: str
    config_env: str | None
    kernel: str
    kernel_template: str
    schemes: dict[str, str]  # scheme name -> the template it runs
    triton_schemes: list[str]
    dtypes: list[str]
    cases: dict[str, ShapePair]
    tune: dict[str, ShapePair]
    grid: list[GridSpec]
    # The function of each scheme's entry that takes a recorded call's arguments as its torch
    # functional does ("" where the profile replays none: ``rocmfix.ops.Op.replay``).
    replay: str = ""

    @property
    def kernel_scheme(self) -> str:
        """The scheme whose template is the op's tunable kernel."""
        return next(n for n, entry in self.schemes.items() if entry == self.kernel_template)


@dataclass(frozen=True)
class Call(Message):
    """A call the profiled command made, a case of ``rocmfix profile``'s replay: the torch op
    (``aten::conv2d``; ``aten::mm`` and ``aten::copy_`` calibrate), its inputs' shapes,
    dtypes (torch's names: ``float16``) and strides, and a conv's arguments, one number per
    spatial axis (``padding_mode``: "same" or "valid" where it ran with one; ``pad_far``: the
    far side's one more of an odd "same"). ``op``: the registry's op whose call it is."""

    name: str
    shapes: list[list[int]]
    dtypes: list[str]
    strides: list[list[int]] = field(default_factory=list)
    op: str = ""
    stride: list[int] = field(default_factory=list)
    padding: list[int] = field(default_factory=list)
    dilation: list[int] = field(default_factory=list)
    groups: int = 1
    transposed: bool = False
    output_padding: list[int] = field(default_factory=list)
    padding_mode: str | None = None
    pad_far: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class MeasureItem(Message):
    """One doctor item: a case of an op, run natively (``impl`` "native") or by a scheme; in
    the profile's replay, a recorded call (``Request.calls``) as it ran ("native"), by a
    scheme of its op, or in another form of the call (``op`` "")."""

    op: str
    case: str
    impl: str

    @property
    def id(self) -> str:
        return item_id(self.case, self.impl)

    def to_json(self) -> dict[str, Any]:
        return dict(dataclasses.asdict(self), id=self.id)


@dataclass(frozen=True)
class CompileItem(Message):
    """One ahead-of-time compile: a Triton scheme's kernel at a shape, in a dtype, for a GPU,
    with the template's own config (``config`` None) or an explicit one over it."""

    op: str
    scheme: str
    shape: str  # the case or tune target's id
    gpu: dict[str, Any]
    dtype: str
    arch: str
    config: dict[str, Any] | None = None
    id: str | None = None


def _same_version(version: object, words: str) -> None:
    if version != VERSION or isinstance(version, bool):
        shown = version if isinstance(version, int) else "?"
        raise ProtocolError(words.format(shown, VERSION) + " (two rocmfix installs are mixed)")


MODES = ("measure", "tune", "resolve", "check", "replay")


@dataclass(frozen=True)
class Request(Message):
    """Everything one worker run is told. ``skip``: the items a killed worker finished."""

    mode: str
    templates_dir: str
    templates: list[str]
    ops: dict[str, OpSpec]
    tuned_file: str
    version: int = VERSION
    skip: list[str] = field(default_factory=list)
    # measure: the items to run; check: the compiles (none: the whole sweep).
    items: list[MeasureItem] = field(default_factory=list)
    compiles: list[CompileItem] = field(default_factory=list)
    # Seconds per timing (measure) or for the whole search (tune); None: the mode's default.
    budget_s: float | None = None
    interpret: bool = False
    require_gpu: bool = False
    archs: list[str] = field(default_factory=list)
    # replay: the recorded calls by case id, and the run's torch backend flags to replay under.
    calls: dict[str, Call] = field(default_factory=dict)
    backend: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def _precheck(cls, data: dict[str, Any], where: str) -> None:
        _same_version(data.get("version"), "rocmfix sent protocol {}; this worker speaks {}")
        if data.get("mode") not in MODES:
            raise ProtocolError(f"{where}.mode: unknown mode {str(data.get('mode'))[:40]!r}")

    def config_envs(self) -> list[str]:
        """The config overrides a user may have exported for these ops' kernels."""
        return [op.config_env for op in self.ops.values() if op.config_env]


# The answers -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceFacts(Message):
    """The device the worker runs on; the defaults are the host's words for "unknown"."""

    kind: str = "unknown"  # gpu, cpu
    backend: str = "unknown"  # hip, cuda, cpu
    name: str | None = None
    arch: str = "?"
    count: int = 0
    torch: str = "?"
    hip: str | None = None
    cuda: str | None = None
    triton: str | None = None
    triton_error: str | None = None
    conv_library: str | None = None
    memory_gib: float | None = None
    cc_major: int = 0

    @property
    def interpreter(self) -> bool:
        """No GPU: the kernels ran in Triton's CPU interpreter."""
        return self.kind != "gpu"


@dataclass(frozen=True)
class Event(Message):
    """One line the worker sends; ``EVENT`` is its ``"event"`` key."""

    EVENT = ""

    def to_json(self) -> dict[str, Any]:
        return dict(event=self.EVENT, **dataclasses.asdict(self))


@dataclass(frozen=True)
class Hello(Event):
    EVENT = "hello"
    pid: int  # the worker's process id
    python: str
    device: DeviceFacts
    overrides: dict[str, str] = field(default_factory=dict)
    version: int = VERSION

    @classmethod
    def _precheck(cls, data: dict[str, Any], where: str) -> None:
        _same_version(data.get("version"), "the worker speaks protocol {}; this rocmfix speaks {}")


@dataclass(frozen=True)
class Start(Event):
    """An item begins: its time limit counts from here."""

    EVENT = "start"
    id: str


@dataclass(frozen=True)
class First(Event):
    """An item's first call returned (kernel search or compile included)."""

    EVENT = "first"
    id: str
    ms: float


@dataclass(frozen=True)
class Measured(Event):
    """One doctor item's outcome. ``status``: ok, failed (wrong result), error, unavailable,
    and, written by the host for a worker it killed or lost, timeout and crashed."""

    EVENT = "item"
    id: str
    status: Status
    config: dict[str, Any] | None = None
    first_ms: float | None = None
    ms: float | None = None
    kernel_ms: float | None = None
    rel_err: float | None = None
    tolerance: float | None = None
    message: str | None = None
    traceback: str | None = None
    limit_s: float | None = None


@dataclass(frozen=True)
class Graphs(Event):
    """What the graph runner (templates/rocmfix_graphs.py) did here: ``status`` ok (each graph
    captured and its replay equal to eager), failed, error, or unavailable (no GPU); the
    device memory each graph of a small conv net held, at ``shapes``, and the runner's caps in
    force (its settings, as the environment sets them)."""

    EVENT = "graphs"
    status: Status
    message: str | None = None
    shapes: list[str] = field(default_factory=list)
    held_bytes: list[int] = field(default_factory=list)
    caps: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class KernelWarning(Event):
    """A template's own warning (they all start "rocmfix:")."""

    EVENT = "warning"
    code: str
    message: str


@dataclass(frozen=True)
class Fatal(Event):
    """Something outside any item went wrong; the worker ends."""

    EVENT = "fatal"
    message: str
    traceback: str | None = None


@dataclass(frozen=True)
class End(Event):
    EVENT = "end"


@dataclass(frozen=True)
class Plan(Event):
    """How many candidates tune will try for one target."""

    EVENT = "plan"
    id: str
    total: int


@dataclass(frozen=True)
class Tried(Event):
    """Tune's progress: candidate ``index`` of ``total`` for one target is done."""

    EVENT = "candidate"
    id: str
    index: int
    total: int
    status: Status
    ms: float | None = None


@dataclass(frozen=True)
class CandidateRow(Message):
    """One config tune tried: ``role`` shipped, current (the tuned file's) or grid."""

    config: dict[str, Any]
    role: str
    status: Status  # ok, failed, error, rejected (compile), skipped (budget)
    ms: float | None = None
    kernel_ms: float | None = None
    rel_err: float | None = None
    message: str | None = None
    compiled: dict[str, Any] | None = None


@dataclass(frozen=True)
class Tuned(Event):
    """One tune target's search; the kernel's fields are absent where it never loaded."""

    EVENT = "tuned"
    id: str
    status: Status
    message: str | None = None
    traceback: str | None = None
    kernel: str = ""
    arch: str = "?"
    key: str = ""
    precision: str = ""
    shape: dict[str, Any] | None = None
    tolerance: float | None = None
    method: str | None = None
    candidates: list[CandidateRow] = field(default_factory=list)


@dataclass(frozen=True)
class Resolved(Event):
    """The config a fresh process's kernel resolves for one tune target (tune's proof)."""

    EVENT = "resolved"
    id: str
    arch: str | None = None
    key: str | None = None
    config: dict[str, Any] | None = None
    error: str | None = None


@dataclass(frozen=True)
class Checked(Event):
    """One ahead-of-time compile: the item it was, and what the compiler made of it."""

    EVENT = "checked"
    op: str
    scheme: str
    shape: str
    dtype: str
    arch: str
    template: str
    ok: bool
    problems: list[str] = field(default_factory=list)
    config: dict[str, Any] | None = None
    id: str | None = None
    kernel: str | None = None
    operands: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    constexprs: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    traceback: str | None = None
    registers: int | None = None
    spills: int = 0
    sgpr_spills: int = 0
    scratch: int = 0
    shared: int = 0
    shared_limit: int = 0
    waves: int | None = None
    matrix: int = 0
    matrix_wanted: str | None = None


AnyEvent = Union[
    Hello, Start, First, Measured, Graphs, KernelWarning, Fatal, End, Plan, Tried, Tuned,
    Resolved, Checked
]  # fmt: skip
EVENTS: dict[str, type[Event]] = {
    cls.EVENT: cls for cls in _CLASSES.values() if issubclass(cls, Event) and cls.EVENT
}


def parse_event(data: object) -> AnyEvent:
    """One event as the worker sent it (a decoded JSON line), checked."""
    if not isinstance(data, dict):
        raise ProtocolError(f"event: expected a JSON object, got {_kind(data)}")
    kind = data.get("event")
    cls = EVENTS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown event {str(kind)[:40]!r}")
    event: AnyEvent = cls.parse(data, kind)  # type: ignore[assignment]
    return event
