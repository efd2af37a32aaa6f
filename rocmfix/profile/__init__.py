"""``rocmfix profile``: run the user's command with every torch process profiled, find the
ops that take the time, replay the hot ones against the formulations that compute the same
thing, and name the fix. Nothing here prints; the report is :class:`ProfileReport`."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
from collections.abc import Callable, Sequence
from pathlib import Path

from rocmfix import fsops
from rocmfix.errors import UsageError
from rocmfix.patch import Patch

from . import analyse, collect, launch, replay
from .model import SCHEMA, OpStat, ProfileReport, Window

__all__ = ["SCHEMA", "ProfileReport", "Window", "out_folder", "run"]


def out_folder(path: Path) -> Path:
    """``--out``: a folder only this user can write (made if missing), or a usage error."""
    try:
        return fsops.own_folder(path)
    except fsops.UnsafeFolderError as exc:
        raise UsageError(
            f"--out: {exc}", hint="name a new folder, or one of yours that only you can write"
        ) from None


def run(
    command: Sequence[str],
    patches: Sequence[Patch],
    *,
    window: Window,
    top: int,
    out_dir: Path | None,
    python: str | None,
    on_warning: Callable[[str], None] = lambda _message: None,
) -> ProfileReport:
    # Everything that can refuse is checked before the command starts (it may run for hours).
    if not command:
        raise UsageError("no command to profile", hint="rocmfix profile -- python my_script.py")
    if out_dir is not None:
        out_dir = out_folder(out_dir)
    blockers = launch.shim_blockers(command)
    for blocker in blockers:
        on_warning(f"rocmfix's profiler will not load: {blocker}")
    with launch.workspace() as folder:
        ran = launch.run(command, folder, window, trace=out_dir is not None)
        code = ran.code
        found = collect.collect(folder)
        files: list[str] = []
        if out_dir is not None:
            try:  # checked again: the command had hours to change it
                out_dir = out_folder(out_dir)
            except UsageError as exc:
                found.notes.append(f"{exc.message}; nothing was written there")
                out_dir = None
        if out_dir is not None:
            for trace in found.traces:
                with contextlib.suppress(fsops.NotRegularError):
                    fsops.copy_regular(trace, out_dir / trace.name)
                    files.append(str(out_dir / trace.name))
    notes = list(found.notes)
    groups = found.groups
    if ran.passed is not None:
        skipped = "; the replay was skipped" if groups else ""
        notes.append(f"rocmfix passed {signal.Signals(ran.passed).name} on to the command{skipped}")
    total_us = sum(sum(g.times_us) for g in groups.values())
    if not groups:
        notes.insert(0, _nothing(command, found, blockers))
        return ProfileReport(tuple(command), code, found.device, None, tuple(found.processes),
                             0.0, None, (), window, tuple(notes), None, ())  # fmt: skip
    rows = analyse.rows(groups, total_us, None)
    hot = rows[: max(top, 1)]
    first = groups[rows[0].key]
    calls = analyse.replay_calls(hot, groups)
    # Stopped by a signal: the user wants rocmfix gone, not minutes of replays and calibration.
    replayed = (
        replay.Replayed()
        if ran.passed is not None
        else replay.run(python or first.python, calls, found.device, first.backend)
    )
    if replayed.fatal:
        notes.append(f"replay: {replayed.fatal}")
    if replayed.calibration is not None:
        rows = analyse.rows(groups, total_us, replayed.calibration)
        hot = rows[: max(top, 1)]
    final: list[OpStat] = []
    for row in hot:
        patch, routed = analyse.patch_for(groups[row.key].op, row.source, patches)
        group = groups[row.key]
        fields = analyse.verdict(row, replayed.forms.get(row.key), patch, routed, found.device,
                                 found.hip, group.backend, total_ms=total_us / 1e3,
                                 env=group.env, callees=tuple(group.callees))  # fmt: skip
        final.append(dataclasses.replace(row, patch=patch.id if patch else None, **fields))
    return ProfileReport(
        command=tuple(command),
        exit_code=code,
        device=found.device,
        device_name=replayed.device_name,
        processes=tuple(found.processes),
        total_ms=total_us / 1e3,
        calibration=replayed.calibration,
        ops=tuple(final),
        window=window,
        notes=tuple(notes),
        out_dir=str(out_dir) if out_dir is not None else None,
        files=tuple(files),
    )


def _nothing(command: Sequence[str], found: collect.Collected, blockers: Sequence[str]) -> str:
    """Why no op was recorded, as far as the markers the shim left can tell: it sees only the
    processes it loaded in, so it says what those did, never what the others did not."""
    what = f"`{' '.join(command)}`"
    seen, torch = found.shim_pids, found.torch_pids
    if torch and found.model_calls:
        return (f"nothing to profile: {what} made {found.model_calls} model calls, and none "
                "ran an op inside the window (--skip-calls, --skip-seconds)")  # fmt: skip
    lost = torch - found.written
    if lost > 0:
        return (f"nothing to profile: {_processes(lost)} of {what} imported torch and ended "
                "before writing the profile (killed, or os._exit)")  # fmt: skip
    if torch:
        return (f"nothing to profile: {_processes(torch)} of {what} imported torch and ran no "
                "nn.Module (rocmfix profiles model calls: forwards of an outermost "
                "nn.Module)")  # fmt: skip
    unseen = "ignores PYTHONPATH or skips site (-I, -E, -S, a PYTHONPATH of its own, `env -i`)"
    if seen:
        return (f"nothing to profile: {_processes(seen)} of {what} ran with rocmfix's profiler "
                f"and none imported torch (a Python that {unseen} is not seen)")  # fmt: skip
    why = "; ".join(blockers) or f"it ran no Python, or a Python that {unseen}"
    return f"nothing to profile: rocmfix's profiler did not load in any process of {what}: {why}"


def _processes(n: int) -> str:
    return f"{n} Python process{'es' if n != 1 else ''}"
