"""Read what each profiled process wrote and group its ops by op, call shape and source line.

The files come from the user's processes: they are data, checked as they are read, and a file
that does not parse is skipped with a note.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .model import Process

MAX_FILE_BYTES = 512 * 2**20


@dataclass
class Group:
    """The calls of one op at one shape from one source line, as they were recorded."""

    op: dict[str, Any]
    times_us: list[float] = field(default_factory=list)
    # Host (CPU) time of each call: on a GPU, where a cuDNN autotune or a MIOpen Find spends
    # its first call (synchronous searches that the op's device time does not show).
    host_us: list[float] = field(default_factory=list)
    modules: dict[str, None] = field(default_factory=dict)
    kernels: dict[str, float] = field(default_factory=dict)
    pids: dict[int, None] = field(default_factory=dict)
    python: str = ""
    backend: dict[str, Any] = field(default_factory=dict)
    # The run's MIOPEN_*/TORCH_* variables, as the first process that ran it had them.
    env: dict[str, str] = field(default_factory=dict)
    # The ops it called, by name (which implementation ran).
    callees: dict[str, None] = field(default_factory=dict)


@dataclass
class Collected:
    processes: list[Process]
    groups: dict[str, Group]
    device: str
    notes: list[str]
    traces: list[Path]
    # A ROCm build of torch ran (the repro then carries a MIOpenDriver line).
    hip: bool = False
    # Where no op was recorded, what is known: the processes that loaded rocmfix's shim, those
    # that imported torch, and the model calls (outermost forwards) the latter made.
    shim_pids: int = 0
    torch_pids: int = 0
    written: int = 0
    model_calls: int = 0


def layout(shape: list[int], strides: list[int]) -> str:
    """How a tensor sits in memory, in the words torch uses."""
    if not shape or not strides or len(shape) != len(strides):
        return "-"

    def dense(order: Sequence[int]) -> bool:
        """Each dim's stride the product of the sizes before it in ``order``, fastest first
        (size-1 dims aside)."""
        expect = 1
        for dim in order:
            if shape[dim] != 1 and strides[dim] != expect:
                return False
            expect *= shape[dim]
        return True

    if dense(range(len(shape) - 1, -1, -1)):
        return "contiguous"
    # C fastest, then W, H, (D), N.
    if len(shape) in (4, 5) and dense([1, *range(len(shape) - 1, 1, -1), 0]):
        return "channels-last"
    return "strided"


def _key(op: dict[str, Any]) -> str:
    source = op.get("source")
    where = f"{source[0]}:{source[1]}" if isinstance(source, list) and len(source) >= 2 else ""
    return json.dumps(
        [op["name"], op["shapes"], op["dtypes"], op["strides"], op["concrete"], where]
    )


def _valid(op: Any) -> bool:
    return (
        isinstance(op, dict)
        and isinstance(op.get("name"), str)
        and isinstance(op.get("shapes"), list)
        and all(isinstance(s, list) and all(isinstance(n, int) for n in s) for s in op["shapes"])
        and isinstance(op.get("cpu_us"), (int, float))
        and isinstance(op.get("device_us"), (int, float))
    )


def collect(folder: Path) -> Collected:
    processes: list[Process] = []
    notes: list[str] = []
    files: list[tuple[dict[str, Any], Path]] = []
    for path in sorted(folder.glob("events-*.json")):
        try:
            if path.is_symlink() or path.stat().st_size > MAX_FILE_BYTES:
                raise ValueError("not a plain file of a sane size")
            body = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(body, dict) or not isinstance(body.get("ops"), list):
                raise ValueError("not a rocmfix event file")
            if not (
                isinstance(body.get("pid", 0), int)
                and isinstance(body.get("ppid", 0), int)
                and isinstance(body.get("argv", []), list)
                and isinstance(body.get("backend") or {}, dict)
            ):
                raise ValueError("a process field out of shape")
        except (OSError, ValueError) as exc:
            notes.append(f"{path.name} skipped: {exc}")
            continue
        files.append((body, path))
    for path in sorted(folder.glob("notes-*.txt")):
        try:
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines()[:20]:
                notes.append(f"process {path.stem[6:]}: {line[:300]}")
        except OSError:
            continue
    cuda = any(_valid(op) and op["device_us"] > 0 for body, _ in files for op in body["ops"])
    groups: dict[str, Group] = {}
    model_calls = 0
    for body, _path in files:
        ops = [op for op in body["ops"] if _valid(op)]
        pid = int(body.get("pid", 0))
        calls = body.get("calls")
        model_calls += calls if isinstance(calls, int) and calls > 0 else 0
        if not ops:
            continue
        processes.append(
            Process(
                pid=pid,
                ppid=int(body.get("ppid", 0)),
                argv=tuple(str(a) for a in body.get("argv", []))[:20],
                python=str(body.get("python", "")),
                ops=len(ops),
            )
        )
        for op in ops:
            for name in ("dtypes", "strides", "concrete", "leaves"):
                if not isinstance(op.get(name), list):
                    op[name] = []
            key = _key(op)
            group = groups.get(key)
            if group is None:
                group = groups[key] = Group(op=op, python=str(body.get("python", "")))
                group.backend = dict(body.get("backend") or {})
                env = body.get("env")
                if isinstance(env, dict):
                    group.env = {str(k): str(v) for k, v in env.items()}
            group.times_us.append(float(op["device_us"] if cuda else op["cpu_us"]))
            group.host_us.append(float(op["cpu_us"]))
            group.modules[str(op.get("module") or "")] = None
            kernels = op.get("kernels") if cuda else {str(name): 0.0 for name in op["leaves"]}
            if isinstance(kernels, dict):
                for name, us in kernels.items():
                    us = float(us) if isinstance(us, (int, float)) else 0.0
                    group.kernels[str(name)] = group.kernels.get(str(name), 0.0) + us
            group.pids[pid] = None
            callees = op.get("callees")
            if isinstance(callees, list):
                for name in callees[:12]:
                    group.callees[str(name)] = None
    traces = sorted(folder.glob("trace-*.json"))
    hip = any(bool(body.get("hip")) for body, _ in files)
    found = Collected(processes, groups, "cuda" if cuda else "cpu", notes, traces, hip)
    found.shim_pids = len(list(folder.glob("shim-*")))
    found.torch_pids = len(list(folder.glob("torch-*")))
    found.written = len(files)
    found.model_calls = model_calls
    return found
