"""``rocmfix kernels``: every Triton kernel rocmfix drops, compiled ahead of time for the GPUs
its users have (none of which this machine needs to have), with what the compiler made of it.

The compiling runs in the target interpreter, with its Triton (:mod:`rocmfix.guest.check`),
from the templates' own config resolution and launch preparation. A kernel fails the check
when it does not compile, spills registers or uses scratch, needs more shared memory (LDS)
than the GPU has per workgroup, or lacks a matrix instruction the GPU has for its operands.
Nothing here prints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import supervise, worker
from .environment import Environment
from .errors import RefusedError, UsageError
from .guest.aot import TARGETS
from .ops import OPS, Op

SCHEMA = "rocmfix-kernels/1"
IDLE_LIMIT_S = 300.0
ARCHS = tuple(TARGETS)


@dataclass(frozen=True)
class KernelCheck:
    op: str
    scheme: str
    kernel: str
    shape: str
    shape_label: str
    dtype: str
    arch: str
    ok: bool
    registers: int | None
    spills: int
    sgpr_spills: int
    scratch: int
    shared: int
    shared_limit: int
    waves: int | None
    matrix: int
    matrix_wanted: str | None
    operands: str | None
    options: Mapping[str, Any]
    constexprs: Mapping[str, Any]
    problems: tuple[str, ...]


@dataclass(frozen=True)
class KernelsReport:
    environment: Environment
    device: worker.DeviceInfo
    checks: tuple[KernelCheck, ...]
    worker_error: str | None
    worker_log: str

    @property
    def failures(self) -> tuple[str, ...]:
        out = [
            f"{c.kernel} {c.dtype} {c.shape} on {c.arch}: {problem}"
            for c in self.checks
            for problem in c.problems
        ]
        if self.worker_error:
            out.append(f"worker: {self.worker_error}")
        return tuple(out)

    @property
    def ok(self) -> bool:
        return not self.failures


def select_archs(names: Sequence[str]) -> tuple[str, ...]:
    unknown = [n for n in names if n not in ARCHS]
    if unknown:
        raise UsageError(
            f"unknown arch {', '.join(unknown)}", hint=f"choose from {', '.join(ARCHS)}"
        )
    return tuple(a for a in ARCHS if a in names) if names else ARCHS


def _label(event: Mapping[str, Any], ops: Sequence[Op]) -> str:
    """The op's own words for the shape, in the dtype this row compiled."""
    for op in ops:
        for target in op.tune:
            if target.id == event.get("shape"):
                return op.label({**target.gpu, "dtype": event.get("dtype")})
        for case in op.cases:
            if case.id == event.get("shape"):
                return op.label({**case.gpu, "dtype": event.get("dtype")})
    return str(event.get("shape"))


def _check(event: Mapping[str, Any], ops: Sequence[Op]) -> KernelCheck:
    return KernelCheck(
        op=str(event.get("op")),
        scheme=str(event.get("scheme")),
        kernel=str(event.get("kernel") or event.get("template")),
        shape=str(event.get("shape")),
        shape_label=_label(event, ops),
        dtype=str(event.get("dtype")),
        arch=str(event.get("arch")),
        ok=bool(event.get("ok")),
        registers=event.get("registers"),
        spills=int(event.get("spills") or 0),
        sgpr_spills=int(event.get("sgpr_spills") or 0),
        scratch=int(event.get("scratch") or 0),
        shared=int(event.get("shared") or 0),
        shared_limit=int(event.get("shared_limit") or 0),
        waves=event.get("waves"),
        matrix=int(event.get("matrix") or 0),
        matrix_wanted=event.get("matrix_wanted"),
        operands=event.get("operands"),
        options=dict(event.get("options") or {}),
        constexprs=dict(event.get("constexprs") or {}),
        problems=tuple(str(p) for p in event.get("problems") or ()),
    )


def _planned(ops: Sequence[Op], archs: Sequence[str]) -> int:
    return sum(
        sum(1 for s in op.schemes if s.needs_triton) * len(op.tune) * len(op.dtypes) * len(archs)
        for op in ops
    )


def _supervised(
    env: Environment, request: Mapping[str, Any], total: int, progress: worker.Progress
) -> supervise.WorkerRun:
    done = [0]

    def seen(event: Mapping[str, Any]) -> None:
        if event.get("event") == "checked":
            done[0] += 1
            what = event.get("kernel") or event.get("op")
            progress(done[0], total, f"{what} on {event.get('arch')}")

    # One compile takes seconds; a Triton that hangs in its compiler is stopped by the idle
    # limit rather than by a total one that would depend on how many archs were asked for.
    outcome = supervise.run(
        env.python.executable,
        request,
        limit_for=lambda _item: IDLE_LIMIT_S,
        on_event=seen,
        idle_limit_s=IDLE_LIMIT_S,
    )
    if outcome.hello is None:
        raise worker.WorkerError(env.python.executable, outcome)
    return outcome


def _needs_torch(env: Environment) -> None:
    if env.torch is None:
        raise RefusedError(
            f"torch is not installed in {env.python.executable}: there is nothing to compile",
            hint="point --python at the interpreter that runs MinerU",
        )


def run(
    env: Environment,
    *,
    archs: Sequence[str] = ARCHS,
    ops: Sequence[Op] = OPS,
    progress: worker.Progress = lambda _done, _total, _label: None,
) -> KernelsReport:
    """Every Triton scheme's kernel at MinerU's shapes, in each dtype, for each of ``archs``."""
    _needs_torch(env)
    request = {**worker.request("check", ops), "archs": list(archs)}
    outcome = _supervised(env, request, _planned(ops, archs), progress)
    checks = tuple(_check(e, ops) for e in outcome.events if e.get("event") == "checked")
    return KernelsReport(
        environment=env,
        device=worker.device(outcome.hello),
        checks=checks,
        worker_error=outcome.fatal,
        worker_log=outcome.stderr_tail,
    )


def compile_items(
    env: Environment, ops: Sequence[Op], items: Sequence[Mapping[str, Any]]
) -> dict[str, KernelCheck]:
    """Explicit compiles (``doctor``'s: the config each case ran, for the GPU it ran on), by
    item id; an item the worker gave no answer for is left out."""
    _needs_torch(env)
    request = {**worker.request("check", ops), "items": [dict(i) for i in items]}
    outcome = _supervised(env, request, len(items), lambda _d, _t, _l: None)
    return {str(e.get("id")): _check(e, ops) for e in outcome.events if e.get("event") == "checked"}
