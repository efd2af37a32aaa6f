"""Planning: from verdicts to the exact bytes a run will write, before anything is written.

A plan names every file change (a target rewritten or restored, a template dropped or
removed, a RECORD line added or dropped) and the manifest entries the run leaves behind. A
patch that cannot be done is a refusal, and any refusal refuses the whole run: nothing is
ever half-applied. The rewritten sources are compiled by the target's own interpreter here,
so a rewrite that would not import is refused too.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from rocmfix import fsops
from rocmfix._resources import template_bytes
from rocmfix.checks import has_triton
from rocmfix.environment import Distribution, Environment, compile_errors
from rocmfix.errors import AnchorNotFoundError, RefusedError
from rocmfix.manifest import DroppedFile, Manifest, ManifestEntry, now
from rocmfix.patch import CodeShape, Patch
from rocmfix.results import Action, ChangeKind, FileChange, Outcome, PatchStatus, Pristine, Verdict
from rocmfix.state import StateDir
from rocmfix.write.verdicts import context, inspect


@dataclass(frozen=True)
class Plan:
    outcomes: tuple[Outcome, ...]
    changes: tuple[FileChange, ...]
    entries: Mapping[str, ManifestEntry]

    def changes_anything(self, manifest: Manifest) -> bool:
        return bool(self.changes) or dict(self.entries) != dict(manifest.entries)


def _change(
    kind: ChangeKind,
    dist: str,
    rel: str,
    root: Path,
    before: bytes | None,
    after: bytes | None,
    beside: str | None = None,
) -> FileChange:
    mode_from = root / beside if beside is not None else None
    return FileChange(kind, dist, rel, root / rel, rel, before, after, mode_from)


def rewrite(
    env: Environment, patch: Patch, original: bytes, dist: Distribution, scheme: str | None
) -> bytes:
    """The patched bytes of ``original``, checked to be recognised as rocmfix's own."""
    module = cst.parse_module(original)
    try:
        new = patch.transformer(scheme)(module)
    except AnchorNotFoundError as exc:
        raise AnchorNotFoundError(
            f"cannot rewrite {patch.path}: {exc.message}", hint=exc.hint
        ) from None
    result = new.bytes
    if result == original:
        raise AnchorNotFoundError(f"cannot rewrite {patch.path}: the rewrite changed nothing")
    # Read back the way status reads it (only the focus class, where the patch has one).
    again = patch.classify(patch.parse(result), context(env, patch, dist))
    if again.shape is not CodeShape.PATCHED:
        raise AnchorNotFoundError(
            f"the rewrite of {patch.path} is not recognised as rocmfix's own ({again.reason})"
        )
    return result


def record_change(
    key: str, dist: Distribution, drops: Mapping[str, bytes | None]
) -> FileChange | None:
    """Add (or remove, for ``None``) our dropped files in RECORD so ``pip uninstall``
    removes them with the package. Editable installs keep their files elsewhere."""
    if dist.record is None or dist.editable or dist.dist_info is None:
        return None
    try:
        before = fsops.read_regular(dist.record)
    except fsops.NotRegularError as exc:
        raise RefusedError(f"nothing was changed: {exc}") from None
    if before is None:
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
    rel = record_rel(dist, dist.record)
    return FileChange(ChangeKind.RECORD, key, rel, dist.record, rel, before, after)


def record_rel(dist: Distribution, record: Path) -> str:
    """How a run names ``dist``'s RECORD: from site-packages (the journal checks it so)."""
    site = dist.location
    return record.relative_to(site).as_posix() if record.is_relative_to(site) else record.name


def drop_owners(manifest: Manifest, dist: str, rel: str, digest: str | None = None) -> set[str]:
    """Applied patches whose record says they dropped ``rel`` (with ``digest``, if given)."""
    return {
        patch_id
        for patch_id, e in manifest.entries.items()
        if e.distribution == dist
        and any(d.path == rel and (digest is None or d.sha256 == digest) for d in e.drops)
    }


class _Builder:
    """What every plan collects: outcomes, changes, refusals and the RECORD edits."""

    def __init__(self, manifest: Manifest) -> None:
        self.outcomes: list[Outcome] = []
        self.changes: list[FileChange] = []
        self.refusals: list[str] = []
        self.entries = dict(manifest.entries)
        self.records: dict[str, tuple[Distribution, dict[str, bytes | None]]] = {}

    def record(self, patch: Patch, dist: Distribution, rel: str, data: bytes | None) -> None:
        self.records.setdefault(patch.distribution, (dist, {}))[1][rel] = data

    def finish(self, env: Environment, hint: str | None = None) -> Plan:
        if self.refusals:
            raise RefusedError("nothing was changed: " + "; ".join(self.refusals), hint=hint)
        for key, (dist, drops) in self.records.items():
            change = record_change(key, dist, drops)
            if change is not None:
                self.changes.append(change)
        sources = {
            str(c.path): c.after
            for c in self.changes
            if c.after is not None and c.path.suffix == ".py"
        }
        errors = compile_errors(env, sources)
        if errors:
            raise RefusedError(
                "nothing was changed: the rewritten code does not compile: "
                + "; ".join(f"{k}: {v}" for k, v in errors.items())
            )
        return Plan(tuple(self.outcomes), tuple(self.changes), self.entries)


