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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from . import __version__, supervise, tuned, worker
from .environment import Environment
from .errors import RefusedError, UsageError
from .manifest import now
from .ops import OPS, Op

SCHEMA = "rocmfix-tune/1"
MIN_GAIN = 0.03
DEFAULT_BUDGET_S = 300.0


@dataclass(frozen=True)
class Candidate:
    config: Mapping[str, Any]
    role: str
    status: str
    # What users get on a GPU: eager calls through the patched entry point.
    ms: float | None
    rel_err: float | None
    message: str | None
    # Registers, spills and LDS of its ahead-of-time compile for the GPU tune ran on.
    compiled: Mapping[str, Any] | None = None
    # The kernel alone (CUDA-graph replay), where the GPU can record it.
    kernel_ms: float | None = None


@dataclass(frozen=True)
class KernelResult:
    id: str
    kernel: str
    arch: str
    key: str
    precision: str
    status: str
    message: str | None
    method: str | None
    shipped: Candidate | None
    # The fastest correct candidate, and what the kernels will use: it, or the shipped one.
    fastest: Candidate | None
    best: Candidate | None
    candidates: tuple[Candidate, ...]
    tuned: bool
    verified: bool | None
    resolved: Mapping[str, Any] | None

    @property
    def gain(self) -> float | None:
        """Shipped time over the fastest candidate's (> 1: the candidate is faster)."""
        if self.shipped is None or self.fastest is None:
            return None
        if not self.shipped.ms or not self.fastest.ms:
            return None
        return self.shipped.ms / self.fastest.ms


@dataclass(frozen=True)
class TuneReport:
    environment: Environment
    device: worker.DeviceInfo
    path: str
    kernels: tuple[KernelResult, ...]
    stored: tuned.StoreResult | None
    min_gain: float
    budget_s: float
    worker_error: str | None
    worker_log: str

    @property
    def failures(self) -> tuple[str, ...]:
        out = []
        for k in self.kernels:
            if k.status != "ok":
                out.append(f"{k.id}: {k.status}" + (f": {k.message}" if k.message else ""))
            elif k.verified is False:
                out.append(f"{k.id}: a fresh process did not resolve the stored config")
        if self.worker_error:
            out.append(f"worker: {self.worker_error}")
        return tuple(out)

    @property
    def ok(self) -> bool:
        return not self.failures


def _candidate(raw: Mapping[str, Any]) -> Candidate:
    return Candidate(
        config=raw.get("config") or {},
        role=str(raw.get("role", "grid")),
        status=str(raw.get("status", "error")),
        ms=raw.get("ms"),
        rel_err=raw.get("rel_err"),
        message=raw.get("message"),
        compiled=raw.get("compiled"),
        kernel_ms=raw.get("kernel_ms"),
    )


def _no_slower_kernel(candidate: Candidate, shipped: Candidate, min_gain: float) -> bool:
    """Where the host's launch cost sets the eager time, tiles tie there and noise would pick
    one: a winner's kernel must be no slower than the shipped one's either."""
    if candidate.kernel_ms is None or shipped.kernel_ms is None:
        return True
    return candidate.kernel_ms <= shipped.kernel_ms * (1.0 + min_gain)


def _result(event: Mapping[str, Any], min_gain: float) -> KernelResult:
    candidates = tuple(_candidate(c) for c in event.get("candidates") or [])
    shipped = candidates[0] if candidates else None
    timed = [c for c in candidates if c.status == "ok" and c.ms is not None]
    best = min(timed, key=lambda c: c.ms or 0.0) if timed else None
    status = str(event.get("status", "error"))
    message = event.get("message")
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
        and best.ms <= shipped.ms * (1.0 - min_gain)
        and _no_slower_kernel(best, shipped, min_gain)
    )
    return KernelResult(
        id=str(event.get("id")),
        kernel=str(event.get("kernel", "")),
        arch=str(event.get("arch", "?")),
        key=str(event.get("key", "")),
        precision=str(event.get("precision", "")),
        status=status,
        message=message,
        method=event.get("method"),
        shipped=shipped,
        fastest=best,
        best=best if win else shipped,
        candidates=candidates,
        tuned=win,
        verified=None,
        resolved=None,
    )


