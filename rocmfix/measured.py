"""Measured verdicts: whether this GPU's vendor op is slow, as ``doctor`` last measured it.

Whether MIOpen is slow at a depthwise or a transposed conv depends on the GPU and the ROCm
release (a CK or direct solver covers some archs, dtypes and tile sizes, not others), so for
an op with ``measured_verdict`` the code alone does not decide: ``doctor`` times the vendor op
against rocmfix's schemes and stores the result here, per GPU arch and torch/ROCm build, and
``status``/``apply`` read it. The ops MIOpen has no fast kernel for on any arch (the Conv3d
patch embed, the dilated conv) keep their code-based verdicts.

The file sits beside the tuned file (``measured.json`` in its folder)::

    {"schema": 1,
     "ops": {"<op>": {"<arch> torch <version> hip <version>": {
         "arch": ..., "torch": ..., "hip": ..., "scheme": ..., "speedup": 6.1,
         "speedups": {"<scheme>": 6.1, ...}, "measured_at": "2026-12-01"}}}}

``scheme`` and ``speedup`` are the best scheme's; ``speedups`` (optional) holds every scheme
that ran correctly, for the fixes that are one scheme's setting (``Patch.realizes``, and
``rocmfix env``'s flags): each follows its own scheme's speed-up.

It is untrusted input, read as the tuned file is: a regular file (never through a link),
size-capped, schema-checked entry by entry; a file or an entry that fails any check reads as
no measurement. An entry decides only for its own arch and torch/ROCm build: a home folder
shared across a cluster's nodes holds other GPUs' results, and a gfx942 "the vendor op is
fast" says nothing of a gfx1100. ``status`` never imports torch, so it reads this node's arch
as the ROCm runtime does, from what the probe read (:func:`gpu_archs`:
``HSA_OVERRIDE_GFX_VERSION``, else the KFD topology); where that names no single arch,
nothing decides.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import fsops
from .environment import Environment
from .ops import Op
from .patch import Patch, TorchInfo
from .results import Verdict
from .system import System, gfx_name
from .tuned_file import read_json, tuned_path

SCHEMA = 1
NAME = "measured.json"
MAX_BYTES = 256 * 1024
# What doctor calls worth a patch: below this eager speed-up the vendor op is as fast.
WORTH = 1.1
_ARCH = re.compile(r"^[A-Za-z0-9_.:+-]{1,40}$")
_VERSION = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def path() -> Path:
    return tuned_path().parent / NAME


def gpu_archs(system: System) -> frozenset[str]:
    """This node's AMD GPU archs as the ROCm runtime (and so torch) names them: the one
    ``HSA_OVERRIDE_GFX_VERSION`` makes every GPU, else each GPU node the KFD topology lists
    (both as the probe read them); none where neither says (no AMD GPU or driver)."""
    parts = system.env.get("HSA_OVERRIDE_GFX_VERSION", "").strip().split(".")
    if len(parts) == 3 and all(p.isdigit() and len(p) <= 2 for p in parts):
        major, minor, stepping = map(int, parts)
        override = gfx_name(major * 10000 + minor * 100 + stepping)
        if override is not None:
            return frozenset({override})
    return frozenset(system.gfx)


@dataclass(frozen=True)
class Measured:
    """One stored doctor result for one op on one GPU arch and torch/ROCm build."""

    op: str
    arch: str
    torch: str
    hip: str | None
    scheme: str
    speedup: float
    measured_at: str
    speedups: tuple[tuple[str, float], ...] = ()

    @property
    def faster(self) -> bool:
        return self.speedup >= WORTH

    def of(self, scheme: str) -> float | None:
        """``scheme``'s own speed-up, where it was measured."""
        if scheme == self.scheme:
            return self.speedup
        return dict(self.speedups).get(scheme)

    def where(self) -> str:
        rocm = f"ROCm {short(self.hip)}" if self.hip else f"torch {self.torch}"
        return f"on {self.arch}, {rocm}, {self.measured_at}"


@dataclass(frozen=True)
class Reading:
    """What the stored measurements say for one op here: ``faster`` True (patch it), False
    (the vendor op is as fast), None (unmeasured for this build)."""

    faster: bool | None
    reason: str


def short(hip: str) -> str:
    """``7.2`` for a HIP version such as ``7.2.26015-fc0010cf6a``."""
    parts = hip.split("-")[0].split(".")
    return ".".join(parts[:2])


def _key(arch: str, torch: str, hip: str | None) -> str:
    return f"{arch} torch {torch} hip {hip or '-'}"


def _entry(op: str, raw: object) -> Measured | None:
    if not isinstance(raw, dict):
        return None
    arch, torch, hip = raw.get("arch"), raw.get("torch"), raw.get("hip")
    scheme, speedup, when = raw.get("scheme"), raw.get("speedup"), raw.get("measured_at")
    if not (isinstance(arch, str) and _ARCH.match(arch)):
        return None
    if not (isinstance(torch, str) and _VERSION.match(torch)):
        return None
    if hip is not None and not (isinstance(hip, str) and _VERSION.match(hip)):
        return None
    if not (_ratio(scheme, speedup) and isinstance(when, str) and _DATE.match(when)):
        return None
    assert isinstance(scheme, str) and isinstance(speedup, int | float)
    each = raw.get("speedups", {})
    if not isinstance(each, dict):
        return None
    speedups = tuple(sorted((k, float(v)) for k, v in each.items() if _ratio(k, v)))
    if len(speedups) != len(each):
        return None
    return Measured(op, arch, torch, hip, scheme, float(speedup), when, speedups)


def _ratio(scheme: object, speedup: object) -> bool:
    return (
        isinstance(scheme, str)
        and bool(_VERSION.match(scheme))
        and isinstance(speedup, int | float)
        and not isinstance(speedup, bool)
        and math.isfinite(speedup)
        and 0 < speedup < 1e6
    )


