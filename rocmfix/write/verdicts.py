"""Verdicts: what one patch's target file is, decided from its code and its bytes.

A file is inspected in one pass of small steps, each of which either settles the verdict or
hands on: the package is not installed; a run was interrupted on it; it is a link; it is
gone; it holds rocmfix's recorded rewrite; someone else changed it; and only then what its
code says (the patch's libcst classification), weighed against how rocmfix knows the file is
as its package shipped it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

import libcst as cst

from rocmfix import fsops, measured, supervise
from rocmfix.checks import is_rocm, torch_build
from rocmfix.environment import Distribution, Environment
from rocmfix.errors import ManifestError
from rocmfix.manifest import Manifest, ManifestEntry, Pending
from rocmfix.mineru import onnx_note, runs_onnx
from rocmfix.patch import CodeShape, Patch, TargetContext
from rocmfix.results import PatchStatus, Pristine, Verdict
from rocmfix.rewrite import TooDeepError


@dataclass(frozen=True)
class Inspection:
    status: PatchStatus
    dist: Distribution | None = None
    root: Path | None = None
    data: bytes | None = None
    entry: ManifestEntry | None = None
    # Not needed only because torch is not a ROCm build: --force may still apply it.
    forceable: bool = False


# git answers in milliseconds; one that hangs (a network filesystem, a credential helper,
# a hook) held status 20 s per file, minutes in all. One budget for the whole run instead:
# once it is spent, the files left are "unknown", as without git.
GIT_BUDGET_S = 10.0
# Once the git calls have taken this long in all, the run says what it is waiting on.
GIT_NOTICE_S = 1.0


class GitBudget:
    """The time every git call of one run shares, and the one notice its user gets once
    they take long (``notice`` runs on a timer thread, only while a git call runs)."""

    def __init__(self, notice: Callable[[], None] | None = None) -> None:
        self._deadline: float | None = None
        self._spent = 0.0
        self._notice = notice

    def run(self, argv: Sequence[str]) -> supervise.Finished | None:
        started = time.monotonic()
        if self._deadline is None:
            self._deadline = started + GIT_BUDGET_S
        left = self._deadline - started
        if left <= 0:
            return None
        timer = None
        if self._notice is not None:
            timer = threading.Timer(max(GIT_NOTICE_S - self._spent, 0.0), self._announce)
            timer.daemon = True
            timer.start()
        try:
            # From / like every child rocmfix starts; the checkout's fsmonitor hook never runs.
            done = supervise.capped(list(argv), timeout=left, limit=1 << 20)
        except OSError:
            return None
        finally:
            if timer is not None:
                timer.cancel()
            self._spent += time.monotonic() - started
        return None if done.returncode is None else done

    def _announce(self) -> None:
        notice, self._notice = self._notice, None
        if notice is not None:
            notice()


# The run's budget: commands.py opens one per command (:func:`git_budget`); a caller that
# opens none shares this one for the life of the process.
_budgets: list[GitBudget] = [GitBudget()]


@contextlib.contextmanager
def git_budget(notice: Callable[[], None] | None = None) -> Iterator[None]:
    _budgets.append(GitBudget(notice))
    try:
        yield
    finally:
        _budgets.pop()


def _git(path: Path, *args: str) -> supervise.Finished | None:
    return _budgets[-1].run(["git", "-C", str(path.parent), "-c", "core.fsmonitor=false", *args])


def _git_pristine(path: Path) -> bool | None:
    """An editable checkout has no RECORD; a tracked file in git is pristine when it has no
    uncommitted change (True), modified when it has one (False). None: git cannot tell."""
    tracked = _git(path, "ls-files", "--error-unmatch", "--", path.name)
    if tracked is None or tracked.returncode != 0:
        return None
    # --no-optional-locks: status only reads, so git must not refresh the index.
    dirty = _git(path, "--no-optional-locks", "status", "--porcelain", "--", path.name)
    if dirty is None or dirty.returncode != 0:
        return None
    return not dirty.stdout.strip()


def pristine(data: bytes, record_hash: str | None, path: Path, dist: Distribution) -> Pristine:
    if record_hash is not None:
        return Pristine.RECORD if fsops.record_hash(data) == record_hash else Pristine.MODIFIED
    clean = _git_pristine(path) if dist.editable else None
    if clean is not None:
        return Pristine.GIT if clean else Pristine.GIT_MODIFIED
    return Pristine.UNKNOWN


def check_entry(patch: Patch, entry: ManifestEntry) -> None:
    """Refuse a manifest entry that names files the patch does not own."""
    hint = "the manifest was edited by hand; restore it or reinstall the package"
    if entry.file != patch.path or entry.distribution != patch.distribution:
        raise ManifestError(
            f"manifest entry {patch.id!r} names {entry.distribution}:{entry.file}, "
            f"but that patch targets {patch.distribution}:{patch.path}",
            hint=hint,
        )
    for drop in entry.drops:
        if drop.path not in patch.drop_paths:
            raise ManifestError(
                f"manifest entry {patch.id!r} lists a dropped file rocmfix never drops: "
                f"{drop.path}",
                hint=hint,
            )
    # A patch whose settings became schemes was applied before with none: its default.
    named = (*patch.scheme_names, *((None,) if patch.settings else ()))
    if patch.schemes and entry.scheme not in named:
        raise ManifestError(f"manifest entry {patch.id!r} has an unknown scheme {entry.scheme!r}")


def pending_patches(patches: Sequence[Patch], pending: Pending | None) -> set[str]:
    """The patches whose files an interrupted run was changing."""
    if pending is None:
        return set()
    touched = {(f.distribution, f.path) for f in pending.files if f.kind == "file"}
    return {
        p.id
        for p in patches
        if (p.distribution, p.path) in touched
        or any((p.distribution, d) in touched for d in p.drop_paths)
    }


def _drops_intact(root: Path, entry: ManifestEntry) -> str | None:
    for drop in entry.drops:
        path = root / drop.path
        try:
            digest = fsops.digest_of(path)
        except fsops.NotRegularError as exc:
            return f"its dropped file {drop.path} was replaced by someone else ({exc})"
        except OSError as exc:
            return f"its dropped file {drop.path} cannot be read ({exc.strerror or exc})"
        if digest is None:
            return f"its dropped file {drop.path} is missing"
        if digest != drop.sha256:
            return f"its dropped file {drop.path} was changed by someone else"
    return None


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def context(env: Environment, patch: Patch, dist: Distribution) -> TargetContext:
    related: dict[str, bytes | None] = {}
    for rel in patch.related:
        # "dist:path" is a file of another distribution; absent when that one is.
        owner, _, path = rel.rpartition(":")
        source = env.distributions.get(owner) if owner else dist
        target = source.files.get(path) if source is not None else None
        try:
            related[rel] = fsops.read_regular(target.path) if target is not None else None
        except (fsops.NotRegularError, OSError):
            # A related file that is a link or unreadable tells nothing: as if it were absent.
            related[rel] = None
    return TargetContext(
        version=dist.version, versions=env.versions, torch=env.torch, related=related
    )


class _Inspector:
    """One patch in one environment; :meth:`run` is the pass described in the module doc."""

    def __init__(
        self,
        env: Environment,
        patch: Patch,
        manifest: Manifest,
        interrupted: Collection[str],
        busy: bool,
        explicit: Collection[str],
    ) -> None:
        self.env = env
        self.explicit = patch.id in explicit
        self.patch = patch
        self.entry = manifest.entries.get(patch.id)
        if self.entry is not None:
            check_entry(patch, self.entry)
            if self.entry.scheme is None and patch.settings:
                # Applied before its settings became schemes: its default, what it wrote then.
                self.entry = replace(self.entry, scheme=patch.default_scheme)
        self.dist = env.distributions.get(patch.distribution)
        self.interrupted = patch.id in interrupted
        self.busy = busy
        self.root: Path | None = None
        self.path: Path | None = None
        self.data: bytes | None = None
        self.pristine: Pristine | None = None

    def done(
        self,
        verdict: Verdict,
        reason: str,
        *,
        scheme: str | None = None,
        notes: tuple[str, ...] = (),
        forceable: bool = False,
    ) -> Inspection:
        dist = self.dist
        return Inspection(
            status=PatchStatus(
                patch=self.patch,
                verdict=verdict,
                reason=reason,
                version=dist.version if dist else None,
                path=self.path,
                scheme=scheme,
                editable=dist.editable if dist else False,
                pristine=self.pristine,
                notes=notes,
            ),
            dist=dist,
            root=self.root,
            data=self.data,
            entry=self.entry,
            forceable=forceable,
        )

    def run(self) -> Inspection:
        if self.dist is None:
            return self._absent()
        target = self.dist.files[self.patch.path]
        self.path, self.root = target.path, target.root
        early = self._interrupted() or self._link() or self._read()
        if early is not None:
            return early
        assert self.data is not None
        applied = self._applied()
        if applied is not None:
            return applied
        entry = self.entry
        if entry is not None and fsops.sha256(self.data) == entry.original_sha256:
            self.pristine = Pristine.MANIFEST
        else:
            self.pristine = pristine(self.data, target.record_hash, target.path, self.dist)
        # A clean git checkout after `git pull` is what a reinstall is to a wheel: stale.
        if entry is not None and self.pristine not in (
            Pristine.RECORD,
            Pristine.MANIFEST,
            Pristine.GIT,
        ):
            return self.done(
                Verdict.CHANGED,
                "changed by someone else since rocmfix patched it",
                scheme=entry.scheme,
            )
        return self._classified()

    def _absent(self) -> Inspection:
        if self.entry is not None:
            reason = (
                f"{self.patch.distribution} was uninstalled after rocmfix patched it; "
                "`rocmfix revert` cleans up what is left"
            )
        else:
            reason = f"{self.patch.distribution} is not installed here"
        return self.done(Verdict.NOT_INSTALLED, reason)

    def _interrupted(self) -> Inspection | None:
        if not self.interrupted:
            return None
        why = (
            "a rocmfix run is changing it right now"
            if self.busy
            else "an earlier rocmfix run was interrupted; `rocmfix revert` or `rocmfix apply` "
            "finishes the job"
        )
        return self.done(Verdict.INTERRUPTED, why)

    def _link(self) -> Inspection | None:
        assert self.path is not None
        if not self.path.is_symlink():
            return None
        return self.done(
            Verdict.UNSUPPORTED,
            f"{self.path} is a symbolic link (to {os.readlink(self.path)}); rocmfix does not "
            "write through links",
        )

    def _read(self) -> Inspection | None:
        assert self.path is not None and self.dist is not None
        try:
            self.data = fsops.read_regular(self.path)
        except fsops.NotRegularError as exc:
            return self.done(Verdict.UNSUPPORTED, str(exc))
        if self.data is not None:
            return None
        if self.entry is not None:
            return self.done(Verdict.CHANGED, "the file was deleted after rocmfix patched it")
        self.path = None
        return self.done(
            Verdict.NOT_NEEDED, self.patch.missing_reason.format(version=self.dist.version)
        )

    def _applied(self) -> Inspection | None:
        entry = self.entry
        assert self.data is not None and self.root is not None
        if entry is None or fsops.sha256(self.data) != entry.patched_sha256:
            return None
        broken = _drops_intact(self.root, entry)
        if broken is not None:
            return self.done(Verdict.CHANGED, broken, scheme=entry.scheme)
        label = f" ({entry.scheme})" if entry.scheme else ""
        return self.done(
            Verdict.APPLIED,
            f"rocmfix rewrite{label} in place since {entry.applied_at}",
            scheme=entry.scheme,
        )

    def _classified(self) -> Inspection:
        assert self.data is not None and self.dist is not None
        entry = self.entry
        scheme = entry.scheme if entry is not None else None
        try:
            module = self.patch.parse(self.data)
        except (cst.ParserSyntaxError, UnicodeDecodeError, LookupError) as exc:
            return self.done(Verdict.UNSUPPORTED, f"does not parse: {one_line(exc)}")
        except TooDeepError as exc:
            return self.done(Verdict.UNSUPPORTED, str(exc))
        found = self.patch.classify(module, context(self.env, self.patch, self.dist))
        notes = found.notes
        if found.shape is CodeShape.FIXED_UPSTREAM:
            reason = found.reason
            if entry is not None:
                reason += "; `rocmfix revert` removes what the old patch left behind"
            return self.done(Verdict.NOT_NEEDED, reason, scheme=scheme, notes=notes)
        if self.pristine in (Pristine.MODIFIED, Pristine.GIT_MODIFIED):
            how = (
                "modified since it was installed"
                if self.pristine is Pristine.MODIFIED
                else "has uncommitted changes in its git checkout"
            )
            reason = f"{how}, not by rocmfix ({found.reason})"
            return self.done(Verdict.CHANGED, reason, scheme=scheme, notes=notes)
        if found.shape is CodeShape.NEEDS_PATCH:
            return self._needed(found.reason, notes)
        if found.shape is CodeShape.PATCHED:
            reason = "holds a rocmfix rewrite this environment's manifest does not know"
            return self.done(Verdict.CHANGED, reason, scheme=scheme, notes=notes)
        return self.done(Verdict.UNSUPPORTED, found.reason, scheme=scheme, notes=notes)

    def _needed(self, reason: str, notes: tuple[str, ...]) -> Inspection:
        assert self.dist is not None
        entry = self.entry
        torch = self.env.torch
        # What MinerU never runs is decided first: --force overrides the torch check below,
        # never MinerU's choice of targets (naming the patch with --only does that).
        if entry is None:
            unused = self._unused_by_mineru()
            if unused is not None:
                reason, why = unused
                return self.done(Verdict.NOT_NEEDED, reason, notes=(*notes, *why))
        if self.patch.needs_rocm and torch is not None and not is_rocm(self.env):
            return self.done(
                Verdict.NOT_NEEDED,
                f"torch {torch.version} is a {torch_build(self.env)} build: this patch is for "
                "ROCm (`apply --force` patches anyway)",
                notes=notes,
                forceable=True,
            )
        if entry is None:
            notes = (*notes, *self._used_by_mineru())
            judged, reason, notes = measured.follow(
                self.patch, self.env, self.explicit, reason, notes
            )
            if judged is not None:
                return self.done(judged, reason, notes=notes)
        if entry is not None:
            was = (
                "" if entry.version == self.dist.version else f" (rocmfix patched {entry.version})"
            )
            return self.done(
                Verdict.STALE,
                f"{self.patch.distribution} {self.dist.version} was reinstalled over the "
                f"patch{was}; `rocmfix apply` patches it again",
                scheme=entry.scheme,
                notes=notes,
            )
        return self.done(Verdict.APPLICABLE, reason, notes=notes)

    def _unused_by_mineru(self) -> tuple[str, tuple[str, ...]] | None:
        """Why the MinerU installed here never runs this target (the reason, and notes),
        unless the user named the patch by its id (``--only``): then it is theirs to apply."""
        use, mineru = self.patch.mineru, self.env.mineru
        if self.explicit or use is None or mineru is None:
            return None
        # One wording for every patch, so that status groups them on one line.
        anyway = "`--only` with its patch id patches it anyway"
        onnx = runs_onnx(use, mineru, self.env.versions)
        if onnx is not None:
            return f"{onnx}; {anyway}", (onnx_note(use),)
        if use.never:
            return f"mineru {mineru.version} never runs it; {anyway}", (use.what,)
        if mineru.found.shows(use) is None:
            looked = " or ".join(
                [f"import {w}" for w in (*use.imports, *use.names)] + [repr(w) for w in use.strings]
            )
            what = f"does not use {self.patch.distribution}"
            if mineru.found.imports_package(self.patch.package):
                # MinerU imports the package for other models (transformers for its formula
                # model, say): what it does not run is this file's.
                what = f"uses {self.patch.distribution}, but not {_model(self.patch.path)}"
            return f"mineru {mineru.version} {what}: its code has no {looked}; {anyway}", ()
        return None

    def _used_by_mineru(self) -> tuple[str, ...]:
        use, mineru = self.patch.mineru, self.env.mineru
        if use is None or mineru is None:
            return ()
        shown = mineru.found.shows(use)
        if shown is None:
            return ()
        return (f"mineru {mineru.version} runs it: its code {shown} ({use.what})",)


def _model(path: str) -> str:
    """What a target file is, in a few words: ``modeling_hgnet_v2.py`` is its hgnet_v2 model."""
    name = PurePosixPath(path).name
    return f"its {name[9:-3]} model" if name.startswith("modeling_") else name


def inspect(
    env: Environment,
    patch: Patch,
    manifest: Manifest,
    interrupted: Collection[str] = (),
    busy: bool = False,
    explicit: Collection[str] = (),
) -> Inspection:
    """The verdict on ``patch`` in ``env``, with what planning needs to act on it.
    ``explicit``: the ids the user named (``--only``): MinerU's use of those does not matter."""
    return _Inspector(env, patch, manifest, interrupted, busy, explicit).run()
