"""``rocmfix kernels``: every Triton kernel rocmfix drops, compiled ahead of time for the GPUs
its users have (none of which this machine needs to have), with what the compiler made of it.

The compiling runs in the target interpreter, with its Triton (:mod:`rocmfix.guest.check`),
from the templates' own config resolution and launch preparation. A kernel fails the check
when it does not compile, spills registers or uses scratch, needs more shared memory (LDS)
than the GPU has per workgroup, or lacks a matrix instruction the GPU has for its operands.
Nothing here prints.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import worker
from .environment import Environment
from .guest import protocol
from .guest.aot import TARGETS
from .ops import OPS, Op
from .results import KernelCheck, KernelsReport, extended

IDLE_LIMIT_S = 300.0
ARCHS = tuple(TARGETS)


def _label(event: protocol.Checked, ops: Sequence[Op]) -> str:
    """The op's own words for the shape, in the dtype this row compiled."""
    for op in ops:
        for shape in (*op.tune, *op.cases):
            if shape.id == event.shape:
                return op.label({**shape.gpu, "dtype": event.dtype})
    return event.shape


def _check(event: protocol.Checked, ops: Sequence[Op]) -> KernelCheck:
    kernel = event.kernel or event.template
    return extended(KernelCheck, event, kernel=kernel, shape_label=_label(event, ops))


def _planned(ops: Sequence[Op], archs: Sequence[str]) -> int:
    return sum(
        sum(1 for s in op.schemes if s.needs_triton) * len(op.tune) * len(op.dtypes) * len(archs)
        for op in ops
    )


def _supervised(
    env: Environment, body: protocol.Request, total: int, progress: worker.Progress
) -> worker.Answer:
    done = [0]

    def seen(event: protocol.AnyEvent) -> None:
        if isinstance(event, protocol.Checked):
            done[0] += 1
            progress(done[0], total, f"{event.kernel or event.op} on {event.arch}")

    # One compile takes seconds; a Triton that hangs in its compiler is stopped by the idle
    # limit rather than by a total one that would depend on how many archs were asked for.
    return worker.run(
        env.python.executable,
        body,
        limit_for=lambda _item: IDLE_LIMIT_S,
        listen=seen,
        idle_limit_s=IDLE_LIMIT_S,
    )


def run(
    env: Environment,
    *,
    archs: Sequence[str] = ARCHS,
    ops: Sequence[Op] = OPS,
    progress: worker.Progress = lambda _done, _total, _label: None,
) -> KernelsReport:
    """Every Triton scheme's kernel at MinerU's shapes, in each dtype, for each of ``archs``."""
    worker.needs_torch(env, "compile")
    body = worker.request("check", ops, archs=list(archs))
    answer = _supervised(env, body, _planned(ops, archs), progress)
    return KernelsReport(
        environment=env,
        device=answer.device,
        checks=tuple(_check(e, ops) for e in answer.of(protocol.Checked)),
        worker_error=answer.fatal,
        worker_log=answer.stderr_tail,
    )


def compile_items(
    env: Environment, ops: Sequence[Op], items: Sequence[protocol.CompileItem]
) -> dict[str, KernelCheck]:
    """Explicit compiles (``doctor``'s: the config each case ran, for the GPU it ran on), by
    item id; an item the worker gave no answer for is left out."""
    worker.needs_torch(env, "compile")
    body = worker.request("check", ops, compiles=list(items))
    answer = _supervised(env, body, len(items), lambda _d, _t, _l: None)
    return {str(e.id): _check(e, ops) for e in answer.of(protocol.Checked)}
