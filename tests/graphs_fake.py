"""A stand-in for torch.cuda's graphs, on CPU tensors, for the graph runner's tests
(templates/rocmfix_graphs.py puts its device side in ``_BACKEND``): a capture runs the forward
into fixed output tensors, as a capture does; a replay writes those same tensors again from
the captured inputs, as a replay does. Standard library and torch only: the real-file tests
import it in a fresh interpreter."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def leaves(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in leaves(v)]
    if isinstance(out, list | tuple):
        return [t for v in out for t in leaves(v)]
    return []


class CpuGraphs:
    """torch.cuda's graphs as the runner sees them, on CPU tensors."""

    def __init__(self) -> None:
        self.reserved = 0
        self.per_capture = 1 << 20
        self.captures = self.replays = 0
        self.fail_capture: Exception | None = None
        self.fail_replay: Exception | None = None

    def on_device(self, t: torch.Tensor) -> bool:
        return True

    def new_pool(self, device: torch.device) -> object:
        return object()

    def settle(self, device: torch.device) -> int:
        return self.reserved

    def capture(self, device: torch.device, pool: object, run: Callable[[], Any]) -> Any:
        run()  # the warm-up on the capture stream
        if self.fail_capture is not None:
            raise self.fail_capture
        out = run()
        self.reserved += self.per_capture
        self.captures += 1
        return (run, out), out

    def replay(self, graph: Any) -> None:
        if self.fail_replay is not None:
            raise self.fail_replay
        run, out = graph
        for static, new in zip(leaves(out), leaves(run()), strict=True):
            static.copy_(new)
        self.replays += 1
