"""The tuned-config file the dropped-in kernels read at import: where it is, what it holds.

Layout (schema 1), read by ``templates/rocmfix_kernel_config.py`` for every kernel::

    {"schema": 1,
     "kernels": {"<kernel>": {"<arch>": {"<layer>": {<tile config>}}}},
     "meta": {"<arch>": {"device": ..., "torch": ..., "triton": ..., "tuned_at": ...}}}

where ``<kernel>`` is an op's tuned-file key (``patch_embed_gemm``, ``dilated_conv``) and
``<layer>`` the most specific layer a tuned shape has (``f16`` for the patch embed,
``c96_k5_tf32`` for the dilated conv); an older flat ``{<tile config>}`` per arch still reads.

The kernels ignore ``meta``; rocmfix uses it to say when a file was tuned on other software.
Writes are atomic (a temporary file and ``os.replace``) and serialised by a lock on the folder,
so two ``rocmfix tune`` runs cannot lose each other's entries.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import fsops
from .checks import EnvWarning
from .errors import RefusedError
from .guest.protocol import DeviceFacts

SCHEMA = 1
FILE_ENV = "ROCMFIX_TUNED_FILE"


def tuned_path() -> Path:
    """The same lookup as the kernels': ``$ROCMFIX_TUNED_FILE``, else the XDG config dir."""
    explicit = os.environ.get(FILE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "rocmfix" / "tuned.json"


@dataclass(frozen=True)
class TunedFile:
    path: Path
    exists: bool
    data: Mapping[str, Any] | None
    problem: str | None

    def archs(self) -> set[str]:
        kernels = (self.data or {}).get("kernels") or {}
        return {
            arch for entries in kernels.values() if isinstance(entries, dict) for arch in entries
        }


# The kernels' own cap (templates/rocmfix_kernel_config.py, CONFIG_LIMIT).
READ_LIMIT = 1 << 20
NOT_OURS = f'is not a rocmfix tuned file ("schema": {SCHEMA})'


def read_json(path: Path, limit: int, *, follow: bool = False) -> tuple[bool, Any, str | None]:
    """A JSON file of rocmfix's that it did not just write (the tuned file, the measured
    file), read as untrusted input: a regular file (through a link only with ``follow``),
    never blocking on a FIFO, at most ``limit`` bytes. Returns whether it exists, what it
    holds, and why it cannot be read where it cannot."""
    try:
        raw = fsops.read_regular(path, limit, follow=follow)
    except fsops.NotRegularError as exc:
        return True, None, f"cannot be read ({exc})"
    except OSError as exc:
        return True, None, f"cannot be read ({exc.strerror or exc})"
    if raw is None:
        return False, None, None
    try:
        return True, json.loads(raw.decode("utf-8")), None
    except RecursionError:
        return True, None, "is not valid JSON (nested too deeply)"
    except ValueError as exc:
        return True, None, f"is not valid JSON ({exc})"


def read(path: Path) -> TunedFile:
    """The file as the kernels will see it; ``problem`` says why they would ignore it. Read
    as the kernels read it: a link is followed (dotfiles), but only to a regular file."""
    exists, data, problem = read_json(path, READ_LIMIT, follow=True)
    if not exists or problem is not None:
        return TunedFile(path, exists, None, problem)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return TunedFile(path, True, None, NOT_OURS)
    kernels = data.get("kernels")
    if not isinstance(kernels, dict) or not all(isinstance(v, dict) for v in kernels.values()):
        return TunedFile(path, True, None, '"kernels" must map each kernel to its archs')
    return TunedFile(path, True, data, None)


def file_warnings(
    tuned: TunedFile, arch: str, device: DeviceFacts | None = None
) -> list[EnvWarning]:
    """What a user should know about the tuned file on a GPU of ``arch``."""
    if not tuned.exists:
        return []
    if tuned.problem is not None:
        return [
            EnvWarning(
                "tuned-file-corrupt",
                f"{tuned.path} {tuned.problem}: the kernels ignore it and use their shipped "
                "configs",
                "move it aside (`rocmfix tune --reset` removes it if it is rocmfix's); "
                "`rocmfix tune` writes a new one",
            )
        ]
    archs = tuned.archs()
    if archs and arch not in archs:
        return [
            EnvWarning(
                "tuned-file-foreign-arch",
                f"{tuned.path} holds tuned configs for {', '.join(sorted(archs))}, not for this "
                f"GPU ({arch}): the kernels use their shipped configs here",
                "`rocmfix tune` adds entries for this GPU",
            )
        ]
    meta = (tuned.data or {}).get("meta")
    meta = meta.get(arch) if isinstance(meta, dict) else None
    if device is not None and isinstance(meta, dict) and meta:
        then = (meta.get("torch"), meta.get("triton"))
        now = (device.torch, device.triton)
        if then != now:
            return [
                EnvWarning(
                    "tuned-file-stale",
                    f"the {arch} configs in {tuned.path} were tuned with torch {then[0]}, "
                    f"triton {then[1]}; this is torch {now[0]}, triton {now[1]}",
                    "run `rocmfix tune` again: a new compiler can move the best tile",
                )
            ]
    return []


def check_ours(path: Path) -> None:
    """Refuse to touch a file at the tuned path that rocmfix did not write: rocmfix's is a
    regular file holding a JSON object with ``"schema": 1`` (its entries may be damaged; its
    owner is still rocmfix)."""
    tuned = read(path)
    if not tuned.exists or tuned.problem is None or tuned.problem.startswith('"kernels"'):
        return
    raise RefusedError(
        f"{path} {tuned.problem}: rocmfix leaves it alone",
        hint=f"point ${FILE_ENV} at a file of rocmfix's own, or move this one aside",
    )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """The tuned file's lock: a file beside it that only its owner opens, locked through a
    descriptor open for writing, waited for (tune runs are short to store), never unlinked
    (:func:`rocmfix.fsops.held_lock`, the state's helper too)."""
    lock = path.with_name(f".{path.name}.lock")
    held = contextlib.ExitStack()
    try:
        held.enter_context(fsops.held_lock(lock, wait_s=60.0))
    except fsops.NotRegularError as exc:
        raise RefusedError(f"cannot lock the tuned file: {exc}") from None
    except BlockingIOError:
        raise RefusedError(
            f"another rocmfix tune holds {lock}", hint="wait for it, then run again"
        ) from None
    with held:
        yield


@dataclass(frozen=True)
class TunedEntry:
    """One tuned result to store (``config``) or to drop (``None``: the shipped one won)."""

    kernel: str
    arch: str
    key: str
    config: Mapping[str, Any] | None


@dataclass(frozen=True)
class StoreResult:
    path: Path
    written: bool
    removed: bool
    replaced_corrupt: str | None


def store(
    path: Path, entries: list[TunedEntry], meta: Mapping[str, Mapping[str, Any]]
) -> StoreResult:
    """Merge ``entries`` into the file, keeping every other arch's and kernel's entries."""
    check_ours(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        check_ours(path)
        current = read(path)
        replaced = current.problem if current.exists else None
        data: dict[str, Any] = json.loads(json.dumps(current.data)) if current.data else {}
        data["schema"] = SCHEMA
        kernels = data.setdefault("kernels", {})
        for entry in entries:
            per_arch = kernels.setdefault(entry.kernel, {})
            layers = per_arch.get(entry.arch)
            # An older flat entry is replaced as a whole: it cannot hold layers beside it.
            flat = isinstance(layers, dict) and any(
                not isinstance(v, dict) for v in layers.values()
            )
            layers = dict(layers) if isinstance(layers, dict) and not flat else {}
            if entry.config is None:
                layers.pop(entry.key, None)
            else:
                layers[entry.key] = dict(entry.config)
            if layers:
                per_arch[entry.arch] = layers
            else:
                per_arch.pop(entry.arch, None)
        for name in [k for k, v in kernels.items() if not v]:
            del kernels[name]
        left = {arch for entries_ in kernels.values() for arch in entries_}
        meta_all = {k: v for k, v in (data.get("meta") or {}).items() if k in left}
        meta_all.update({arch: dict(m) for arch, m in meta.items() if arch in left})
        data["meta"] = meta_all
        if not kernels:
            existed = path.exists()
            if existed:
                fsops.remove(path)
            return StoreResult(path, False, existed, replaced)
        text = json.dumps(data, indent=2, sort_keys=True) + "\n"
        try:
            like: os.stat_result | None = path.stat()
        except FileNotFoundError:
            like = None
        fsops.atomic_write(path, text.encode("utf-8"), like=like)
        return StoreResult(path, True, False, replaced)


def reset(path: Path) -> bool:
    """Remove the tuned file (every arch's entries); True if there was one."""
    if not path.exists() and not path.is_symlink():
        return False
    check_ours(path)
    with _locked(path):
        check_ours(path)
        existed = path.exists() or path.is_symlink()
        fsops.remove(path)
    return existed
