"""status, apply and revert: what the CLI calls on the write side.

Each returns a frozen result and raises :class:`~rocmfix.errors.RocmfixError`; nothing here
prints. ``status`` only reads. ``apply`` and ``revert`` plan without the lock first (a run
with nothing to do needs no write access), then take the environment's lock, finish any run
that was interrupted, plan again if anything moved meanwhile, and execute the plan as one
transaction.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from rocmfix import fsops
from rocmfix.checks import EnvWarning, environment_warnings
from rocmfix.environment import Environment, default_python_hint
from rocmfix.errors import Interrupted, LockBusyError, ManifestError, RefusedError, RocmfixError
from rocmfix.manifest import Manifest
from rocmfix.patch import Patch
from rocmfix.registry import all_patches, check_scheme
from rocmfix.results import Action, FileChange, Outcome, RunResult, StatusReport, Verdict
from rocmfix.state import StateDir
from rocmfix.write.plan import Plan, plan_apply, plan_revert
from rocmfix.write.transaction import (
    check_pending,
    check_record,
    check_sites,
    check_writable,
    execute,
    foreign,
    recover,
)
from rocmfix.write.verdicts import check_entry, git_budget, inspect, pending_patches

# What the three commands tell their caller while they wait on something slow (one line).
Waiting = Callable[[str], None]


def _asking_git(
    env: Environment, patches: Sequence[Patch], waiting: Waiting | None
) -> contextlib.AbstractContextManager[None]:
    """One git budget for the run; ``waiting`` hears once what it waits on, if it is long."""
    names = sorted(
        {
            p.distribution
            for p in patches
            if (dist := env.distributions.get(p.distribution)) is not None and dist.editable
        }
    )
    if waiting is None or not names:
        return git_budget()
    count = f"{len(names)} editable install{'s' if len(names) != 1 else ''}"
    line = f"asking git about {count} ({', '.join(names)}) ..."
    return git_budget(lambda: waiting(line))


def status(
    env: Environment,
    patches: Sequence[Patch],
    *,
    explicit: Collection[str] = (),
    waiting: Waiting | None = None,
) -> StatusReport:
    """What is installed, patched and needed, and why. Reads only; creates nothing.
    ``explicit``: the patch ids the user named (``--only``)."""
    with _asking_git(env, patches, waiting):
        return _status(env, patches, explicit)


def _status(env: Environment, patches: Sequence[Patch], explicit: Collection[str]) -> StatusReport:
    state = env.state
    problem = None
    try:
        manifest = state.load()
    except ManifestError as exc:
        # The README's promise: status still shows the environment; --check fails.
        manifest, problem = Manifest(), exc.message
    busy = state.busy()
    shadowed = foreign(env, manifest, patches)
    if shadowed:
        # Another tree's copy: the record's entries describe files this run does not see.
        entries = {k: v for k, v in manifest.entries.items() if v.distribution not in shadowed}
        manifest = replace(manifest, entries=entries)
    try:
        check_pending(env, manifest.pending, all_patches())
    except ManifestError as exc:
        problem = exc.message
    for patch in patches:
        entry = manifest.entries.get(patch.id)
        try:
            if entry is not None:
                check_entry(patch, entry)
        except ManifestError as exc:
            # Shown as the state's problem; the patch reads as if no entry named it.
            problem = exc.message
            entries = {k: v for k, v in manifest.entries.items() if k != patch.id}
            manifest = replace(manifest, entries=entries)
    warnings = environment_warnings(env)
    if shadowed:
        where = ", ".join(f"{n} in {env.distributions[n].location}" for n in shadowed)
        warnings = (
            EnvWarning(
                "shadowed",
                f"{where} shadows the copy that rocmfix's record ({state.root}) is about; "
                "that record is not read for it",
                f"run rocmfix without that tree on PYTHONPATH to see {state.prefix}",
            ),
            *warnings,
        )
    if busy:
        warnings = (
            EnvWarning(
                "run-in-progress",
                f"{state.busy_error().message}: what this shows may change when it finishes",
                "run `rocmfix status` again once it has finished",
            ),
            *warnings,
        )
    interrupted = pending_patches(patches, manifest.pending)
    inspected = tuple(
        inspect(env, p, manifest, interrupted, busy, explicit).status for p in patches
    )
    hint = None
    if all(s.verdict is Verdict.NOT_INSTALLED for s in inspected):
        hint = default_python_hint() or (
            "none of the target packages is installed in this interpreter; point rocmfix at "
            "the environment that runs MinerU with --python PATH"
        )
    return StatusReport(
        environment=env,
        patches=inspected,
        pending=manifest.pending,
        busy=busy,
        hint=hint,
        warnings=warnings,
        state_problem=problem,
    )


def refuse_if_busy(python: str | None) -> None:
    """Before the probe (seconds, on a large environment): fail at once where another run
    holds the lock of the interpreter's own prefix (a venv's or conda env's, found beside
    the interpreter as Python finds it), where the record of most environments is. The
    probe says where the record really is; the run checks that lock again then."""
    if python is None:
        prefix = Path(sys.prefix)
    else:
        prefix = Path(os.path.abspath(python)).parent.parent
        if not any((prefix / marker).exists() for marker in ("pyvenv.cfg", "conda-meta")):
            return
    state = StateDir(prefix / "share" / "rocmfix", prefix)
    try:
        state.check_layout()  # a state folder that is a link is never read through
    except ManifestError:
        return
    if state.busy():
        raise state.busy_error()


def _still_current(changes: Sequence[FileChange]) -> bool:
    """Whether every file a plan starts from still holds the bytes the plan read."""
    for change in changes:
        try:
            if fsops.read_regular(change.path) != change.before:
                return False
        except fsops.NotRegularError:
            return False
    return True


def apply(
    env: Environment,
    patches: Sequence[Patch],
    *,
    scheme: str | None = None,
    force: bool = False,
    dry_run: bool = False,
    explicit: Collection[str] = (),
    waiting: Waiting | None = None,
) -> RunResult:
    """Rewrite every selected target that needs it, all or nothing."""
    with _asking_git(env, patches, waiting), _interrupt_said("apply", env):
        check_scheme(patches, scheme)
        state = env.state
        if dry_run:
            return _apply_locked(env, patches, scheme, force, True, explicit, held=False)
        if state.busy():
            # Planning now would read another run's half-written files as someone's edits.
            raise state.busy_error()
        # The lock is taken before planning (its compile check runs the target interpreter), so
        # that a run started beside another fails at once, not after planning too. Where it
        # cannot be taken (a state folder this user may not write, a lock that is a link), the
        # run plans without it: one with nothing to do needs no write access, and one with work
        # refuses below, on the same error.
        early = contextlib.ExitStack()
        try:
            early.enter_context(state.locked())
            held = True
        except LockBusyError:
            raise
        except RocmfixError:
            held = False
        with early:
            try:
                return _apply_locked(env, patches, scheme, force, False, explicit, held=held)
            finally:
                if held:
                    state.tidy()


def _apply_locked(
    env: Environment,
    patches: Sequence[Patch],
    scheme: str | None,
    force: bool,
    dry_run: bool,
    explicit: Collection[str],
    *,
    held: bool,
) -> RunResult:
    """Plan and write; ``held``: this run holds the lock already."""
    state = env.state
    manifest = state.load()
    check_record(env, manifest, patches)
    plan: Plan | None = None
    if manifest.pending is None:
        # Under the lock taken early, or without it where it could not be: a run with
        # nothing to do must not need write access.
        plan = plan_apply(env, patches, manifest, scheme, force, explicit)
        if dry_run or not plan.changes_anything(manifest):
            return _result(env, "apply", plan, dry_run)
    elif dry_run:
        raise RefusedError(
            "an earlier rocmfix run was interrupted",
            hint="run `rocmfix apply` or `rocmfix revert` to finish it first",
        )
    if plan is not None:
        check_sites(env, plan.changes)
        check_writable(plan.changes, state)
    state.check_writable()
    # Tidying happens under the lock: another run holding it may have backups and no
    # journal yet, which an unlocked tidy would take for leftovers and delete.
    with contextlib.nullcontext() if held else state.locked():
        try:
            locked = state.load()
            check_record(env, locked, patches)
            locked, recovered = recover(env, locked, all_patches())
            if plan is None or locked != manifest or not _still_current(plan.changes):
                plan = plan_apply(env, patches, locked, scheme, force, explicit)
            _remove_leftovers(plan)
            if plan.changes_anything(locked):
                check_sites(env, plan.changes)
                execute(state, locked, plan, "apply")
        finally:
            state.tidy()
    return _result(env, "apply", plan, False, recovered)


def revert(
    env: Environment,
    patches: Sequence[Patch],
    *,
    force: bool = False,
    waiting: Waiting | None = None,
) -> RunResult:
    """Put back the original bytes of every selected patched file and remove dropped files."""
    with _asking_git(env, patches, waiting), _interrupt_said("revert", env):
        return _revert(env, patches, force)


@contextlib.contextmanager
def _interrupt_said(op: str, env: Environment) -> Iterator[None]:
    """A Ctrl-C becomes one line that says what state the run left. Mid-write the
    transaction says it (it rolls back); before that nothing was written, unless the run
    was finishing an earlier one's journal, which then stays for the next run."""
    try:
        yield
    except KeyboardInterrupt:
        if not env.state.busy() and _journal_left(env):
            raise Interrupted(
                f"{op} was interrupted while it finished an earlier interrupted run",
                hint="`rocmfix status` says where each file stands; `rocmfix revert` "
                "finishes the rollback",
            ) from None
        # What a run cut short while it took the lock leaves (its state folder) goes too.
        with contextlib.suppress(RocmfixError):
            _tidy_unlocked(env.state)
        raise Interrupted(
            f"{op} was interrupted before it changed a file: the environment is as it was"
        ) from None