def run(
    env: Environment,
    *,
    ops: Sequence[Op] = OPS,
    budget_s: float = DEFAULT_BUDGET_S,
    min_gain: float = MIN_GAIN,
    interpret: bool = False,
    progress: worker.Progress | None = None,
) -> TuneReport:
    """Search, store the winners, and read them back in a fresh process."""
    if budget_s <= 0:
        raise UsageError("--budget must be more than 0 seconds")
    if env.torch is None:
        raise RefusedError(
            f"torch is not installed in {env.python.executable}: there is nothing to tune",
            hint="point --python at the interpreter that runs MinerU",
        )
    path = tuned.tuned_path()
    targets = [t.id for op in ops for t in op.tune]
    request = {
        **worker.request("tune", ops),
        "budget_s": budget_s,
        "interpret": interpret,
        "require_gpu": not interpret,
    }
    planned: dict[str, int] = {}
    done: dict[str, int] = {}

    def on_event(event: supervise.Event) -> None:
        kind = event.get("event")
        kid = str(event.get("id"))
        if kind == "plan":
            planned[kid] = int(event.get("total") or 0)
        elif kind == "candidate":
            done[kid] = int(event.get("index", 0)) + 1
        elif kind == "tuned":
            done[kid] = planned.get(kid, 0)
        else:
            return
        if progress is not None:
            # Kernels not planned yet count as one step each, so the bar never runs backwards
            # by much when their grids arrive.
            total = sum(planned.get(t, 1) for t in targets)
            progress(sum(done.values()), total, f"{kid}: {event.get('status', 'planned')}")

    # Compiles and the confirm round come on top of the search budget.
    slack = budget_s + 600.0
    outcome = supervise.run(
        env.python.executable,
        request,
        limit_for=lambda _item: slack,
        on_event=on_event,
        item_ids=targets,
        idle_limit_s=slack,
    )
    if outcome.hello is None:
        raise worker.WorkerError(env.python.executable, outcome)
    device = worker.device(outcome.hello)
    if device.kind != "gpu" and not interpret:
        raise RefusedError(
            f"no GPU is visible to {env.python.executable} (torch {device.torch}): "
            "there is nothing to tune",
            hint="`rocmfix doctor` checks the kernels on the CPU",
        )
    results = [_result(e, min_gain) for e in outcome.events if e.get("event") in ("tuned", "item")]
    entries = [
        tuned.TunedEntry(
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
        stored = tuned.store(path, entries, meta)
        results = _verify(env, request, results)
    return TuneReport(
        environment=env,
        device=device,
        path=str(path),
        kernels=tuple(results),
        stored=stored,
        min_gain=min_gain,
        budget_s=budget_s,
        worker_error=outcome.fatal,
        worker_log=outcome.stderr_tail,
    )


def _verify(
    env: Environment, request: Mapping[str, Any], results: list[KernelResult]
) -> list[KernelResult]:
    """Read the file back the way the kernels will: in a new process, from their own code."""
    body = dict(request, mode="resolve")
    outcome = supervise.run(
        env.python.executable, body, limit_for=lambda _item: 300.0, on_event=lambda _e: None
    )
    resolved = {str(e.get("id")): e for e in outcome.events if e.get("event") == "resolved"}
    out = []
    for result in results:
        event = resolved.get(result.id)
        if result.status != "ok" or event is None or result.best is None:
            out.append(result)
            continue
        config = event.get("config")
        expected = result.best.config
        ok = (
            isinstance(config, dict)
            and event.get("arch") == result.arch
            and all(config.get(k) == v for k, v in expected.items())
        )
        resolved_config = config if isinstance(config, dict) else None
        out.append(replace(result, verified=ok, resolved=resolved_config))
    return out


def reset() -> tuple[str, bool]:
    """Remove the tuned file; the kernels go back to their shipped configs."""
    path = tuned.tuned_path()
    return str(path), tuned.reset(path)
