"""Frozen results the engine returns and the renderer shows. Nothing here prints."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .checks import EnvWarning
from .environment import Environment
from .manifest import Pending
from .patch import Patch


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