def read(file: Path | None = None) -> tuple[Measured, ...]:
    """Every well-formed entry of the file; nothing for a missing, linked, oversized or
    malformed one."""
    _, parsed, _ = read_json(file or path(), MAX_BYTES)
    if not isinstance(parsed, dict) or parsed.get("schema") != SCHEMA:
        return ()
    ops = parsed.get("ops")
    if not isinstance(ops, dict):
        return ()
    found: list[Measured] = []
    for op, entries in ops.items():
        if isinstance(op, str) and isinstance(entries, dict):
            found.extend(m for m in (_entry(op, e) for e in entries.values()) if m)
    return tuple(found)


def reading(
    op: Op,
    torch: TorchInfo | None,
    file: Path | None,
    archs: frozenset[str],
    scheme: str | None = None,
) -> Reading:
    """What the stored measurements say about ``op`` with this torch build on this node's GPU
    (``archs``: :func:`gpu_archs`): whether its best scheme, or ``scheme`` where given,
    measured faster than the stock op."""
    command = f"run `rocmfix doctor --op {op.name}` on the GPU"
    mine = [m for m in read(file) if m.op == op.name]
    build = [
        m for m in mine if torch is not None and (m.torch, m.hip) == (torch.version, torch.hip)
    ]
    if not build:
        if mine:
            newest = max(mine, key=lambda m: m.measured_at)
            return Reading(
                None,
                f"measured {newest.where()}, not with this torch build; {command}",
            )
        return Reading(None, f"whether the vendor op is slow depends on the GPU; {command}")
    if len(archs) != 1:
        seen = ", ".join(sorted(archs)) or "none"
        return Reading(None, f"no single AMD GPU arch seen here ({seen}); {command}")
    (arch,) = archs
    here = [m for m in build if m.arch == arch]
    if not here:
        newest = max(build, key=lambda m: m.measured_at)
        return Reading(None, f"not measured on this GPU ({arch}), only {newest.where()}; {command}")
    newest = max(here, key=lambda m: m.measured_at)
    if scheme is not None:
        return _one(newest, scheme, command)
    if newest.faster:
        return Reading(
            True, f"measured {newest.speedup:.1f}x faster ({newest.scheme}) {newest.where()}"
        )
    return Reading(
        False,
        f"the vendor op measured as fast here ({newest.scheme}: {newest.speedup:.2f}x "
        f"{newest.where()})",
    )


def _one(m: Measured, scheme: str, command: str) -> Reading:
    speedup = m.of(scheme)
    if speedup is None:
        return Reading(None, f"{scheme} did not run correctly {m.where()}; {command}")
    if speedup >= WORTH:
        return Reading(True, f"{scheme} measured {speedup:.1f}x faster {m.where()}")
    return Reading(False, f"{scheme} measured no faster here ({speedup:.2f}x {m.where()})")


def record(
    results: Mapping[str, tuple[str, float]],
    arch: str,
    torch: str,
    hip: str | None,
    file: Path | None = None,
    today: datetime.date | None = None,
    speedups: Mapping[str, Mapping[str, float]] | None = None,
) -> Path | None:
    """Store doctor's result per op (``{op: (best scheme, eager speed-up)}``, and each
    scheme's where ``speedups`` has the op) for this GPU arch and torch/ROCm build, keeping
    the other entries. Returns the file, or None where there was nothing to store or it could
    not be written (the measurement stands; only status will not remember it)."""
    if not results:
        return None
    file = file or path()
    when = (today or datetime.date.today()).isoformat()
    ops: dict[str, dict[str, Any]] = {}
    for m in read(file):
        ops.setdefault(m.op, {})[_key(m.arch, m.torch, m.hip)] = _raw(m)
    for op, (scheme, speedup) in results.items():
        new = _entry(
            op,
            {
                "arch": arch,
                "torch": torch,
                "hip": hip,
                "scheme": scheme,
                "speedup": round(speedup, 3),
                "measured_at": when,
                "speedups": {k: round(v, 3) for k, v in (speedups or {}).get(op, {}).items()},
            },
        )
        if new is not None:
            ops.setdefault(op, {})[_key(arch, torch, hip)] = _raw(new)
    data = json.dumps({"schema": SCHEMA, "ops": ops}, indent=1, sort_keys=True).encode()
    if file.is_symlink():
        return None  # a link of the user's is neither followed nor replaced
    try:
        fsops.make_dirs(file.parent)
        fsops.atomic_write(file, data)
    except OSError:
        return None
    return file


def _raw(m: Measured) -> dict[str, Any]:
    raw = {k: v for k, v in dataclasses.asdict(m).items() if k not in ("op", "speedups")}
    return {**raw, "speedups": dict(m.speedups)} if m.speedups else raw


def follow(
    patch: Patch, env: Environment, explicit: bool, reason: str, notes: tuple[str, ...]
) -> tuple[Verdict | None, str, tuple[str, ...]]:
    """A patch whose code needs it, weighed against what was measured here: (the verdict, or
    None to go on as the code says; the reason; the notes). A patch named with ``--only`` goes
    on whatever was measured; a measured speed-up becomes the reason, the code's a note."""
    if patch.op is None or not patch.op.measured_verdict:
        return None, reason, notes
    found = reading(patch.op, env.torch, None, gpu_archs(env.system), patch.realizes)
    if found.faster:
        return None, found.reason, (reason, *notes)
    if explicit:
        return None, reason, (*notes, found.reason)
    anyway = f"; `--only {patch.id}` patches it anyway"
    verdict = Verdict.NOT_NEEDED if found.faster is False else Verdict.UNMEASURED
    return verdict, found.reason + anyway, notes
