"""status, apply and revert: decide from the code, change files as one transaction.

The engine returns frozen results and raises :class:`~rocmfix.errors.RocmfixError`; it never
prints. A run changes files in this order: backups, a manifest that names every file about
to change (the journal), the files themselves, then the final manifest. A run killed at any
point therefore leaves either nothing to do or a journal the next run rolls back.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import libcst as cst

from . import __version__, fsops
from ._resources import template_bytes
from .checks import environment_warnings, has_triton
from .environment import Distribution, Environment, compile_errors, default_python_hint
from .errors import (
    AnchorNotFoundError,
    LockBusyError,
    ManifestError,
    RefusedError,
    UsageError,
    WriteError,
)
from .patch import Patch, Shape, TargetContext
from .results import (
    Action,
    FileChange,
    Outcome,
    PatchStatus,
    Pristine,
    RunResult,
    StatusReport,
    Verdict,
)
from .state import Drop, Entry, Manifest, Pending, PendingFile, StateDir, now

DEFAULT_SCHEME = "gemm"


# ---------------------------------------------------------------------------- selection


def select(patches: Sequence[Patch], only: Iterable[str] = ()) -> tuple[Patch, ...]:
    """Patches named by id or by distribution; all of them when ``only`` is empty."""
    wanted = list(only)
    if not wanted:
        return tuple(patches)
    known = {p.id for p in patches} | {p.distribution for p in patches}
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise UsageError(
            f"unknown patch {', '.join(unknown)}",
            hint=f"choose from {', '.join(sorted(p.id for p in patches))} or a distribution name",
        )
    return tuple(p for p in patches if p.id in wanted or p.distribution in wanted)


def check_scheme(patches: Sequence[Patch], scheme: str | None) -> None:
    if scheme is None:
        return
    offered = sorted({name for p in patches for name in p.scheme_names})
    if scheme not in offered:
        raise UsageError(
            f"unknown scheme {scheme!r}",
            hint=f"the selected patches offer {', '.join(offered) or 'no schemes'}",
        )


# ---------------------------------------------------------------------------- inspection


@dataclass(frozen=True)
class _Inspection:
    status: PatchStatus
    dist: Distribution | None
    root: Path | None
    data: bytes | None
    entry: Entry | None
    # Not needed only because torch is not a ROCm build: --force may still apply it.
    forceable: bool = False


def _git_pristine(path: Path) -> bool | None:
    """An editable checkout has no RECORD; a tracked file in git is pristine when it has no
    uncommitted change (True), modified when it has one (False). None: git cannot tell."""
    try:
        tracked = subprocess.run(
            ["git", "ls-files", "--error-unmatch", path.name],
            cwd=path.parent,
            capture_output=True,
            timeout=20,
            check=False,
        )
        if tracked.returncode != 0:
            return None
        # --no-optional-locks: status only reads, so git must not refresh the index.
        dirty = subprocess.run(
            ["git", "--no-optional-locks", "status", "--porcelain", "--", path.name],
            cwd=path.parent,
            capture_output=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if dirty.returncode != 0:
        return None
    return not dirty.stdout.strip()


def _pristine(data: bytes, record_hash: str | None, path: Path, dist: Distribution) -> Pristine:
    if record_hash is not None:
        return Pristine.RECORD if fsops.record_hash(data) == record_hash else Pristine.MODIFIED
    clean = _git_pristine(path) if dist.editable else None
    if clean is not None:
        return Pristine.GIT if clean else Pristine.GIT_MODIFIED
    return Pristine.UNKNOWN


def _check_entry(patch: Patch, entry: Entry) -> None:
    """Refuse a manifest entry that names files the patch does not own."""
    if entry.file != patch.path or entry.distribution != patch.distribution:
        raise ManifestError(
            f"manifest entry {patch.id!r} names {entry.distribution}:{entry.file}, "
            f"but that patch targets {patch.distribution}:{patch.path}",
            hint="the manifest was edited by hand; restore it or reinstall the package",
        )
    owned = {t.dest for s in patch.schemes for t in s.templates}
    for drop in entry.drops:
        if drop.path not in owned:
            raise ManifestError(
                f"manifest entry {patch.id!r} lists a dropped file rocmfix never drops: "
                f"{drop.path}",
                hint="the manifest was edited by hand; restore it or reinstall the package",
            )
    if patch.schemes and entry.scheme not in patch.scheme_names:
        raise ManifestError(f"manifest entry {patch.id!r} has an unknown scheme {entry.scheme!r}")


def _pending_patches(patches: Sequence[Patch], pending: Pending | None) -> set[str]:
    if pending is None:
        return set()
    touched = {(f.distribution, f.path) for f in pending.files if f.kind == "file"}
    return {
        p.id
        for p in patches
        if (p.distribution, p.path) in touched
        or any((p.distribution, t.dest) in touched for s in p.schemes for t in s.templates)
    }


def _drops_intact(root: Path, entry: Entry) -> str | None:
    for drop in entry.drops:
        path = root / drop.path
        try:
            digest = fsops.sha256(path.read_bytes())
        except FileNotFoundError:
            return f"its dropped file {drop.path} is missing"
        if digest != drop.sha256:
            return f"its dropped file {drop.path} was changed by someone else"
    return None


def _status(
    patch: Patch,
    verdict: Verdict,
    reason: str,
    dist: Distribution | None = None,
    path: Path | None = None,
    scheme: str | None = None,
    pristine: Pristine | None = None,
    notes: tuple[str, ...] = (),
) -> PatchStatus:
    return PatchStatus(
        patch=patch,
        verdict=verdict,
        reason=reason,
        version=dist.version if dist else None,
        path=path,
        scheme=scheme,
        editable=dist.editable if dist else False,
        pristine=pristine,
        notes=notes,
    )


def _inspect(
    env: Environment, patch: Patch, manifest: Manifest, interrupted: set[str], busy: bool
) -> _Inspection:
    entry = manifest.entries.get(patch.id)
    if entry is not None:
        _check_entry(patch, entry)
    dist = env.distributions.get(patch.distribution)

    def done(
        status: PatchStatus,
        root: Path | None = None,
        data: bytes | None = None,
        forceable: bool = False,
    ) -> _Inspection:
        return _Inspection(
            status=status, dist=dist, root=root, data=data, entry=entry, forceable=forceable
        )

    if dist is None:
        if entry is not None:
            reason = (
                f"{patch.distribution} was uninstalled after rocmfix patched it; "
                "`rocmfix revert` cleans up what is left"
            )
        else:
            reason = f"{patch.distribution} is not installed here"
        return done(_status(patch, Verdict.NOT_INSTALLED, reason))
    target = dist.files[patch.path]
    path, root = target.path, target.root
    if patch.id in interrupted:
        why = (
            "a rocmfix run is changing it right now"
            if busy
            else "an earlier rocmfix run was interrupted; `rocmfix revert` or `rocmfix apply` "
            "finishes the job"
        )
        return done(_status(patch, Verdict.INTERRUPTED, why, dist, path), root)
    if path.is_symlink():
        return done(
            _status(
                patch,
                Verdict.UNSUPPORTED,
                f"{path} is a symbolic link (to {os.readlink(path)}); rocmfix does not write "
                "through links",
                dist,
                path,
            ),
            root,
        )
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if entry is not None:
            return done(
                _status(
                    patch,
                    Verdict.CHANGED,
                    "the file was deleted after rocmfix patched it",
                    dist,
                    path,
                ),
                root,
            )
        return done(
            _status(
                patch, Verdict.NOT_NEEDED, patch.missing_reason.format(version=dist.version), dist
            ),
            root,
        )
    digest = fsops.sha256(data)
    if entry is not None and digest == entry.patched_sha256:
        broken = _drops_intact(root, entry)
        if broken is not None:
            return done(
                _status(patch, Verdict.CHANGED, broken, dist, path, entry.scheme), root, data
            )
        label = f" ({entry.scheme})" if entry.scheme else ""
        return done(
            _status(
                patch,
                Verdict.APPLIED,
                f"rocmfix rewrite{label} in place since {entry.applied_at}",
                dist,
                path,
                entry.scheme,
            ),
            root,
            data,
        )
    if entry is not None and digest == entry.original_sha256:
        pristine = Pristine.MANIFEST
    else:
        pristine = _pristine(data, target.record_hash, path, dist)
    # A clean git checkout after `git pull` is what a reinstall is to a wheel: stale.
    if entry is not None and pristine not in (Pristine.RECORD, Pristine.MANIFEST, Pristine.GIT):
        return done(
            _status(
                patch,
                Verdict.CHANGED,
                "changed by someone else since rocmfix patched it",
                dist,
                path,
                entry.scheme,
                pristine,
            ),
            root,
            data,
        )
    try:
        module = cst.parse_module(data)
    except (cst.ParserSyntaxError, UnicodeDecodeError, LookupError) as exc:
        return done(
            _status(
                patch,
                Verdict.UNSUPPORTED,
                f"does not parse: {_one_line(exc)}",
                dist,
                path,
                pristine=pristine,
            ),
            root,
            data,
        )
    found = patch.classify(module, _context(env, dist))
    if found.shape is Shape.FIXED_UPSTREAM:
        verdict = Verdict.NOT_NEEDED
        reason = found.reason
        if entry is not None:
            reason += "; `rocmfix revert` removes what the old patch left behind"
    elif pristine in (Pristine.MODIFIED, Pristine.GIT_MODIFIED):
        verdict = Verdict.CHANGED
        how = (
            "modified since it was installed"
            if pristine is Pristine.MODIFIED
            else "has uncommitted changes in its git checkout"
        )
        reason = f"{how}, not by rocmfix ({found.reason})"
    elif found.shape is Shape.NEEDS_PATCH and patch.needs_rocm and not_rocm(env):
        assert env.torch is not None
        build = f"CUDA {env.torch.cuda}" if env.torch.cuda else "CPU-only"
        return done(
            _status(
                patch,
                Verdict.NOT_NEEDED,
                f"torch {env.torch.version} is a {build} build: this patch is for ROCm "
                "(`apply --force` patches anyway)",
                dist,
                path,
                None,
                pristine,
                found.notes,
            ),
            root,
            data,
            forceable=True,
        )
    elif found.shape is Shape.NEEDS_PATCH and entry is not None:
        verdict = Verdict.STALE
        was = "" if entry.version == dist.version else f" (rocmfix patched {entry.version})"
        reason = (
            f"{patch.distribution} {dist.version} was reinstalled over the patch{was}; "
            "`rocmfix apply` patches it again"
        )
    elif found.shape is Shape.NEEDS_PATCH:
        verdict = Verdict.APPLICABLE
        reason = found.reason
    elif found.shape is Shape.PATCHED:
        verdict = Verdict.CHANGED
        reason = "holds a rocmfix rewrite this environment's manifest does not know"
    else:
        verdict = Verdict.UNSUPPORTED
        reason = found.reason
    scheme = entry.scheme if entry is not None else None
    return done(
        _status(patch, verdict, reason, dist, path, scheme, pristine, found.notes), root, data
    )


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def lacks_triton(env: Environment) -> bool:
    """torch is there but no Triton is: a Triton scheme could only fall back."""
    return env.torch is not None and not has_triton(env)


def not_rocm(env: Environment) -> bool:
    """torch is there and is not a ROCm build (without torch, rocmfix cannot tell)."""
    return env.torch is not None and not env.torch.hip


def _context(env: Environment, dist: Distribution) -> TargetContext:
    return TargetContext(version=dist.version, versions=env.versions, torch=env.torch)


def status(env: Environment, patches: Sequence[Patch]) -> StatusReport:
    """What is installed, patched and needed, and why. Reads only; creates nothing."""
    state = env.state
    manifest = state.load()
    busy = state.busy()
    interrupted = _pending_patches(patches, manifest.pending)
    inspected = tuple(_inspect(env, p, manifest, interrupted, busy).status for p in patches)
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
        warnings=environment_warnings(env),
    )


# ---------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class _Plan:
    outcomes: tuple[Outcome, ...]
    changes: tuple[FileChange, ...]
    entries: Mapping[str, Entry]


def _file_change(
    kind: str, dist: str, rel: str, root: Path, before: bytes | None, after: bytes | None
) -> FileChange:
    return FileChange(
        kind=kind,
        distribution=dist,
        rel=rel,
        path=root / rel,
        display=rel,
        before=before,
        after=after,
    )


def _rewrite(
    env: Environment, patch: Patch, original: bytes, scheme: str | None, dist: Distribution
) -> bytes:
    module = cst.parse_module(original)
    try:
        new = patch.transform(module, scheme)
    except AnchorNotFoundError as exc:
        raise AnchorNotFoundError(
            f"cannot rewrite {patch.path}: {exc.message}", hint=exc.hint
        ) from None
    result = new.bytes
    if result == original:
        raise AnchorNotFoundError(f"cannot rewrite {patch.path}: the rewrite changed nothing")
    again = patch.classify(cst.parse_module(result), _context(env, dist))
    if again.shape is not Shape.PATCHED:
        raise AnchorNotFoundError(
            f"the rewrite of {patch.path} is not recognised as rocmfix's own ({again.reason})"
        )
    return result


def _record_change(
    key: str, dist: Distribution, drops: Mapping[str, bytes | None]
) -> FileChange | None:
    """Add (or remove, for ``None``) our dropped files in RECORD so ``pip uninstall``
    removes them with the package. Editable installs keep their files elsewhere."""
    if dist.record is None or dist.editable or dist.dist_info is None:
        return None
    try:
        before = dist.record.read_bytes()
    except FileNotFoundError:
        return None
    newline = b"\r\n" if b"\r\n" in before else b"\n"
    lines = before.splitlines()
    names = {rel.encode("utf-8") for rel in drops}
    kept = [line for line in lines if line.split(b",", 1)[0] not in names]
    for rel, data in sorted(drops.items()):
        if data is not None:
            kept.append(
                b"%s,sha256=%s,%d"
                % (rel.encode("utf-8"), fsops.record_hash(data).encode(), len(data))
            )
    after = newline.join(kept) + (newline if kept else b"")
    if after == before:
        return None
    site = dist.location
    rel = (
        dist.record.relative_to(site).as_posix()
        if dist.record.is_relative_to(site)
        else dist.record.name
    )
    return FileChange(
        kind="record",
        distribution=key,
        rel=rel,
        path=dist.record,
        display=rel,
        before=before,
        after=after,
    )


def _plan_apply(
    env: Environment,
    patches: Sequence[Patch],
    manifest: Manifest,
    state: StateDir,
    scheme: str,
    force: bool,
) -> _Plan:
    outcomes: list[Outcome] = []
    changes: list[FileChange] = []
    entries = dict(manifest.entries)
    refusals: list[str] = []
    planned_drops: dict[tuple[str, str], tuple[str, bytes]] = {}
    record_drops: dict[str, dict[str, bytes | None]] = {}
    dists: dict[str, Distribution] = {}
    selected = {p.id for p in patches}

    for patch in patches:
        seen = _inspect(env, patch, manifest, set(), False)
        st = seen.status
        chosen = (
            (scheme if scheme in patch.scheme_names else patch.schemes[0].name)
            if patch.schemes
            else None
        )
        if st.verdict is Verdict.NOT_INSTALLED:
            outcomes.append(Outcome(patch, Action.ABSENT, st.reason))
            continue
        if st.verdict is Verdict.NOT_NEEDED and not (force and seen.forceable):
            outcomes.append(Outcome(patch, Action.SKIP, st.reason))
            continue
        if st.verdict is Verdict.APPLIED and st.scheme == chosen:
            outcomes.append(Outcome(patch, Action.UNCHANGED, "already applied", chosen))
            continue
        scheme_data = patch.scheme(chosen)
        if scheme_data is not None and scheme_data.needs_triton and lacks_triton(env) and not force:
            refusals.append(
                f"{patch.id}: no Triton in this environment for the {chosen} scheme "
                "(use --scheme linear)"
            )
            continue
        if st.verdict is Verdict.UNSUPPORTED:
            refusals.append(f"{patch.id}: unsupported: {st.reason}")
            continue
        if st.verdict is Verdict.CHANGED and not force:
            refusals.append(f"{patch.id}: {st.reason} (use --force to patch it anyway)")
            continue
        if st.pristine is Pristine.UNKNOWN and not force:
            refusals.append(
                f"{patch.id}: cannot tell whether {st.path} is pristine "
                f"({Pristine.UNKNOWN.value}); use --force if you know it is unmodified"
            )
            continue
        assert seen.dist is not None and seen.root is not None and seen.data is not None
        dist, root, current, entry = seen.dist, seen.root, seen.data, seen.entry
        if entry is not None and fsops.sha256(current) == entry.patched_sha256:
            # Another scheme, or broken drops under --force: start again from the original.
            original = state.read_backup(entry.original_sha256)
        else:
            # Pristine, reinstalled, or (forced) edited by someone else: what is there now
            # is the original this run records.
            original = current
        action = Action.APPLY if entry is None else Action.REAPPLY
        patched = _rewrite(env, patch, original, chosen, dist)
        if patched != current:
            changes.append(
                _file_change("file", patch.distribution, patch.path, root, current, patched)
            )
        drops: list[Drop] = []
        for template in patch.templates(chosen):
            data = template_bytes(template.source)
            drops.append(Drop(template.dest, fsops.sha256(data)))
            planned = planned_drops.get((patch.distribution, template.dest))
            if planned is not None:
                if planned[1] != data:
                    refusals.append(
                        f"{patch.id} and {planned[0]} would drop different {template.dest}"
                    )
                continue
            planned_drops[(patch.distribution, template.dest)] = (patch.id, data)
            record_drops.setdefault(patch.distribution, {})[template.dest] = data
            dists[patch.distribution] = dist
            dest = root / template.dest
            existing = dest.read_bytes() if dest.is_file() else None
            if existing == data:
                continue
            if existing is not None:
                owners = _drop_owners(
                    manifest, patch.distribution, template.dest, fsops.sha256(existing)
                )
                if not owners and not force:
                    refusals.append(f"{patch.id}: {dest} exists and rocmfix did not put it there")
                elif owners - selected:
                    refusals.append(
                        f"{patch.id}: {template.dest} is shared with "
                        f"{', '.join(sorted(owners - selected))}, applied with another scheme; "
                        "apply them together with one --scheme"
                    )
            changes.append(
                _file_change("file", patch.distribution, template.dest, root, existing, data)
            )
        for old in entry.drops if entry is not None else ():
            keep = any(d.path == old.path for d in drops) or (
                _drop_owners(manifest, patch.distribution, old.path, None) - {patch.id}
            )
            old_path = root / old.path
            if not keep and old_path.is_file():
                changes.append(
                    _file_change(
                        "file", patch.distribution, old.path, root, old_path.read_bytes(), None
                    )
                )
                record_drops.setdefault(patch.distribution, {})[old.path] = None
                dists[patch.distribution] = dist
        entries[patch.id] = Entry(
            patch=patch.id,
            distribution=patch.distribution,
            version=dist.version,
            file=patch.path,
            scheme=chosen,
            original_sha256=fsops.sha256(original),
            patched_sha256=fsops.sha256(patched),
            drops=tuple(drops),
            record_updated=bool(drops) and dist.record is not None and not dist.editable,
            applied_at=now(),
        )
        outcomes.append(Outcome(patch, action, st.reason, chosen))

    if refusals:
        raise RefusedError(
            "nothing was changed: " + "; ".join(refusals),
            hint="`rocmfix status` explains each verdict; --only selects a subset",
        )
    for name, record_edit in record_drops.items():
        record = _record_change(name, dists[name], record_edit)
        if record is not None:
            changes.append(record)
    sources = {
        str(c.path): c.after for c in changes if c.after is not None and c.path.suffix == ".py"
    }
    errors = compile_errors(env, sources)
    if errors:
        raise RefusedError(
            "nothing was changed: the rewritten code does not compile: "
            + "; ".join(f"{k}: {v}" for k, v in errors.items())
        )
    return _Plan(outcomes=tuple(outcomes), changes=tuple(changes), entries=entries)


def _drop_owners(manifest: Manifest, dist: str, rel: str, digest: str | None) -> set[str]:
    """Applied patches whose record says they dropped ``rel`` (with ``digest``, if given)."""
    return {
        pid
        for pid, e in manifest.entries.items()
        if e.distribution == dist
        and any(d.path == rel and (digest is None or d.sha256 == digest) for d in e.drops)
    }


def _plan_revert(
    env: Environment,
    patches: Sequence[Patch],
    manifest: Manifest,
    state: StateDir,
    force: bool,
) -> _Plan:
    outcomes: list[Outcome] = []
    changes: list[FileChange] = []
    entries = dict(manifest.entries)
    refusals: list[str] = []
    record_drops: dict[str, dict[str, bytes | None]] = {}
    dists: dict[str, Distribution] = {}
    reverting = {p.id for p in patches if p.id in manifest.entries}
    removed: set[tuple[str, str]] = set()

    for patch in patches:
        entry = manifest.entries.get(patch.id)
        if entry is None:
            continue
        seen = _inspect(env, patch, manifest, set(), False)
        st = seen.status
        del entries[patch.id]
        if seen.dist is None or seen.root is None:
            outcomes.append(Outcome(patch, Action.FORGET, st.reason, entry.scheme))
            continue
        dist, root = seen.dist, seen.root
        if st.verdict is Verdict.CHANGED and not force:
            refusals.append(f"{patch.id}: {st.reason} (use --force to restore the original anyway)")
            continue
        current = seen.data
        # A file reinstalled since (stale, or a release fixed upstream) is what its package
        # ships now: putting the old original back over it would mix two releases.
        reinstalled = st.pristine in (Pristine.RECORD, Pristine.GIT)
        if st.verdict is not Verdict.STALE and not reinstalled:
            original = state.read_backup(entry.original_sha256)
            if current != original:
                changes.append(
                    _file_change("file", patch.distribution, patch.path, root, current, original)
                )
        for drop in entry.drops:
            still_used = _drop_owners(manifest, patch.distribution, drop.path, None) - reverting
            if still_used or (patch.distribution, drop.path) in removed:
                continue
            removed.add((patch.distribution, drop.path))
            path = root / drop.path
            if path.is_file():
                data = path.read_bytes()
                if fsops.sha256(data) != drop.sha256 and not force:
                    refusals.append(
                        f"{patch.id}: {drop.path} was changed by someone else "
                        "(use --force to remove it anyway)"
                    )
                    continue
                changes.append(
                    _file_change("file", patch.distribution, drop.path, root, data, None)
                )
            if entry.record_updated:
                record_drops.setdefault(patch.distribution, {})[drop.path] = None
                dists[patch.distribution] = dist
        outcomes.append(Outcome(patch, Action.REVERT, st.reason, entry.scheme))

    if refusals:
        raise RefusedError("nothing was changed: " + "; ".join(refusals))
    for name, drops in record_drops.items():
        record = _record_change(name, dists[name], drops)
        if record is not None:
            changes.append(record)
    return _Plan(outcomes=tuple(outcomes), changes=tuple(changes), entries=entries)


# ---------------------------------------------------------------------------- execution


def _check_writable(changes: Sequence[FileChange], state: StateDir) -> None:
    state.check_writable()
    for directory in sorted({c.path.parent for c in changes}):
        reason = fsops.unwritable_reason(directory)
        if reason is not None:
            raise RefusedError(
                f"nothing was changed: {directory} {reason}",
                hint="run rocmfix as the user who owns that environment, "
                "or patch a virtual environment you own",
            )


def _order(changes: Sequence[FileChange], reverting: bool) -> list[FileChange]:
    # Dropped modules go in before the file that imports them and come out after it, so a
    # process starting mid-run never imports a module that is not there.
    def rank(change: FileChange) -> int:
        if change.kind == "record":
            return 2
        creating = change.before is None
        deleting = change.after is None
        if reverting:
            return 1 if deleting else 0
        return 0 if creating or (not deleting and change.rel.endswith("_kernels.py")) else 1

    return sorted(changes, key=rank)


def _journal(op: str, changes: Sequence[FileChange]) -> Pending:
    return Pending(
        op=op,
        pid=os.getpid(),
        started_at=now(),
        files=tuple(
            PendingFile(
                kind=c.kind,
                distribution=c.distribution,
                path=c.rel,
                before=fsops.sha256(c.before) if c.before is not None else None,
                after=fsops.sha256(c.after) if c.after is not None else None,
            )
            for c in changes
        ),
    )


def _write(change: FileChange, data: bytes | None) -> None:
    if data is None:
        fsops.remove(change.path)
    else:
        try:
            like: os.stat_result | None = change.path.stat()
        except FileNotFoundError:
            like = None
        fsops.atomic_write(change.path, data, like=like)
    if change.path.suffix == ".py":
        fsops.invalidate_pycache(change.path)


def _execute(env: Environment, state: StateDir, manifest: Manifest, plan: _Plan, op: str) -> None:
    changes = _order(plan.changes, reverting=(op == "revert"))
    _check_writable(changes, state)
    for change in changes:
        if change.before is not None:
            state.backup(change.before)
    state.save(replace(manifest, pending=_journal(op, changes)), __version__)
    done: list[FileChange] = []
    try:
        for change in changes:
            _write(change, change.after)
            done.append(change)
    except OSError as exc:
        failed = _rollback(done)
        state.save(manifest, __version__)
        detail = (
            f"; could not restore {', '.join(failed)}" if failed else "; every file is as it was"
        )
        raise WriteError(f"writing {change.path} failed ({exc.strerror or exc}){detail}") from None
    state.save(replace(manifest, entries=plan.entries, pending=None), __version__)
    keep = {e.original_sha256 for e in plan.entries.values()}
    state.prune_backups(keep)


def _rollback(done: Sequence[FileChange]) -> list[str]:
    failed = []
    for change in reversed(done):
        try:
            _write(change, change.before)
        except OSError:
            failed.append(str(change.path))
    return failed


def _recover(
    env: Environment, state: StateDir, manifest: Manifest
) -> tuple[Manifest, tuple[str, ...]]:
    """Roll back a run that was killed before it finished; every file it touched returns to
    the bytes it had before that run, from the backups written before any change."""
    pending = manifest.pending
    if pending is None:
        return manifest, ()
    notes = [f"rolled back an interrupted {pending.op} (pid {pending.pid}, {pending.started_at})"]
    for item in reversed(pending.files):
        dist = env.distributions.get(item.distribution)
        if dist is None:
            notes.append(f"{item.distribution} is gone; nothing to roll back for {item.path}")
            continue
        path = _pending_path(dist, item)
        if path is None:
            continue
        fsops.remove_temp_files(path)
        try:
            current: str | None = fsops.sha256(path.read_bytes())
        except FileNotFoundError:
            current = None
        if current == item.before:
            continue
        if current != item.after:
            notes.append(f"{path} changed since the interrupted run; left as it is")
            continue
        data = state.read_backup(item.before) if item.before is not None else None
        change = FileChange("file", item.distribution, item.path, path, item.path, None, data)
        _write(change, data)
        notes.append(f"restored {path}")
    recovered = replace(manifest, pending=None)
    state.save(recovered, __version__)
    return recovered, tuple(notes)


def _pending_path(dist: Distribution, item: PendingFile) -> Path | None:
    if item.kind == "record":
        return dist.record
    roots = {t.root for t in dist.files.values()}
    if not roots:
        return None
    # Every target of one distribution lives under one root; the path was checked to be a
    # plain relative path when the manifest was read.
    return sorted(roots)[0] / item.path


def apply(
    env: Environment,
    patches: Sequence[Patch],
    *,
    scheme: str | None = None,
    force: bool = False,
    dry_run: bool = False,
) -> RunResult:
    """Rewrite every selected target that needs it, all or nothing."""
    check_scheme(patches, scheme)
    chosen = scheme or DEFAULT_SCHEME
    state = env.state
    manifest = state.load()
    plan = None
    if manifest.pending is None:
        # Plan without the lock first: a run with nothing to do must not need write access.
        plan = _plan_apply(env, patches, manifest, state, chosen, force)
        if dry_run or not (plan.changes or plan.entries != manifest.entries):
            return _result(env, "apply", plan.outcomes, plan.changes, dry_run)
    elif dry_run:
        raise RefusedError(
            "an earlier rocmfix run was interrupted",
            hint="run `rocmfix apply` or `rocmfix revert` to finish it first",
        )
    if plan is not None:
        _check_writable(plan.changes, state)
    state.check_writable()
    # Tidying happens under the lock: another run holding it may have backups and no
    # journal yet, which an unlocked tidy would take for leftovers and delete.
    with state.locked():
        try:
            locked, recovered = _recover(env, state, state.load())
            if plan is None or locked != manifest or not _still_current(plan.changes):
                plan = _plan_apply(env, patches, locked, state, chosen, force)
            if plan.changes or plan.entries != locked.entries:
                _execute(env, state, locked, plan, "apply")
        finally:
            _tidy_state(state)
    return _result(env, "apply", plan.outcomes, plan.changes, False, recovered)


def _still_current(changes: Sequence[FileChange]) -> bool:
    """Whether every file a plan starts from still holds the bytes the plan read."""
    for change in changes:
        try:
            if change.path.read_bytes() != change.before:
                return False
        except FileNotFoundError:
            if change.before is not None:
                return False
    return True


def revert(env: Environment, patches: Sequence[Patch], *, force: bool = False) -> RunResult:
    """Put back the original bytes of every selected patched file and remove dropped files."""
    state = env.state
    manifest = state.load()
    if not manifest.entries and manifest.pending is None:
        if state.root.exists():
            # Leftovers of a run killed before its journal, unless a run holds the lock
            # right now: then they are its backups.
            with contextlib.suppress(LockBusyError, OSError), state.locked():
                _tidy_state(state)
        return _result(env, "revert", (), (), False)
    state.check_writable()
    with state.locked():
        try:
            manifest, recovered = _recover(env, state, state.load())
            plan = _plan_revert(env, patches, manifest, state, force)
            if plan.changes or plan.entries != manifest.entries:
                _execute(env, state, manifest, plan, "revert")
        finally:
            _tidy_state(state)
    return _result(env, "revert", plan.outcomes, plan.changes, False, recovered)


def _tidy_state(state: StateDir) -> None:
    """Leave no state directory behind once nothing is applied and nothing is pending."""
    try:
        manifest = state.load()
    except ManifestError:
        return
    fsops.remove_temp_files(state.manifest_path)
    if not manifest.entries and manifest.pending is None:
        state.prune_backups(set())
        _remove_state(state)


def _result(
    env: Environment,
    command: str,
    outcomes: tuple[Outcome, ...],
    changes: tuple[FileChange, ...],
    dry_run: bool,
    recovered: tuple[str, ...] = (),
) -> RunResult:
    return RunResult(
        env, command, outcomes, changes, dry_run, recovered, warnings=environment_warnings(env)
    )


def _remove_state(state: StateDir) -> None:
    with contextlib.suppress(FileNotFoundError):
        state.lock_path.unlink()
    for directory in (state.root, state.root.parent):
        try:
            directory.rmdir()
        except OSError:
            break
