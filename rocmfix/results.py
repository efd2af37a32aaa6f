"""Frozen results the engine returns and the renderer shows (the write side's, and the
reports of doctor, kernels and tune). Nothing here prints."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from .checks import EnvWarning
from .environment import Environment
from .guest import protocol
from .manifest import Pending
from .ops import Case, Op
from .patch import Patch
from .tuned_file import StoreResult


class Verdict(enum.Enum):
    NOT_INSTALLED = "not-installed"
    NOT_NEEDED = "not-needed"
    APPLICABLE = "applicable"
    APPLIED = "applied"
    CHANGED = "changed"
    STALE = "stale"
    UNSUPPORTED = "unsupported"
    INTERRUPTED = "interrupted"
    # The code needs the patch, but whether this GPU's vendor op is slow is measured, and
    # ``doctor`` has not measured it here (rocmfix.measured).
    UNMEASURED = "unmeasured"

    @property
    def settled(self) -> bool:
        """Whether this is a state ``status --check`` accepts: nothing left to do."""
        return self in (Verdict.APPLIED, Verdict.NOT_NEEDED, Verdict.NOT_INSTALLED)


class Pristine(enum.Enum):
    """How rocmfix knows a target file holds the bytes its package shipped."""

    RECORD = "matches the hash in the package's RECORD"
    MANIFEST = "matches the original rocmfix recorded"
    GIT = "is unmodified in its git checkout"
    UNKNOWN = "cannot be checked (no RECORD hash, not in git)"
    MODIFIED = "differs from the hash in the package's RECORD"
    GIT_MODIFIED = "has uncommitted changes in its git checkout"


@dataclass(frozen=True)
class PatchStatus:
    patch: Patch
    verdict: Verdict
    reason: str
    version: str | None
    path: Path | None
    scheme: str | None
    editable: bool
    pristine: Pristine | None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class StatusReport:
    environment: Environment
    patches: tuple[PatchStatus, ...]
    pending: Pending | None
    busy: bool
    hint: str | None = None
    warnings: tuple[EnvWarning, ...] = ()
    # rocmfix's own state names something it would never write: a tampered journal.
    state_problem: str | None = None

    @property
    def settled(self) -> bool:
        """Nothing left to do and nothing wrong: what ``status --check`` accepts."""
        return self.state_problem is None and all(p.verdict.settled for p in self.patches)


class ChangeKind(enum.Enum):
    """What a changed file is to rocmfix."""

    TARGET = "target"  # a patched file
    DROP = "drop"  # a dropped template
    RECORD = "record"  # a RECORD listing the drops


@dataclass(frozen=True)
class FileChange:
    """One file a run writes, creates or deletes. ``display`` is the path relative to the
    directory that holds the package, as ``patch -p1`` run there expects it."""

    kind: ChangeKind
    distribution: str
    rel: str
    path: Path
    display: str
    before: bytes | None
    after: bytes | None
    # A new file takes this file's mode and owner (the target beside a dropped file), so
    # whoever can read the package can read it, whatever the umask.
    mode_from: Path | None = None


class Action(enum.Enum):
    APPLY = "applied"
    REAPPLY = "re-applied"
    REVERT = "reverted"
    FORGET = "forgotten"
    UNCHANGED = "unchanged"
    SKIP = "skipped"
    ABSENT = "not installed"


@dataclass(frozen=True)
class Outcome:
    patch: Patch
    action: Action
    reason: str
    scheme: str | None = None
    # The checks --force overrode to do this, in a few words each (empty: none).
    forced: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunResult:
    """What apply or revert did (or, with ``dry_run``, would do)."""

    environment: Environment
    command: str
    outcomes: tuple[Outcome, ...]
    changes: tuple[FileChange, ...]
    dry_run: bool
    recovered: tuple[str, ...] = ()
    warnings: tuple[EnvWarning, ...] = ()
    # The patches rocmfix has applied here, where a revert selected none of them.
    applied: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.changes)


_R = TypeVar("_R")


def extended(cls: type[_R], event: protocol.Event, **more: Any) -> _R:
    """``event`` as ``cls``, a result that adds fields to the event's class, with ``more``."""
    return cls(**{**{f.name: getattr(event, f.name) for f in dataclasses.fields(event)}, **more})


class WorkerReport:
    """What the reports of the commands that run the worker (doctor, kernels, tune) share:
    their findings, then the worker's own error, make up the failures that exit 1."""

    worker_error: str | None

    def findings(self) -> Iterable[str]:
        """This report's own failures, one line each."""
        raise NotImplementedError

    @property
    def failures(self) -> tuple[str, ...]:
        out = list(self.findings())
        if self.worker_error:
            out.append(f"worker: {self.worker_error}")
        return tuple(out)

    @property
    def ok(self) -> bool:
        return not self.failures


# ---------------------------------------------------------------------------- doctor

# Eager time over this many times the kernel's: the call waits on the host, not the GPU
# (back-to-back calls overlap host and GPU, so a GPU-bound call's ratio is near 1).
LAUNCH_BOUND = 1.25


