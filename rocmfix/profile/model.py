"""What ``rocmfix profile`` found, as frozen data: the engine builds it, the renderer reads it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SCHEMA = "rocmfix-profile/1"
# An op is flagged when it takes at least this share of the run's time and an alternative is
# at least FLAG_SPEEDUP times faster, or when it runs under FLAG_ROOFLINE of this machine's
# roofline for its arithmetic intensity.
FLAG_SHARE = 0.02
FLAG_SPEEDUP = 2.0
FLAG_ROOFLINE = 0.05


@dataclass(frozen=True)
class Window:
    """Which part of each process is profiled: one call is one forward of an outermost module."""

    skip_s: float = 0.0
    skip_calls: int = 0
    seconds: float | None = None
    calls: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v}


@dataclass(frozen=True)
class Calibration:
    matmul_tflops: dict[str, float]
    copy_gbps: float


@dataclass(frozen=True)
class Form:
    """One formulation of a hot op, replayed in isolation."""

    label: str
    ms: float | None
    first_ms: float | None = None
    rel_err: float | None = None
    ok: bool = False
    error: str | None = None


@dataclass(frozen=True)
class Fix:
    """``patch``: a rocmfix patch routes it (``command`` applies it); ``patched``: one already
    does; ``env``: an environment setting (``command`` is the shell line); ``setting``: a torch
    setting in the user's code (``command`` is the Python line); ``none``: no fix yet
    (``repro`` is a standalone snippet to file upstream). ``why`` says why the setting helps."""

    kind: str
    patch_id: str | None = None
    command: str | None = None
    speedup: float | None = None
    repro: str | None = None
    driver: str | None = None
    why: str | None = None


@dataclass(frozen=True)
class OpStat:
    """One op at one call shape, from one source line, over every profiled process."""

    key: str
    op: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    layout: str
    conv: dict[str, Any] | None
    calls: int
    total_ms: float
    first_ms: float
    steady_ms: float
    share: float
    flops: float | None
    bytes: float | None
    tflops: float | None
    gbps: float | None
    roofline: float | None
    modules: tuple[str, ...]
    source: str | None
    kernels: tuple[str, ...]
    pids: tuple[int, ...]
    # Host time of the first call and of a steady one, where the times above are device times.
    host_first_ms: float | None = None
    host_steady_ms: float | None = None
    # The rocmfix patch whose target issued this call, if any (flagged or not).
    patch: str | None = None
    forms: tuple[Form, ...] = ()
    replay_note: str | None = None
    best: str | None = None
    speedup: float | None = None
    flagged: bool = False
    reason: str | None = None
    fix: Fix | None = None

    @property
    def mean_ms(self) -> float:
        return self.total_ms / self.calls if self.calls else 0.0


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    argv: tuple[str, ...]
    python: str
    ops: int


@dataclass(frozen=True)
class ProfileReport:
    command: tuple[str, ...]
    exit_code: int
    device: str
    device_name: str | None
    processes: tuple[Process, ...]
    total_ms: float
    calibration: Calibration | None
    ops: tuple[OpStat, ...]
    window: Window
    notes: tuple[str, ...] = ()
    out_dir: str | None = None
    files: tuple[str, ...] = field(default=())

    @property
    def flagged(self) -> tuple[OpStat, ...]:
        return tuple(op for op in self.ops if op.flagged)
