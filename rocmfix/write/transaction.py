"""The transaction: a plan's changes written all or nothing.

A run changes files in this order: backups of every file it will change, a manifest that names
every file about to change (the journal), the files themselves, then the final manifest. Each
file is replaced only if it still holds the bytes the plan read. A run that fails part-way,
or is interrupted (Ctrl-C), rolls back what it wrote; if the rollback cannot finish either
(the disk is failing), the journal and every backup stay, and the next ``apply`` or
``revert`` finishes it. A run killed
at any point leaves either nothing to do or a journal that the next run rolls back
(:func:`recover`). A journal is untrusted input like the rest of the state: every file it
names must be one a patch declares, inside the environment. Only :mod:`rocmfix.state` knows
where the manifest and the backups live.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path, PurePosixPath

from rocmfix import __version__, fsops
from rocmfix.environment import Distribution, Environment
from rocmfix.errors import Interrupted, ManifestError, RefusedError, WriteError
from rocmfix.manifest import (
    PYC_NAME,
    DroppedFile,
    Manifest,
    ManifestEntry,
    Pending,
    PendingFile,
    RecordState,
    now,
)
from rocmfix.patch import Patch
from rocmfix.results import ChangeKind, FileChange
from rocmfix.state import StateDir
from rocmfix.write.plan import Plan, record_rel


def _root(change: FileChange) -> Path:
    """The folder ``change.rel`` is relative to (site-packages, or a distribution's root)."""
    return change.path.parents[len(PurePosixPath(change.rel).parts) - 1]


def check_sites(env: Environment, changes: Sequence[FileChange]) -> None:
    """Refuse, before anything is written, a distribution installed outside the installation
    whose record ``env.state`` is: its record would be shared with every other package tree
    used with this interpreter. An editable install is the environment's wherever its
    checkout is (an egg-link's metadata lives in the checkout too)."""
    state = env.state
    for change in changes:
        dist = env.distributions.get(change.distribution)
        if dist is None or env.keeps_record(dist):
            continue
        raise RefusedError(
            f"nothing was changed: {dist.name} is installed in {dist.location}, outside "
            f"{state.prefix}, whose record ({state.root}) this run keeps: a package tree on "
            "PYTHONPATH, from pip install --target, or beside another site folder would "
            "share it",
            hint="install the package into the environment (or the user site) itself, "
            "or patch each site folder on its own with --only",
        )


def foreign(env: Environment, manifest: Manifest, patches: Sequence[Patch]) -> list[str]:
    """The distributions the record names (an entry of a selected patch, or the journal)
    that the probe found outside the record's installation: another tree shadows the copy
    the record is about, and its files are not the ones the record describes."""
    named = {p.distribution for p in patches if p.id in manifest.entries}
    if manifest.pending is not None:
        named |= {f.distribution for f in manifest.pending.files}
    return sorted(
        name
        for name in named
        if (dist := env.distributions.get(name)) is not None and not env.keeps_record(dist)
    )


def check_record(env: Environment, manifest: Manifest, patches: Sequence[Patch]) -> None:
    """Refuse a run that would act on a shadowing tree's files with the record of the copy
    it shadows (a revert would read them as reinstalled and drop the record's entry)."""
    state = env.state
    for name in foreign(env, manifest, patches):
        dist = env.distributions[name]
        raise RefusedError(
            f"nothing was changed: {name} is found in {dist.location}, outside "
            f"{state.prefix}, whose record ({state.root}) is about the {name} installed "
            "there, not this one",
            hint=f"run the command without that tree on PYTHONPATH to act on {state.prefix}",
        )


def check_inside(changes: Sequence[FileChange]) -> None:
    """Refuse, before anything is written, a file reached through a folder that links out of
    the environment: the same check a journal gets, so what apply writes, revert restores."""
    for change in changes:
        root = _root(change)
        if change.path.is_symlink() or not fsops.inside(change.path, root):
            raise RefusedError(
                f"nothing was changed: {change.path} is reached through a link out of the "
                f"environment ({change.path.parent.resolve()} is not under {root})",
                hint="rocmfix writes only inside the environment; put the real folder back, "
                "or patch the environment the link leads to",
            )


def check_writable(changes: Sequence[FileChange], state: StateDir) -> None:
    check_inside(changes)
    state.check_writable()
    for directory in sorted({c.path.parent for c in changes}):
        reason = fsops.unwritable_reason(directory)
        if reason is not None:
            raise RefusedError(
                f"nothing was changed: {directory} {reason}",
                hint=fsops.READ_ONLY_HINT
                if reason == fsops.READ_ONLY
                else "run rocmfix as the user who owns that environment, "
                "or patch a virtual environment you own",
            )


def _order(changes: Sequence[FileChange], reverting: bool) -> list[FileChange]:
    # Dropped modules go in before the file that imports them and come out after it, so a
    # process starting mid-run never imports a module that is not there; RECORD comes last.
    def rank(change: FileChange) -> int:
        if change.kind is ChangeKind.RECORD:
            return 2
        if change.kind is ChangeKind.DROP:
            deleting = change.after is None
            return 1 if deleting or reverting else 0
        return 0 if reverting else 1

    return sorted(changes, key=rank)


def _journal(op: str, changes: Sequence[FileChange]) -> Pending:
    return Pending(
        op=op,
        pid=os.getpid(),
        started_at=now(),
        files=tuple(
            PendingFile(
                kind="record" if c.kind is ChangeKind.RECORD else "file",
                distribution=c.distribution,
                path=c.rel,
                before=fsops.sha256(c.before) if c.before is not None else None,
                after=fsops.sha256(c.after) if c.after is not None else None,
            )
            for c in changes
        ),
    )


def _digest(data: bytes | None) -> str | None:
    return None if data is None else fsops.sha256(data)


def write(path: Path, data: bytes | None, expect: bytes | None, like: Path | None = None) -> None:
    """Put ``data`` (None: nothing) at ``path``, which must hold ``expect`` right then. A new
    file takes the mode of ``like`` (the file it is dropped beside), else of its folder."""
    if data is None:
        fsops.remove(path, expect=_digest(expect))
    else:
        stat = None
        for source in (path, like):
            if source is not None and stat is None:
                with contextlib.suppress(OSError):
                    stat = source.stat(follow_symlinks=False)
        fsops.atomic_write(path, data, like=stat, expect=_digest(expect))
    if path.suffix == ".py":
        fsops.invalidate_pycache(path)


def _why(exc: OSError) -> str:
    if isinstance(exc, fsops.ChangedError):
        return "another program changed it while rocmfix ran"
    return exc.strerror or str(exc)


def _records(
    state: StateDir, manifest: Manifest, plan: Plan, changes: Sequence[FileChange]
) -> tuple[list[FileChange], dict[str, RecordState]]:
    """RECORD edits made byte-exact: the first change to a distribution's RECORD keeps its
    original; the revert that leaves none of that distribution's patches applied puts the
    original back whole (no trailing newline, mixed line endings, a line for a path rocmfix
    drops: a line edit cannot undo those) where RECORD still holds what rocmfix wrote."""
    records = dict(manifest.records)
    applied = {e.distribution for e in plan.entries.values()}
    out = []
    for change in changes:
        if change.kind is not ChangeKind.RECORD or change.before is None or change.after is None:
            out.append(change)
            continue
        known = records.get(change.distribution)
        before, after = fsops.sha256(change.before), fsops.sha256(change.after)
        if change.distribution not in applied:
            records.pop(change.distribution, None)
            if known is not None and known.written == before:
                with contextlib.suppress(ManifestError):
                    change = replace(change, after=state.read_backup(known.original))
            if change.after != change.before:
                out.append(change)
            continue
        original = known.original if known is not None and known.written == before else before
        records[change.distribution] = RecordState(original, after)
        out.append(change)
    return out, {d: r for d, r in records.items() if d in applied}


def _bytecode(path: Path) -> list[tuple[str, bytes]]:
    """The bytecode files of the module at ``path`` (``__pycache__/<stem>.<tag>.pyc``):
    regular files only, none through a link."""
    cache = path.parent / "__pycache__"
    if cache.is_symlink() or not cache.is_dir():
        return []
    out = []
    for pyc in sorted(cache.glob(f"{path.stem}.*.pyc")):
        with contextlib.suppress(OSError, fsops.NotRegularError):
            data = fsops.read_regular(pyc, 16 << 20)
            if data is not None and PYC_NAME.fullmatch(pyc.name):
                out.append((pyc.name, data))
    return out


def _keep_bytecode(state: StateDir, plan: Plan, changes: Sequence[FileChange]) -> Plan:
    """Back up the bytecode pip wrote for each file this apply patches (the write removes
    it, as it would go stale) and its mtime, for revert to put back."""
    originals = {
        (c.distribution, c.rel): c for c in changes if c.kind is ChangeKind.TARGET and c.before
    }
    entries = dict(plan.entries)
    for name, entry in plan.entries.items():
        change = originals.get((entry.distribution, entry.file))
        if change is None or change.before is None:
            continue
        if fsops.sha256(change.before) != entry.original_sha256:
            continue
        kept = []
        for pyc, data in _bytecode(change.path):
            kept.append(DroppedFile(pyc, state.backup(data)))
        if kept:
            mtime = change.path.stat(follow_symlinks=False).st_mtime_ns
            entries[name] = replace(entry, pycache=tuple(kept), mtime_ns=mtime)
    return replace(plan, entries=entries)


def _restore_bytecode(state: StateDir, reverted: Iterable[ManifestEntry], plan: Plan) -> None:
    """Put back the bytecode pip wrote and the mtime it was compiled against, for each file
    revert restored to its original. Best effort: it is a cache, which Python rebuilds."""
    written = {(c.distribution, c.rel): c for c in plan.changes if c.kind is ChangeKind.TARGET}
    for entry in reverted:
        change = written.get((entry.distribution, entry.file))
        if change is None or change.after is None or not entry.pycache:
            continue
        if fsops.sha256(change.after) != entry.original_sha256 or entry.mtime_ns is None:
            continue
        with contextlib.suppress(OSError, ManifestError):
            os.utime(change.path, ns=(entry.mtime_ns, entry.mtime_ns), follow_symlinks=False)
            cache = change.path.parent / "__pycache__"
            fsops.make_dirs(cache)
            if cache.is_symlink() or not fsops.inside(cache / "x", _root(change)):
                continue
            like = change.path.stat(follow_symlinks=False)
            for pyc in entry.pycache:
                if PYC_NAME.fullmatch(pyc.path) and not (cache / pyc.path).exists():
                    fsops.atomic_write(cache / pyc.path, state.read_backup(pyc.sha256), like=like)


def execute(state: StateDir, manifest: Manifest, plan: Plan, op: str) -> None:
    changes, records = _records(
        state, manifest, plan, _order(plan.changes, reverting=(op == "revert"))
    )
    check_writable(changes, state)
    if op == "apply":
        with contextlib.suppress(OSError):
            plan = _keep_bytecode(state, plan, changes)
    done: list[FileChange] = []
    try:
        try:
            for change in changes:
                if change.before is not None:
                    state.backup(change.before)
            state.save(replace(manifest, pending=_journal(op, changes)), __version__)
        except OSError as exc:
            state.tidy()
            raise WriteError(
                "nothing was changed: rocmfix could not write its state in "
                f"{state.root} ({_why(exc)})"
            ) from None
        try:
            for change in changes:
                write(change.path, change.after, change.before, change.mode_from)
                done.append(change)
        except OSError as exc:
            failed = _rollback(done)
            problem = f"writing {change.path} failed ({_why(exc)})"
            if failed:
                # The journal and every backup stay: status reads `interrupted`, and the next
                # apply or revert (once the fault is gone) rolls back what is left.
                raise WriteError(
                    f"{problem}; could not restore {', '.join(failed)} either, so rocmfix's "
                    f"journal and backups stay in {state.root}",
                    hint="`rocmfix revert` finishes the rollback once the fault is gone",
                ) from None
            try:
                state.save(manifest, __version__)
            except OSError:
                raise WriteError(
                    f"{problem}; every file is as it was, but the journal could not be cleared",
                    hint="`rocmfix revert` clears it once the fault is gone",
                ) from None
            raise WriteError(f"{problem}; every file is as it was") from None
    except KeyboardInterrupt:
        with _interrupts_held():
            _interrupted(state, manifest, changes, op)
    # From here the run is done: a Ctrl-C now must not leave a record half saved.
    with _interrupts_held():
        if op == "revert":
            reverted = [e for n, e in manifest.entries.items() if n not in plan.entries]
            _restore_bytecode(state, reverted, plan)
        state.save(
            replace(manifest, entries=plan.entries, pending=None, records=records), __version__
        )
    state.prune_backups(kept_backups(plan.entries.values(), records.values()))


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """Ctrl-C ignored while a rollback or the final record is written (a second Ctrl-C must
    not leave either half done); the main thread alone can set a signal's handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupted(
    state: StateDir, manifest: Manifest, changes: Sequence[FileChange], op: str
) -> None:
    """After a Ctrl-C mid-run: every file this run had written back to what it held before
    (a file replaced just as the signal came is found by its bytes, not by what the loop
    had counted), the journal cleared, and the one line that says so."""
    restored: list[str] = []
    failed: list[str] = []
    for change in reversed(changes):
        try:
            current = fsops.read_regular(change.path)
        except (fsops.NotRegularError, OSError):
            failed.append(str(change.path))
            continue
        if current == change.before or current != change.after:
            continue
        try:
            write(change.path, change.before, change.after, change.mode_from)
            restored.append(str(change.path))
        except OSError:
            failed.append(str(change.path))
    if failed:
        raise Interrupted(
            f"{op} was interrupted, and {', '.join(failed)} could not be put back: rocmfix's "
            f"journal and backups stay in {state.root}",
            hint="`rocmfix revert` finishes the rollback",
        )
    try:
        state.save(manifest, __version__)
    except OSError:
        raise Interrupted(
            f"{op} was interrupted; every file is as it was, but rocmfix's journal could not "
            "be cleared",
            hint="`rocmfix revert` clears it",
        ) from None
    if restored:
        raise Interrupted(
            f"{op} was interrupted; the {len(restored)} file(s) it had written are rolled "
            "back: the environment is as it was"
        )
    raise Interrupted(
        f"{op} was interrupted before it changed a file: the environment is as it was"
    )


def kept_backups(entries: Iterable[ManifestEntry], records: Iterable[RecordState] = ()) -> set[str]:
    """The backups the manifest still needs: originals, files a forced drop replaced, and
    each RECORD as rocmfix first found it."""
    return (
        {e.original_sha256 for e in entries}
        | {d.replaced for e in entries for d in e.drops if d.replaced}
        | {p.sha256 for e in entries for p in e.pycache}
        | {r.original for r in records}
    )


def _rollback(done: Sequence[FileChange]) -> list[str]:
    failed = []
    for change in reversed(done):
        try:
            write(change.path, change.before, change.after, change.mode_from)
        except OSError:
            failed.append(str(change.path))
    return failed


def _pending_path(dist: Distribution, item: PendingFile, patches: Sequence[Patch]) -> Path:
    """Where a journal's file is, once it is shown to be one a patch declares, inside the
    environment, reached through no link. Anything else is a tampered journal."""
    declared = {
        rel
        for p in patches
        if p.distribution == item.distribution
        for rel in (p.path, *p.drop_paths)
    }
    targets = {p.path for p in patches if p.distribution == item.distribution}
    hint = "rocmfix's journal was edited; move share/rocmfix aside and reinstall the package"
    # A folder that became a link after the journal was written is no edit of the journal.
    link_hint = (
        "a folder on that path now links out of the environment; put the real folder back "
        "and run the command again (rocmfix never writes through such a link)"
    )
    if item.kind == "record":
        record = dist.record
        if record is None or item.path != record_rel(dist, record):
            raise ManifestError(
                f"the journal names a RECORD {item.path} that is not {dist.name}'s", hint=hint
            )
        if item.before is None:
            raise ManifestError(f"the journal would delete {dist.name}'s RECORD", hint=hint)
        return record
    if item.path not in declared:
        raise ManifestError(
            f"the journal names {item.distribution}:{item.path}, which no patch declares",
            hint=hint,
        )
    if item.path in targets and item.before is None:
        raise ManifestError(f"the journal would delete the target {item.path}", hint=hint)
    roots = sorted({t.root for t in dist.files.values()})
    if not roots:
        raise ManifestError(f"{item.distribution} has no files rocmfix knows", hint=hint)
    # Every target of one distribution lives under one root.
    path = roots[0] / item.path
    if path.is_symlink() or not fsops.inside(path, roots[0]):
        raise ManifestError(
            f"cannot restore {path}: it leads out of the environment through a linked "
            f"folder (to {path.parent.resolve()})",
            hint=link_hint,
        )
    return path


def check_pending(env: Environment, pending: Pending | None, patches: Sequence[Patch]) -> None:
    """Refuse a journal that names anything rocmfix would not write (see _pending_path)."""
    for item in pending.files if pending is not None else ():
        dist = env.distributions.get(item.distribution)
        if dist is not None:
            _pending_path(dist, item, patches)


def recover(
    env: Environment, manifest: Manifest, patches: Sequence[Patch]
) -> tuple[Manifest, tuple[str, ...]]:
    """Roll back a run that was killed (or failed) before it finished; every file it touched
    returns to the bytes it had before that run, from the backups written before any change.
    The journal goes only once every file is back."""
    pending = manifest.pending
    if pending is None:
        return manifest, ()
    state = env.state
    check_pending(env, pending, patches)
    notes = [f"rolled back an interrupted {pending.op} (pid {pending.pid}, {pending.started_at})"]
    for item in reversed(pending.files):
        dist = env.distributions.get(item.distribution)
        if dist is None:
            notes.append(f"{item.distribution} is gone; nothing to roll back for {item.path}")
            continue
        path = _pending_path(dist, item, patches)
        fsops.remove_temp_files(path.parent)
        try:
            current = fsops.digest_of(path)
        except fsops.NotRegularError as exc:
            raise ManifestError(f"cannot roll back: {exc}") from None
        if current == item.before:
            continue
        if current != item.after:
            notes.append(f"{path} changed since the interrupted run; left as it is")
            continue
        data = state.read_backup(item.before) if item.before is not None else None
        current_bytes = fsops.read_regular(path)
        try:
            write(path, data, current_bytes)
        except OSError as exc:
            raise WriteError(
                f"cannot roll back the interrupted {pending.op}: writing {path} failed "
                f"({_why(exc)}); the journal and backups stay",
                hint="run the command again once the fault is gone",
            ) from None
        notes.append(f"restored {path}")
    recovered = replace(manifest, pending=None)
    state.save(recovered, __version__)
    return recovered, tuple(notes)