def _journal_left(env: Environment) -> bool:
    try:
        return env.state.load().pending is not None
    except ManifestError:
        return False


def _revert(env: Environment, patches: Sequence[Patch], force: bool) -> RunResult:
    state = env.state
    manifest = state.load()
    check_record(env, manifest, patches)
    if state.busy():
        # A run holding the lock may have written backups and no journal yet, or be about to
        # save its entries: "nothing to revert" would be false seconds later.
        raise state.busy_error()
    if manifest.pending is None and not any(p.id in manifest.entries for p in patches):
        if not manifest.entries:
            _tidy_unlocked(state)
            return RunResult(env, "revert", (), (), False, warnings=environment_warnings(env))
        # `--only` named patches that are not applied, beside ones that are: say which.
        return RunResult(
            env,
            "revert",
            tuple(Outcome(p, Action.SKIP, "not applied") for p in patches),
            (),
            False,
            warnings=environment_warnings(env),
            applied=tuple(sorted(manifest.entries)),
        )
    state.check_writable()
    with state.locked():
        try:
            manifest = state.load()
            check_record(env, manifest, patches)
            manifest, recovered = recover(env, manifest, all_patches())
            plan = plan_revert(env, patches, manifest, force)
            _remove_leftovers(plan)
            if plan.changes_anything(manifest):
                execute(state, manifest, plan, "revert")
        finally:
            state.tidy()
    return _result(env, "revert", plan, False, recovered)


def _remove_leftovers(plan: Plan) -> None:
    """Temporary files that runs killed mid-write left beside the files this run writes
    (under the lock, so no run is writing them now)."""
    for folder in sorted({c.path.parent for c in plan.changes}):
        fsops.remove_temp_files(folder)


def _tidy_unlocked(state: StateDir) -> None:
    """Leftovers of a run killed before its journal, unless a run holds the lock right now:
    then they are its backups."""
    if state.left_behind():
        with contextlib.suppress(LockBusyError, OSError), state.locked():
            state.tidy()


def _result(
    env: Environment, command: str, plan: Plan, dry_run: bool, recovered: tuple[str, ...] = ()
) -> RunResult:
    warnings = environment_warnings(env)
    return RunResult(env, command, plan.outcomes, plan.changes, dry_run, recovered, warnings)
