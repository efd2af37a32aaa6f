"""Kill rocmfix at every write point and prove nothing is lost (shared by tests and bench).

``ROCMFIX_UNSAFE_TEST_HOOKS={"kill_at": N}`` makes the N-th ``fsops.write_point()`` of a run
SIGKILL the process, the way a power cut or the OOM killer would. :func:`kill_loop` kills a
command at its 1st, 2nd, ... write point until a run finishes, and after every kill checks that

* no file is torn: each file under site-packages holds its pristine bytes or the bytes of a
  finished run (never a third thing), and no temporary file is left once a run completes;
* ``status`` tells the truth: it exits 0; ``interrupted`` exactly when the manifest holds a
  journal; with no journal, site-packages is exactly pristine (every patch ``applicable``) or
  exactly the finished apply (every patch ``applied`` with that scheme);
* ``revert`` (optionally killed itself at each of its write points first: ``nested``)
  restores every pristine byte and leaves no state directory.

It needs only a ``cli(*args, env=...)`` callable that runs the real CLI against one
environment (``--python`` included) and returns an object with ``returncode``, ``stderr``
and ``json()``.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOOKS = "ROCMFIX_UNSAFE_TEST_HOOKS"
SIGKILLED = -9
# apply: from pristine to gemm; revert: from gemm to pristine; switch: gemm to linear.
COMMANDS: dict[str, tuple[tuple[str, ...], tuple[str, ...] | None, str | None]] = {
    "apply": (("apply", "--scheme", "gemm"), None, "gemm"),
    "revert": (("revert",), ("apply", "--scheme", "gemm"), None),
    "switch": (("apply", "--scheme", "linear"), ("apply", "--scheme", "gemm"), "linear"),
}


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file below ``path`` with its bytes, bytecode caches excluded."""
    if not path.exists():
        return {}
    return {
        str(p.relative_to(path)): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def temp_files(*roots: Path) -> list[Path]:
    return [p for root in roots if root.exists() for p in root.rglob("*.rocmfix-*.tmp")]


@dataclass
class Summary:
    label: str
    command: str
    points: int = 0
    recovered: int = 0
    nested_points: int = 0
    bytes_lost: int = 0
    files_left: int = 0
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        nested = f", {self.nested_points} nested kills of revert" if self.nested_points else ""
        return (
            f"fault injection ({self.label}, {self.command}): {self.points} write points "
            f"{'failed from' if 'io-error' in self.label else 'killed'}{nested}, "
            f"{self.recovered}/{self.points} states recovered, "
            f"{self.bytes_lost} bytes lost, {self.files_left} files left over, "
            f"{len(self.problems)} problems"
        )


# How each fault shows: a SIGKILL at the write point, or EIO on every write from it on.
FAULTS = {"kill": ("kill_at", SIGKILLED), "io-error": ("fail_from", 1)}


def _run(cli: Callable[..., Any], *args: str, kill: int | None = None, fault: str = "kill") -> Any:
    if kill is None:
        return cli(*args, env={})
    return cli(*args, env={HOOKS: json.dumps({FAULTS[fault][0]: kill})})


def _check_state(
    cli: Callable[..., Any],
    site: Path,
    pristine: dict[str, bytes],
    finished: dict[str, dict[str, bytes]],
    where: str,
) -> list[str]:
    """What is wrong with what status says about the bytes on disk right now."""
    problems = []
    # A kill between writing a temporary file and renaming it leaves the temporary file; it
    # is not a target and the next run removes it (checked after every revert).
    now = {k: v for k, v in snapshot(site).items() if ".rocmfix-" not in k}
    for name in sorted(set(now) | set(pristine) | {n for f in finished.values() for n in f}):
        allowed = {pristine.get(name)} | {f.get(name) for f in finished.values()}
        if now.get(name) not in allowed:
            problems.append(f"{where}: {name} holds bytes of no finished state (torn)")
    status = cli("status", "--json")
    if status.returncode != 0:
        return [*problems, f"{where}: status exited {status.returncode}: {status.stderr[-300:]}"]
    doc = status.json()
    # A patch without schemes (mineru-tokenizer) is applied with no scheme at all.
    verdicts = {
        p["id"]: (p["verdict"], p["scheme"] if p["schemes"] else "*") for p in doc["patches"]
    }
    ours = {pid: v for pid, v in verdicts.items() if v[0] not in ("not-installed", "not-needed")}
    if doc["busy"]:
        problems.append(f"{where}: status says busy with no rocmfix running")
    if doc["pending"] is not None:
        wrong = {pid: v for pid, v in ours.items() if v[0] != "interrupted"}
        if wrong:
            problems.append(f"{where}: a journal is pending but status reads {wrong}")
        return problems
    if now == pristine:
        wrong = {pid: v for pid, v in ours.items() if v[0] != "applicable"}
        if wrong:
            problems.append(f"{where}: site-packages is pristine but status reads {wrong}")
        return problems
    for scheme, files in finished.items():
        if now == files:
            wrong = {
                pid: v
                for pid, v in ours.items()
                if v not in {("applied", scheme), ("applied", "*")}
            }
            if wrong:
                problems.append(f"{where}: {scheme} is fully applied but status reads {wrong}")
            return problems
    return [*problems, f"{where}: no journal, yet site-packages is neither pristine nor applied"]


def kill_loop(
    cli: Callable[..., Any],
    *,
    site: Path,
    state: Path,
    command: str,
    label: str,
    nested: bool | Container[int] = False,
    max_points: int = 200,
    fault: str = "kill",
) -> Summary:
    """Break ``command`` ("apply", "revert" or "switch") at each write point in turn: kill it
    there (``fault="kill"``), or fail every write from there on with EIO (``"io-error"``, a
    dying disk: the rollback fails too). After each, the state must read truthfully and a
    plain revert must give every pristine byte back."""
    summary = Summary(label if fault == "kill" else f"{label}, io-error", command)
    args, setup, _ = COMMANDS[command]
    pristine = snapshot(site)
    if state.exists():
        summary.problems.append("the environment already has rocmfix state")
        return summary
    # A calibration pass: the bytes of every finished run, through the same CLI.
    finished: dict[str, dict[str, bytes]] = {}
    for scheme in ("gemm", "linear") if command == "switch" else ("gemm",):
        done = cli("apply", "--scheme", scheme)
        if done.returncode != 0:
            summary.problems.append(f"calibration apply {scheme} failed: {done.stderr[-300:]}")
            return summary
        finished[scheme] = snapshot(site)
        if scheme == "gemm":
            applied = _kept(site, state, pristine)
    if cli("revert").returncode != 0 or snapshot(site) != pristine or state.exists():
        summary.problems.append("calibration revert did not restore pristine bytes")
        return summary

    for point in range(1, max_points + 1):
        # The setup (apply gemm) writes the same bytes every time: the calibration's are put
        # back in its place.
        if setup is not None and not applied():
            summary.problems.append(f"point {point}: setup {setup} failed")
            break
        killed = _run(cli, *args, kill=point, fault=fault)
        if killed.returncode == 0:
            after = _check_state(cli, site, pristine, finished, f"after the last {command}")
            summary.problems += after
            break
        where = f"{command} {'killed' if fault == 'kill' else 'failing'} at point {point}"
        if killed.returncode != FAULTS[fault][1]:
            summary.problems.append(f"{where}: exited {killed.returncode}: {killed.stderr[-300:]}")
            break
        summary.points += 1
        if fault == "io-error":
            # A failing disk is still one clear line, however far the rollback got.
            errors = [ln for ln in killed.stderr.splitlines() if ln.startswith("error:")]
            if len(errors) != 1:
                summary.problems.append(f"{where}: {len(errors)} error lines: {killed.stderr}")
        summary.problems += _check_state(cli, site, pristine, finished, where)
        if nested is True or (not isinstance(nested, bool) and point in nested):
            summary.nested_points += _nested_reverts(
                cli, site, pristine, finished, where, summary.problems
            )
        reverted = cli("revert")
        if reverted.returncode != 0:
            summary.problems.append(f"{where}: revert exited {reverted.returncode}")
        _account(summary, site, state, pristine, where)
    else:
        summary.problems.append(f"{command} still had write points after {max_points}")
    if cli("revert").returncode != 0 or snapshot(site) != pristine or state.exists():
        summary.problems.append("the final revert did not restore pristine bytes")
    if summary.points < 4:
        summary.problems.append(f"{command} had only {summary.points} write points")
    return summary


def _kept(site: Path, state: Path, pristine: dict[str, bytes]) -> Callable[[], bool]:
    """What a finished apply left (site-packages' changed files, rocmfix's state folder, with
    their modes), and a call that puts it back over the pristine environment."""
    files = {site / n: data for n, data in snapshot(site).items() if pristine.get(n) != data}
    files |= {path: path.read_bytes() for path in state.rglob("*") if path.is_file()}
    folders = sorted(path for path in (state, *state.rglob("*")) if path.is_dir())
    modes = {path: stat.S_IMODE(path.stat().st_mode) for path in (*files, *folders)}

    def restore() -> bool:
        if state.exists() or snapshot(site) != pristine:
            return False
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
        for path, data in files.items():
            path.write_bytes(data)
        for path, mode in modes.items():
            path.chmod(mode)
        return True

    return restore


def _nested_reverts(
    cli: Callable[..., Any],
    site: Path,
    pristine: dict[str, bytes],
    finished: dict[str, dict[str, bytes]],
    where: str,
    problems: list[str],
) -> int:
    """Kill the recovering revert at its 1st, 2nd, ... write point; the state stays sound."""
    kills = 0
    for point in range(1, 200):
        killed = _run(cli, "revert", kill=point)
        if killed.returncode == 0:
            return kills
        if killed.returncode != SIGKILLED:
            problems.append(f"{where}, revert killed at {point}: exited {killed.returncode}")
            return kills
        kills += 1
        problems.extend(
            _check_state(cli, site, pristine, finished, f"{where}, then revert killed at {point}")
        )
    return kills


def _account(
    summary: Summary, site: Path, state: Path, pristine: dict[str, bytes], where: str
) -> None:
    now = snapshot(site)
    lost = sum(len(data) for name, data in pristine.items() if now.get(name) != data)
    extra = [name for name in now if name not in pristine]
    leftovers = temp_files(site, state)
    summary.bytes_lost += lost
    summary.files_left += len(extra) + len(leftovers) + (1 if state.exists() else 0)
    if lost or extra or leftovers or state.exists():
        summary.problems.append(
            f"{where}: after revert {lost} bytes lost, extra files {extra[:3]}, "
            f"temporary files {leftovers[:3]}, state left: {state.exists()}"
        )
    else:
        summary.recovered += 1
