"""What ``doctor``, ``tune`` and ``kernels`` share about the worker they run in the target
interpreter (:mod:`rocmfix.guest.worker`): the request every run starts from, the device the
worker reports, and the error for a worker that never started."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import supervise, tuned
from ._resources import data_dir
from .errors import RefusedError
from .fsops import TEST_HOOKS_ENV
from .ops import Op

# done, total, label: how doctor, tune and kernels report a long run while it goes.
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class DeviceInfo:
    kind: str
    backend: str
    name: str | None
    arch: str
    count: int
    torch: str
    hip: str | None
    cuda: str | None
    triton: str | None
    triton_error: str | None
    conv_library: str | None
    memory_gib: float | None

    @property
    def interpreter(self) -> bool:
        return self.kind != "gpu"

    def compile_arch(self) -> str | None:
        """The GPU ahead-of-time compiles target for this device: its own arch, or, without a
        GPU, only the one a test names (``aot_arch`` in the test hooks)."""
        if self.kind == "gpu":
            return self.arch
        try:
            hooks = json.loads(os.environ.get(TEST_HOOKS_ENV) or "{}")
        except ValueError:
            return None
        arch = hooks.get("aot_arch") if isinstance(hooks, dict) else None
        return str(arch) if arch else None


def request(mode: str, ops: Sequence[Op]) -> dict[str, Any]:
    """What every worker run is told: the ops (as data) and where their templates are."""
    return {
        "mode": mode,
        "templates_dir": str(data_dir("templates")),
        "templates": sorted({s.entry for op in ops for s in op.schemes}),
        "ops": {op.name: op.request() for op in ops},
        "tuned_file": str(tuned.tuned_path()),
    }


class WorkerError(RefusedError):
    """The worker never got as far as saying hello: torch or the GPU would not start."""

    def __init__(self, python: str, outcome: supervise.WorkerRun) -> None:
        lines = [line for line in outcome.stderr_tail.strip().splitlines() if line.strip()]
        super().__init__(
            f"could not start the worker in {python}: {outcome.fatal or 'it did not start'}",
            hint=lines[-1][:300] if lines else None,
        )


def device(hello: Mapping[str, Any] | None) -> DeviceInfo:
    raw: Mapping[str, Any] = (hello or {}).get("device") or {}
    return DeviceInfo(
        kind=str(raw.get("kind", "unknown")),
        backend=str(raw.get("backend", "unknown")),
        name=raw.get("name"),
        arch=str(raw.get("arch", "?")),
        count=int(raw.get("count") or 0),
        torch=str(raw.get("torch", "?")),
        hip=raw.get("hip"),
        cuda=raw.get("cuda"),
        triton=raw.get("triton"),
        triton_error=raw.get("triton_error"),
        conv_library=raw.get("conv_library"),
        memory_gib=raw.get("memory_gib"),
    )