def _refusal(patch: Patch, st: PatchStatus, force: bool) -> tuple[str | None, tuple[str, ...]]:
    """Why ``patch`` cannot be applied as it is, and what ``--force`` overrode to apply it
    anyway (it overrules all but unsupported)."""
    if st.verdict is Verdict.UNSUPPORTED:
        return f"{patch.id}: unsupported: {st.reason}", ()
    if st.verdict is Verdict.CHANGED:
        if force:
            return None, ("someone else changed the file",)
        return f"{patch.id}: {st.reason} (use --force to patch it anyway)", ()
    if st.pristine is Pristine.UNKNOWN:
        if force:
            return None, ("the file cannot be checked against its package",)
        return (
            f"{patch.id}: cannot tell whether {st.path} is pristine "
            f"({Pristine.UNKNOWN.value}); use --force if you know it is unmodified"
        ), ()
    return None, ()


def plan_apply(
    env: Environment,
    patches: Sequence[Patch],
    manifest: Manifest,
    scheme: str | None,
    force: bool,
    explicit: Collection[str] = (),
) -> Plan:
    state = env.state
    plan = _Builder(manifest)
    planned: dict[tuple[str, str], tuple[str, bytes, str | None]] = {}
    selected = {p.id for p in patches}
    # Files an earlier scheme dropped; removed unless some patch still drops them afterwards.
    superseded: dict[tuple[str, str], tuple[Patch, Distribution, Path, DroppedFile]] = {}

    for patch in patches:
        seen = inspect(env, patch, manifest, explicit=explicit)
        st = seen.status
        chosen = (scheme if scheme in patch.scheme_names else patch.default_scheme) or None
        if st.verdict is Verdict.NOT_INSTALLED:
            plan.outcomes.append(Outcome(patch, Action.ABSENT, st.reason))
            continue
        forced: tuple[str, ...] = ()
        if st.verdict is Verdict.UNMEASURED:
            plan.outcomes.append(Outcome(patch, Action.SKIP, st.reason))
            continue
        if st.verdict is Verdict.NOT_NEEDED:
            if not (force and seen.forceable):
                plan.outcomes.append(Outcome(patch, Action.SKIP, st.reason))
                continue
            forced = ("torch is not a ROCm build",)
        if st.verdict is Verdict.APPLIED and st.scheme == chosen:
            plan.outcomes.append(Outcome(patch, Action.UNCHANGED, "already applied", chosen))
            continue
        scheme_data = patch.scheme(chosen)
        if (
            scheme_data is not None
            and scheme_data.needs_triton
            and env.torch is not None
            and not has_triton(env)
        ):
            if not force:
                fallback = patch.op.fallback if patch.op is not None else None
                hint = f" (use --scheme {fallback})" if fallback in patch.scheme_names else ""
                plan.refusals.append(
                    f"{patch.id}: no Triton in this environment for the {chosen} scheme{hint}"
                )
                continue
            forced += ("no Triton here",)
        refusal, overrode = _refusal(patch, st, force)
        forced += overrode
        if refusal is not None:
            plan.refusals.append(refusal)
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
        try:
            patched = rewrite(env, patch, original, dist, chosen)
        except AnchorNotFoundError as exc:
            # Forced past a changed file whose code rocmfix does not recognise: refused
            # with the others, so the run still says why for every patch at once.
            plan.refusals.append(f"{patch.id}: {exc.message}")
            continue
        if patched != current:
            plan.changes.append(
                _change(ChangeKind.TARGET, patch.distribution, patch.path, root, current, patched)
            )
        drops = _plan_drops(plan, patch, chosen, dist, root, manifest, planned, selected, force)
        if any(d.replaced and d.replaced != _replaced(manifest, patch.distribution, d.path)
               for d in drops):  # fmt: skip
            forced += ("a file rocmfix did not drop was where a kernel goes (kept as a backup)",)
        for old in entry.drops if entry is not None else ():
            superseded[(patch.distribution, old.path)] = (patch, dist, root, old)
        plan.entries[patch.id] = ManifestEntry(
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
        action = Action.APPLY if entry is None else Action.REAPPLY
        plan.outcomes.append(Outcome(patch, action, st.reason, chosen, forced))
    kept = {(e.distribution, d.path) for e in plan.entries.values() for d in e.drops}
    for (key, rel), (patch, dist, root, old) in superseded.items():
        existing = fsops.read_regular(root / rel) if (key, rel) not in kept else None
        if existing is not None:
            plan.changes.append(
                _change(ChangeKind.DROP, key, rel, root, existing, _undropped(state, old))
            )
            plan.record(patch, dist, rel, None)
    return plan.finish(env, "`rocmfix status` explains each verdict; --only selects a subset")


def _plan_drops(
    plan: _Builder,
    patch: Patch,
    chosen: str | None,
    dist: Distribution,
    root: Path,
    manifest: Manifest,
    planned: dict[tuple[str, str], tuple[str, bytes, str | None]],
    selected: set[str],
    force: bool,
) -> list[DroppedFile]:
    """The templates ``chosen`` drops for ``patch``; files shared with other patches once."""
    drops: list[DroppedFile] = []
    for template in patch.drops(chosen):
        data = template_bytes(template.source)
        replaced = _replaced(manifest, patch.distribution, template.dest)
        earlier = planned.get((patch.distribution, template.dest))
        if earlier is not None:
            # Shared with a patch planned before: dropped once, recorded by both.
            drops.append(DroppedFile(template.dest, fsops.sha256(data), earlier[2]))
            if earlier[1] != data:
                plan.refusals.append(
                    f"{patch.id} and {earlier[0]} would drop different {template.dest}"
                )
            continue
        plan.record(patch, dist, template.dest, data)
        dest = root / template.dest
        try:
            existing = fsops.read_regular(dest)
        except fsops.NotRegularError as exc:
            plan.refusals.append(f"{patch.id}: {exc}; rocmfix will not write there")
            continue
        owners = (
            drop_owners(manifest, patch.distribution, template.dest, fsops.sha256(existing))
            if existing is not None
            else set()
        )
        if existing is not None and not owners and existing != data:
            # Someone else's file: refused, or under --force kept as a backup that revert
            # puts back.
            replaced = fsops.sha256(existing)
        drops.append(DroppedFile(template.dest, fsops.sha256(data), replaced))
        planned[(patch.distribution, template.dest)] = (patch.id, data, replaced)
        if existing == data:
            continue
        if existing is not None:
            if not owners and not force:
                plan.refusals.append(f"{patch.id}: {dest} exists and rocmfix did not put it there")
            elif owners - selected:
                plan.refusals.append(
                    f"{patch.id}: {template.dest} is shared with "
                    f"{', '.join(sorted(owners - selected))}, applied with another scheme; "
                    "apply them together with one --scheme"
                )
        plan.changes.append(
            _change(
                ChangeKind.DROP, patch.distribution, template.dest, root, existing, data, patch.path
            )
        )
    return drops


def _replaced(manifest: Manifest, dist: str, rel: str) -> str | None:
    """The digest of the user's file an earlier forced drop at ``rel`` replaced, if any."""
    for entry in manifest.entries.values():
        for drop in entry.drops:
            if entry.distribution == dist and drop.path == rel and drop.replaced:
                return drop.replaced
    return None


def _undropped(state: StateDir, drop: DroppedFile) -> bytes | None:
    """What a dropped file's path holds once the drop is undone: the user's file it replaced
    under --force, else nothing."""
    return state.read_backup(drop.replaced) if drop.replaced else None


def plan_revert(
    env: Environment,
    patches: Sequence[Patch],
    manifest: Manifest,
    force: bool,
) -> Plan:
    state = env.state
    plan = _Builder(manifest)
    reverting = {p.id for p in patches if p.id in manifest.entries}
    removed: set[tuple[str, str]] = set()

    for patch in patches:
        entry = manifest.entries.get(patch.id)
        if entry is None:
            continue
        seen = inspect(env, patch, manifest)
        st = seen.status
        del plan.entries[patch.id]
        if seen.dist is None or seen.root is None:
            plan.outcomes.append(Outcome(patch, Action.FORGET, st.reason, entry.scheme))
            continue
        dist, root = seen.dist, seen.root
        if st.verdict is Verdict.CHANGED and not force:
            plan.refusals.append(
                f"{patch.id}: {st.reason} (use --force to restore the original anyway)"
            )
            continue
        # A file reinstalled since (stale, or a release fixed upstream) is what its package
        # ships now: putting the old original back over it would mix two releases.
        reinstalled = st.pristine in (Pristine.RECORD, Pristine.GIT)
        if st.verdict is not Verdict.STALE and not reinstalled:
            original = state.read_backup(entry.original_sha256)
            if seen.data != original:
                plan.changes.append(
                    _change(
                        ChangeKind.TARGET, patch.distribution, patch.path, root, seen.data, original
                    )
                )
        for drop in entry.drops:
            still_used = drop_owners(manifest, patch.distribution, drop.path) - reverting
            if still_used or (patch.distribution, drop.path) in removed:
                continue
            removed.add((patch.distribution, drop.path))
            try:
                data = fsops.read_regular(root / drop.path)
            except fsops.NotRegularError as exc:
                plan.refusals.append(f"{patch.id}: {exc}; rocmfix will not remove it")
                continue
            if data is not None and fsops.sha256(data) != drop.sha256 and not force:
                plan.refusals.append(
                    f"{patch.id}: {drop.path} was changed by someone else "
                    "(use --force to remove it anyway)"
                )
                continue
            restored = _undropped(state, drop)
            if data != restored:
                plan.changes.append(
                    _change(ChangeKind.DROP, patch.distribution, drop.path, root, data, restored)
                )
            if entry.record_updated:
                plan.record(patch, dist, drop.path, None)
        plan.outcomes.append(Outcome(patch, Action.REVERT, st.reason, entry.scheme))
    return plan.finish(env)
