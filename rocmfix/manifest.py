"""The manifest's model: what rocmfix records about an environment, and how that record is
read and written as JSON. Nothing read here is trusted: every path must stay inside its root,
every digest must be one, and anything else is a ManifestError. Where the record lives, and
the lock and backups beside it, is :mod:`rocmfix.state`'s business.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from .errors import ManifestError

MANIFEST_SCHEMA = 1
_SHA = re.compile(r"[0-9a-f]{64}")
PYC_NAME = re.compile(r"[A-Za-z0-9_]+\.[A-Za-z0-9_.-]+\.pyc")
STATE_HINT = "rocmfix's state was edited by hand or by another program; move it aside and reinstall"


@dataclass(frozen=True)
class DroppedFile:
    """A dropped file: its path and digest, and the digest of the file it replaced under
    ``--force`` (kept as a backup and restored by revert), if there was one."""

    path: str
    sha256: str
    replaced: str | None = None


@dataclass(frozen=True)
class ManifestEntry:
    """One applied patch."""

    patch: str
    distribution: str
    version: str
    file: str
    scheme: str | None
    original_sha256: str
    patched_sha256: str
    drops: tuple[DroppedFile, ...]
    record_updated: bool
    applied_at: str
    # The bytecode pip wrote for ``file`` (names in its __pycache__, digests of the backups)
    # and the file's mtime then: revert puts both back, and the bytecode is valid again.
    pycache: tuple[DroppedFile, ...] = ()
    mtime_ns: int | None = None


@dataclass(frozen=True)
class PendingFile:
    """A file a run was about to change: ``kind`` is "file" (relative to the package root)
    or "record" (the distribution's RECORD); ``None`` digests mean "absent"."""

    kind: str
    distribution: str
    path: str
    before: str | None
    after: str | None


@dataclass(frozen=True)
class Pending:
    op: str
    pid: int
    started_at: str
    files: tuple[PendingFile, ...]


@dataclass(frozen=True)
class RecordState:
    """A distribution's RECORD as rocmfix first found it (``original``, kept as a backup) and
    as rocmfix last wrote it (``written``): a revert that finds ``written`` there puts the
    original back byte for byte, line endings and all."""

    original: str
    written: str


@dataclass(frozen=True)
class Manifest:
    entries: Mapping[str, ManifestEntry] = field(default_factory=dict)
    pending: Pending | None = None
    records: Mapping[str, RecordState] = field(default_factory=dict)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def safe_relative(path: Any, what: str) -> str:
    """Accept only a plain relative POSIX path that stays inside its root."""
    if not isinstance(path, str) or not path:
        raise ManifestError(f"manifest: {what} is not a path: {path!r}")
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or "\\" in path or str(pure) != path:
        raise ManifestError(f"manifest: {what} points outside the environment: {path!r}")
    return path


def sha_digest(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _SHA.fullmatch(value):
        raise ManifestError(f"manifest: {what} is not a sha256 digest: {value!r}")
    return value


def _sha_or_none(value: Any, what: str) -> str | None:
    return None if value is None else sha_digest(value, what)


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ManifestError(f"manifest: {what} is not a string: {value!r}")
    return value


def _str_or_none(value: Any, what: str) -> str | None:
    return None if value is None else _str(value, what)


def _objects(raw: Any, what: str) -> list[dict[str, Any]]:
    """``raw`` as a list of JSON objects; anything else is malformed."""
    if not isinstance(raw, list) or not all(isinstance(item, dict) for item in raw):
        raise ManifestError(f"manifest: {what} is malformed")
    return raw


def _entry(patch: str, raw: Any) -> ManifestEntry:
    if not isinstance(raw, dict):
        raise ManifestError(f"manifest: entry {patch!r} is not an object")
    drops = tuple(
        DroppedFile(
            path=safe_relative(drop.get("path"), f"{patch} drop"),
            sha256=sha_digest(drop.get("sha256"), f"{patch} drop digest"),
            replaced=_sha_or_none(drop.get("replaced"), f"{patch} replaced digest"),
        )
        for drop in _objects(raw.get("drops", []), f"the list of drops of entry {patch!r}")
    )
    return ManifestEntry(
        patch=patch,
        distribution=_str(raw.get("distribution"), f"{patch} distribution"),
        version=_str(raw.get("version"), f"{patch} version"),
        file=safe_relative(raw.get("file"), f"{patch} file"),
        scheme=_str_or_none(raw.get("scheme"), f"{patch} scheme"),
        original_sha256=sha_digest(raw.get("original_sha256"), f"{patch} original digest"),
        patched_sha256=sha_digest(raw.get("patched_sha256"), f"{patch} patched digest"),
        drops=drops,
        record_updated=bool(raw.get("record_updated", False)),
        applied_at=_str(raw.get("applied_at", ""), f"{patch} applied_at"),
        pycache=_pycache(patch, raw.get("pycache", [])),
        mtime_ns=mtime if isinstance(mtime := raw.get("mtime_ns"), int) and mtime >= 0 else None,
    )


def _pycache(patch: str, raw: Any) -> tuple[DroppedFile, ...]:
    """Bytecode names: a plain ``<module>.<tag>.pyc`` each, nothing with a folder in it."""
    out = []
    for item in _objects(raw, f"the bytecode list of entry {patch!r}"):
        name = item.get("name")
        if not isinstance(name, str) or not PYC_NAME.fullmatch(name):
            raise ManifestError(f"manifest: entry {patch!r} names bytecode {name!r}")
        out.append(
            DroppedFile(path=name, sha256=sha_digest(item.get("sha256"), f"{patch} bytecode"))
        )
    return tuple(out)


def _pending(raw: Any) -> Pending | None:
    if raw is None:
        return None
    what = "the pending run record"
    if not isinstance(raw, dict):
        raise ManifestError(f"manifest: {what} is malformed")
    files = []
    for item in _objects(raw.get("files"), what):
        if item.get("kind") not in ("file", "record"):
            raise ManifestError(f"manifest: {what} is malformed")
        files.append(
            PendingFile(
                kind=item["kind"],
                distribution=_str(item.get("distribution"), "pending distribution"),
                path=safe_relative(item.get("path"), "pending file"),
                before=_sha_or_none(item.get("before"), "pending digest"),
                after=_sha_or_none(item.get("after"), "pending digest"),
            )
        )
    pid = raw.get("pid")
    return Pending(
        op=_str(raw.get("op"), "pending op"),
        pid=pid if isinstance(pid, int) else 0,
        started_at=_str(raw.get("started_at", ""), "pending started_at"),
        files=tuple(files),
    )


def parse_manifest(text: str, where: Path) -> Manifest:
    try:
        raw = json.loads(text)
    except RecursionError:
        raise ManifestError(
            f"rocmfix's manifest {where} is nested too deeply", hint=STATE_HINT
        ) from None
    except ValueError as exc:
        raise ManifestError(
            f"rocmfix's manifest {where} is not valid JSON ({exc})",
            hint="it was truncated or edited; reinstall the patched packages "
            "(pip install --force-reinstall --no-deps ...) and move the file aside",
        ) from None
    if not isinstance(raw, dict):
        raise ManifestError(f"rocmfix's manifest {where} is not a JSON object")
    schema = raw.get("schema")
    if schema != MANIFEST_SCHEMA:
        raise ManifestError(
            f"rocmfix's manifest {where} has schema {schema!r}; this rocmfix reads "
            f"schema {MANIFEST_SCHEMA}",
            hint="a newer rocmfix wrote it: upgrade rocmfix (pip install -U rocmfix)",
        )
    entries_raw = raw.get("entries", {})
    if not isinstance(entries_raw, dict):
        raise ManifestError(f"rocmfix's manifest {where} has malformed entries")
    entries = {name: _entry(name, value) for name, value in entries_raw.items()}
    records_raw = raw.get("records", {})
    if not isinstance(records_raw, dict) or not all(
        isinstance(v, dict) for v in records_raw.values()
    ):
        raise ManifestError(f"rocmfix's manifest {where} has malformed records")
    records = {
        _str(dist, "records distribution"): RecordState(
            original=sha_digest(value.get("original"), f"{dist} RECORD digest"),
            written=sha_digest(value.get("written"), f"{dist} RECORD digest"),
        )
        for dist, value in records_raw.items()
    }
    return Manifest(
        entries=entries,
        pending=_pending(raw.get("pending")),
        records=records,
    )


def dump_manifest(manifest: Manifest, rocmfix_version: str) -> bytes:
    def entry(e: ManifestEntry) -> dict[str, Any]:
        return {
            "distribution": e.distribution,
            "version": e.version,
            "file": e.file,
            "scheme": e.scheme,
            "original_sha256": e.original_sha256,
            "patched_sha256": e.patched_sha256,
            "backup": f"backups/{e.original_sha256}",
            "drops": [{k: v for k, v in dataclasses.asdict(d).items() if v} for d in e.drops],
            "record_updated": e.record_updated,
            "applied_at": e.applied_at,
            **(
                {
                    "pycache": [{"name": d.path, "sha256": d.sha256} for d in e.pycache],
                    "mtime_ns": e.mtime_ns,
                }
                if e.pycache
                else {}
            ),
        }

    pending = manifest.pending
    doc = {
        "schema": MANIFEST_SCHEMA,
        "rocmfix_version": rocmfix_version,
        "entries": {name: entry(e) for name, e in sorted(manifest.entries.items())},
        "pending": None if pending is None else dataclasses.asdict(pending),
    }
    if manifest.records:
        doc["records"] = {
            dist: dataclasses.asdict(r) for dist, r in sorted(manifest.records.items())
        }
    return (json.dumps(doc, indent=2) + "\n").encode("utf-8")
