"""``rocmfix profile``: run the user's command with every torch process profiled, find the
ops that take the time, replay the hot ones against the formulations that compute the same
thing, and name the fix. Nothing here prints; the report is :class:`ProfileReport`."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Sequence
from pathlib import Path

from rocmfix.errors import UsageError
from rocmfix.patch import Patch

from . import analyse, collect, launch, replay
from .model import SCHEMA, Calibration, OpStat, ProfileReport, Window

__all__ = ["SCHEMA", "ProfileReport", "Window", "run"]


def run(
    command: Sequence[str],
    patches: Sequence[Patch],
    *,
    window: Window,
    top: int,
    out_dir: Path | None,
    python: str | None,
    replay_ops: bool = True,
) -> ProfileReport:
    if out_dir is not None and out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir} exists and is not a folder")
    with launch.workspace() as folder:
        code = launch.run(command, folder, window, trace=out_dir is not None)
        found = collect.collect(folder)
        files: list[str] = []
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            for trace in found.traces:
                if trace.is_file() and not trace.is_symlink():
                    shutil.copyfile(trace, out_dir / trace.name)
                    files.append(str(out_dir / trace.name))
    groups = found.groups
    total_us = sum(sum(g.times_us) for g in groups.values())
    notes = list(found.notes)
    if not groups:
        return ProfileReport(tuple(command), code, found.device, None, tuple(found.processes),
                             0.0, None, (), window, tuple(notes), None, ())  # fmt: skip
    rows = analyse.rows(groups, total_us, None)
    hot = [r for r in rows[: max(top, 1)]]
    items = analyse.replay_items(hot, groups) if replay_ops else []
    first = groups[rows[0].key]
    target = python or first.python
    hip = found.hip
    replayed = replay.run(target, items, found.device, first.backend)
    if replayed.fatal:
        notes.append(f"replay: {replayed.fatal}")
    calibration = None
    if replayed.calibration is not None:
        cal = replayed.calibration
        calibration = Calibration(
            matmul_tflops={str(k): float(v) for k, v in (cal.get("matmul_tflops") or {}).items()},
            copy_gbps=float(cal.get("copy_gbps") or 0.0),
        )
        rows = analyse.rows(groups, total_us, calibration)
        hot = rows[: max(top, 1)]
    by_key = {item_key: item["id"] for item_key, item in _keyed(hot, items)}
    final: list[OpStat] = []
    for row in hot:
        patch, routed = analyse.patch_for(groups[row.key].op, row.source, patches)
        result = replayed.results.get(str(by_key.get(row.key, "")))
        group = groups[row.key]
        fields = analyse.verdict(row, result, patch, routed, found.device, hip, group.backend,
                                 total_ms=total_us / 1e3, env=group.env,
                                 callees=tuple(group.callees))  # fmt: skip
        final.append(dataclasses.replace(row, patch=patch.id if patch else None, **fields))
    report = ProfileReport(
        command=tuple(command),
        exit_code=code,
        device=found.device,
        device_name=replayed.device_name,
        processes=tuple(found.processes),
        total_ms=total_us / 1e3,
        calibration=calibration,
        ops=tuple(final),
        window=window,
        notes=tuple(notes),
        out_dir=str(out_dir) if out_dir is not None else None,
        files=tuple(files),
    )
    return report


def _keyed(
    hot: Sequence[OpStat], items: list[dict[str, object]]
) -> list[tuple[str, dict[str, object]]]:
    """Each replay item with the key of the row it came from (items are numbered by row)."""
    out = []
    for item in items:
        index = int(str(item["id"])[2:])
        out.append((hot[index].key, item))
    return out
