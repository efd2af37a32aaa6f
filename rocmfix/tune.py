"""``rocmfix tune``: find each kernel's fastest correct tile config on this GPU, at MinerU's
shapes, and store it where the dropped-in kernels read it at import.

The search runs in the target interpreter (:mod:`rocmfix.worker`): the shipped config, the
currently tuned one and a bounded grid per kernel, each checked against fp64 and timed by
CUDA-graph replay (kernel time, no launch overhead). A candidate replaces the shipped
config only if it is at least ``MIN_GAIN`` faster in a final interleaved re-timing; otherwise
the shipped config stays (and an older tuned entry for that kernel is dropped). A fresh
process then reads the file back, which proves the kernels will pick it up. Nothing is tuned
at inference time. Nothing here prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from . import __version__, tuned_file, worker
from .environment import Environment
from .errors import RefusedError, UsageError
from .guest import protocol
from .manifest import now
from .ops import OPS, Op
from .results import KernelResult, TuneReport, extended

MIN_GAIN = 0.03
DEFAULT_BUDGET_S = 300.0


def _result(event: protocol.Tuned | protocol.Measured) -> KernelResult:
    if isinstance(event, protocol.Measured):
        # A target the worker timed out or died in: rocmfix.worker.run wrote an item for it.
        event = protocol.Tuned(id=event.id, status=event.status, message=event.message)
    candidates = tuple(event.candidates)
    shipped = candidates[0] if candidates else None
    timed = [c for c in candidates if c.status == "ok" and c.ms is not None]
    best = min(timed, key=lambda c: c.ms or 0.0) if timed else None
    status = event.status
    message = event.message
    if status == "ok" and (shipped is None or shipped.status != "ok"):
        # The shipped config itself gave a wrong result: the kernel is broken here.
        status = "failed"
        message = "the shipped config failed its check" + (
            f" ({shipped.message or shipped.status})" if shipped else ""
        )
    win = (
        status == "ok"
        and best is not None
        and shipped is not None
        and best is not shipped
        and shipped.ms is not None
        and best.ms is not None
        and best.ms <= shipped.ms * (1.0 - MIN_GAIN)
        # Where the host's launch cost sets the eager time, tiles tie there and noise would
        # pick one: a winner's kernel must be no slower than the shipped one's either.
        and (
            best.kernel_ms is None
            or shipped.kernel_ms is None
            or best.kernel_ms <= shipped.kernel_ms * (1.0 + MIN_GAIN)
        )
    )
    return extended(
        KernelResult,
        event,
        status=status,
        message=message,
        shipped=shipped,
        fastest=best,
        best=best if win else shipped,
        tuned=win,
    )


def run(
    env: Environment,
    *,
    ops: Sequence[Op] = OPS,
    budget_s: float = DEFAULT_BUDGET_S,
    interpret: bool = False,
    progress: worker.Progress | None = None,
) -> TuneReport:
    """Search, store the winners, and read them back in a fresh process."""
    if budget_s <= 0:
        raise UsageError("--budget must be more than 0 seconds")
    worker.needs_torch(env, "tune")
    path = tuned_file.tuned_path()
    targets = [t.id for op in ops for t in op.tune]
    body = worker.request(
        "tune", ops, budget_s=budget_s, interpret=interpret, require_gpu=not interpret
    )
    planned: dict[str, int] = {}
    done: dict[str, int] = {}

    def on_event(event: protocol.AnyEvent) -> None:
        if isinstance(event, protocol.Plan):
            planned[event.id] = event.total
            status = "planned"
        elif isinstance(event, protocol.Tried):
            done[event.id] = event.index + 1
            status = event.status
        elif isinstance(event, protocol.Tuned):
            done[event.id] = planned.get(event.id, 0)
            status = event.status
        else:
            return
        if progress is not None:
            # Kernels not planned yet count as one step each, so the bar never runs backwards
            # by much when their grids arrive.
            total = sum(planned.get(t, 1) for t in targets)
            progress(sum(done.values()), total, f"{event.id}: {status}")

    # Compiles and the confirm round come on top of the search budget.
    slack = budget_s + 600.0
    answer = worker.run(
        env.python.executable,
        body,
        limit_for=lambda _item: slack,
        listen=on_event,
        item_ids=targets,
        idle_limit_s=slack,
    )
    device = answer.device
    if device.kind != "gpu" and not interpret:
        raise RefusedError(
            f"no GPU is visible to {env.python.executable} (torch {device.torch}): "
            "there is nothing to tune",
            hint="`rocmfix doctor` checks the kernels on the CPU",
        )
    searched = (protocol.Tuned, protocol.Measured)
    results = [_result(e) for e in answer.events if isinstance(e, searched)]
    entries = [
        tuned_file.TunedEntry(
            r.kernel, r.arch, r.key, dict(r.best.config) if r.tuned and r.best else None
        )
        for r in results
        if r.status == "ok"
    ]
    stored = None
    if entries:
        meta = {
            r.arch: {
                "device": device.name or device.kind,
                "torch": device.torch,
                "triton": device.triton,
                "rocmfix": __version__,
                "tuned_at": now(),
            }
            for r in results
            if r.tuned
        }
        stored = tuned_file.store(path, entries, meta)
        results = _verify(env, body, results)
    return TuneReport(
        environment=env,
        device=device,
        path=str(path),
        kernels=tuple(results),
        stored=stored,
        min_gain=MIN_GAIN,
        budget_s=budget_s,
        worker_error=answer.fatal,
        worker_log=answer.stderr_tail,
    )


def _verify(
    env: Environment, body: protocol.Request, results: list[KernelResult]
) -> list[KernelResult]:
    """Read the file back the way the kernels will: in a new process, from their own code."""
    answer = worker.run(
        env.python.executable,
        replace(body, mode="resolve"),
        limit_for=lambda _item: 300.0,
        need_hello=False,
    )
    resolved = {e.id: e for e in answer.of(protocol.Resolved)}
    out = []
    for result in results:
        event = resolved.get(result.id)
        if result.status != "ok" or event is None or result.best is None:
            out.append(result)
            continue
        config = event.config
        expected = result.best.config
        ok = (
            config is not None
            and event.arch == result.arch
            and all(config.get(k) == v for k, v in expected.items())
        )
        out.append(replace(result, verified=ok, resolved=config))
    return out
