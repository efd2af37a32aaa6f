"""A stand-in for torch.cuda's graphs, on CPU tensors, for the graph runner's tests
(templates/rocmfix_graphs.py puts its device side in ``_BACKEND``): a capture runs the forward
into fixed output tensors, as a capture does; a replay writes those same tensors again from
the captured inputs, as a replay does; and :class:`HostSyncs`, which finds on a CPU what a
capture on a GPU would refuse. Standard library and torch only: the real-file tests import it
in a fresh interpreter."""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def leaves(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in leaves(v)]
    if isinstance(out, list | tuple):
        return [t for v in out for t in leaves(v)]
    return []


def second_sighting() -> dict[str, str]:
    """The environment of a process that runs real patched files: their runner, told through
    its variable to capture at a shape's 2nd sighting. What follows a capture is tested from
    there; tests/test_graphs_runner.py tests the capture policy itself."""
    return {**os.environ, "ROCMFIX_GRAPHS_AFTER": "2"}


class CpuGraphs:
    """torch.cuda's graphs as the runner sees them, on CPU tensors."""

    def __init__(self) -> None:
        self.reserved = 0
        self.per_capture = 1 << 20
        self.captures = self.replays = 0
        self.fail_capture: Exception | None = None
        self.fail_replay: Exception | None = None
        # The runner's ``_capturing`` flag: a real replay runs no Python, so the runner's calls
        # inside the forward this stand-in runs again must go by as they do in a capture.
        self.inside: Any = None

    def on_device(self, t: torch.Tensor) -> bool:
        return True

    def new_pool(self, device: torch.device) -> object:
        return object()

    def reserve(self, device: torch.device) -> int:
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
        if self.inside is not None:
            self.inside.on = True
        try:
            again = run()
        finally:
            if self.inside is not None:
                self.inside.on = False
        for static, new in zip(leaves(out), leaves(again), strict=True):
            static.copy_(new)
        self.replays += 1


class HostSyncs(TorchDispatchMode):
    """The ops of a forward that would wait for the host on a GPU, which a capture refuses,
    found on a CPU-only machine: run the forward on ``cuda`` tensors under torch's
    ``FakeTensorMode`` (shapes and devices, no data, no GPU) inside this mode. Each finding
    is (why, the line of ``file`` that made it). What counts, from ATen's code:

    - a copy from the host into a device tensor (``copy_``/``_to_copy``: ``torch.tensor(list,
      device=...)``, ``t[i, j] = 5`` on a 0-dim view, ``index_put_``'s value sent over), and
      ``index``/``index_put_`` of a device tensor with indices on the host (``t[host_idx]``),
      which ATen copies over below the dispatcher, out of this mode's sight;
    - a device value read on the host (``_local_scalar_dense``: ``.item()``, ``bool(t)``);
    - an output whose shape depends on the data (``nonzero``, ``masked_select``, ...), and
      ``index_put_``/``index`` with a boolean mask, which ATen turns into ``nonzero``, except
      the one ``index_put_`` it sends to ``masked_fill_`` (one mask, a host scalar value).
    """

    DATA_DEPENDENT = frozenset(
        ("nonzero", "masked_select", "unique", "_unique2", "unique_consecutive", "unique_dim")
    )

    def __init__(self, file: str) -> None:
        super().__init__()
        self.file = file
        self.found: list[tuple[str, str]] = []

    def _where(self) -> str:
        for frame in reversed(traceback.extract_stack()):
            if frame.filename.endswith(self.file):
                return f"{frame.lineno}: {(frame.line or '').strip()}"
        return "?"

    def _why(self, name: str, args: Any, kwargs: dict[str, Any]) -> str | None:
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        devices = {t.device.type for t in tensors}
        if kwargs.get("device") is not None:
            devices.add(torch.device(kwargs["device"]).type)
        if name in self.DATA_DEPENDENT:
            return name
        if name == "_local_scalar_dense" and "cuda" in devices:
            return "a device value read on the host"
        if name in ("copy_", "_to_copy", "to") and {"cpu", "cuda"} <= devices:
            return "a copy from the host"
        if name in ("index", "index_put", "index_put_", "_index_put_impl_"):
            indices = [i for i in args[1] if i is not None]
            if args[0].device.type == "cuda" and any(i.device.type == "cpu" for i in indices):
                # ATen moves host indices to the device first (a copy the capture refuses);
                # FakeTensorMode never shows that copy, only the op with mixed devices.
                return f"a copy from the host ({name}'s indices are on the host)"
            masks = [i for i in indices if i.dtype == torch.bool]
            value = args[2] if name != "index" else None
            host = (
                isinstance(value, torch.Tensor)
                and value.dim() == 0
                and value.device.type == "cpu"
                and args[0].device.type == "cuda"
            )
            if host and len(args[1]) == 1 and masks:
                return None  # masked_fill_ with the host scalar: no wait
            if masks:
                return f"{name} with a boolean mask"
            if host:
                return "a copy from the host (index_put_ sends its value over)"
        return None

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Any = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        why = self._why(func._overloadpacket.__name__, args, kwargs)
        if why is not None:
            self.found.append((why, self._where()))
        return func(*args, **kwargs)