@dataclass(frozen=True)
class Measurement(protocol.Measured):
    """One implementation on one case, as the worker measured it (:class:`protocol.Measured`:
    ``ms`` is eager, back-to-back Python calls as MinerU makes them, what doctor's advice
    compares; ``kernel_ms`` the kernel alone, by CUDA-graph replay, None where a graph cannot
    record it), or ``missing`` where it never ran; ``compiled``: what the compiler made of the
    config it ran, for this GPU (Triton schemes only)."""

    impl: str = ""
    compiled: KernelCheck | None = None

    @property
    def checked(self) -> bool:
        return self.impl != "native"

    @property
    def launch_bound(self) -> bool:
        """The host's per-call cost, not the kernel, sets the eager time."""
        if self.status != "ok" or not self.ms or not self.kernel_ms:
            return False
        return self.ms > LAUNCH_BOUND * self.kernel_ms

    @property
    def failed(self) -> bool:
        """A kernel that gave a wrong result or broke: what makes doctor exit 1."""
        return self.checked and self.status in ("failed", "error", "crashed")


@dataclass(frozen=True)
class CaseResult:
    op: Op
    case: Case
    shape: Mapping[str, Any]
    native: Measurement
    schemes: tuple[Measurement, ...]
    # False in the interpreter, where a time says nothing about a kernel.
    timed: bool = True

    def speedup(self, scheme: Measurement) -> float | None:
        if not self.timed or scheme.status != "ok" or not scheme.ms:
            return None
        if self.native.status != "ok":
            return None
        return self.native.ms / scheme.ms if self.native.ms else None


@dataclass(frozen=True)
class OpReport:
    op: Op
    cases: tuple[CaseResult, ...]
    patches: tuple[PatchStatus, ...]
    needed: bool | None
    why: str
    recommended: str | None
    speedup: float | None
    speedup_at_least: bool
    advice: str
    totals: Mapping[str, float | None]


@dataclass(frozen=True)
class DoctorReport(WorkerReport):
    status: StatusReport
    device: protocol.DeviceFacts
    ops: tuple[OpReport, ...]
    time_limit_s: float
    tuned_file: str
    # GPU archs the tuned file has entries for (empty: no file, or nothing usable in it).
    tuned_archs: tuple[str, ...]
    tuned_exists: bool
    warnings: tuple[EnvWarning, ...]
    worker_error: str | None
    worker_log: str
    # The graph runner here: its caps, and on a GPU what a graph held (informative: a capture
    # that fails here runs eager in MinerU, with a warning).
    graphs: protocol.Graphs | None = None

    @property
    def environment(self) -> Environment:
        return self.status.environment

    def findings(self) -> Iterator[str]:
        for op in self.ops:
            for result in op.cases:
                for m in result.schemes:
                    if m.failed:
                        yield f"{result.case.id} {m.impl}: {m.status}"


# ---------------------------------------------------------------------------- kernels


@dataclass(frozen=True)
class KernelCheck(protocol.Checked):
    """One ahead-of-time compile as the worker reported it; ``kernel`` names the template
    where the worker named no kernel, and ``shape_label`` is the shape as the tables say it."""

    kernel: str = ""
    shape_label: str = ""


@dataclass(frozen=True)
class KernelsReport(WorkerReport):
    environment: Environment
    device: protocol.DeviceFacts
    checks: tuple[KernelCheck, ...]
    worker_error: str | None
    worker_log: str

    def findings(self) -> Iterator[str]:
        for c in self.checks:
            for problem in c.problems:
                yield f"{c.kernel} {c.dtype} {c.shape} on {c.arch}: {problem}"


# ---------------------------------------------------------------------------- tune


@dataclass(frozen=True)
class KernelResult(protocol.Tuned):
    """One tune target's search as the worker sent it (each config tried in ``candidates``:
    ``ms``, eager calls through the patched entry point, what users get on a GPU;
    ``kernel_ms``, the kernel alone), judged here: ``shipped`` (the first candidate), the
    fastest correct one, and what the kernels will use (``best``: it where it won, ``tuned``,
    else the shipped one); ``verified`` and ``resolved``: what a fresh process read back."""

    shipped: protocol.CandidateRow | None = None
    fastest: protocol.CandidateRow | None = None
    best: protocol.CandidateRow | None = None
    tuned: bool = False
    verified: bool | None = None
    resolved: Mapping[str, Any] | None = None

    @property
    def gain(self) -> float | None:
        """Shipped time over the fastest candidate's (> 1: the candidate is faster)."""
        if self.shipped is None or self.fastest is None:
            return None
        if not self.shipped.ms or not self.fastest.ms:
            return None
        return self.shipped.ms / self.fastest.ms


@dataclass(frozen=True)
class TuneReport(WorkerReport):
    environment: Environment
    device: protocol.DeviceFacts
    path: str
    kernels: tuple[KernelResult, ...]
    stored: StoreResult | None
    min_gain: float
    budget_s: float
    worker_error: str | None
    worker_log: str

    def findings(self) -> Iterator[str]:
        for k in self.kernels:
            if k.status != "ok":
                yield f"{k.id}: {k.status}" + (f": {k.message}" if k.message else "")
            elif k.verified is False:
                yield f"{k.id}: a fresh process did not resolve the stored config"
