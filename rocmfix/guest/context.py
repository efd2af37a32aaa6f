"""What every worker mode shares: the event channel, the loaded templates, the device.

Protocol (:mod:`.protocol`): one JSON object per line on the original stdout; stray prints of
torch, triton or the GPU libraries are sent to stderr so they cannot break it.

``ROCMFIX_UNSAFE_TEST_HOOKS`` (shared with the write side's fault injection, see
``rocmfix.fsops``) is a test hook that stays in production code because what it simulates
cannot happen on a CPU: a JSON object whose ``{"sleep": {item: seconds}}`` blocks an
item after it starts (a MIOpen search; with ``"pidfile": path`` the blocked worker's pid is
appended there), ``{"crash": [item]}`` kills the worker inside an item, ``{"corrupt": [item]}``
perturbs an item's output, and ``{"slow": {"shipped"|"candidates": seconds}}`` slows every
timed call of tune's shipped config or of its other candidates. The host passes it on only from
its own environment, and the CLI warns whenever it is set.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import math
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

from . import templates
from .protocol import DeviceFacts, Event, KernelWarning, Request

TEST_ENV = "ROCMFIX_UNSAFE_TEST_HOOKS"

# Set by :func:`import_torch`: the target's torch, and F = torch.nn.functional.
torch: Any = None
F: Any = None


def import_torch() -> None:
    global torch, F
    torch = importlib.import_module("torch")
    F = importlib.import_module("torch.nn.functional")


class Channel:
    """JSON lines on a private copy of stdout; fd 1 itself then points at stderr."""

    def __init__(self) -> None:
        sys.stdout.flush()
        self._out = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    def send(self, event: Event) -> None:
        self._out.write(json.dumps(event.to_json(), default=str) + "\n")
        self._out.flush()


def one_line(exc: BaseException) -> str:
    return (type(exc).__name__ + ": " + " ".join(str(exc).split()))[:400]


def finite(value: float | None) -> float | None:
    if value is None or math.isnan(value) or math.isinf(value):
        return None
    return float(value)


def test_hooks() -> dict[str, Any]:
    try:
        data = json.loads(os.environ.get(TEST_ENV) or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


class Unavailable(Exception):
    """An implementation that cannot run here (no triton, a template that did not load)."""


def interpreter_unavailable(exc: BaseException) -> Unavailable | None:
    """Triton's CPU interpreter up to 3.7 turns a kernel's integer argument into a one-element
    array and indexes with ``int()`` of it, which NumPy 2.4 refuses: every kernel with a
    runtime loop bound fails there, whatever it computes. That says nothing about the kernel
    on a GPU, so it is reported as unavailable, never as a wrong kernel."""
    if "only 0-dimensional arrays can be converted" not in str(exc):
        return None
    import numpy  # the interpreter's own dependency: present whenever this happened

    triton = sys.modules.get("triton")
    return Unavailable(
        f"Triton {getattr(triton, '__version__', '?')}'s CPU interpreter cannot run this kernel "
        f"with NumPy {numpy.__version__} (fixed in Triton 3.8); on a GPU the kernel compiles"
    )


class Context:
    def __init__(self, request: Request, channel: Channel, gpu: bool) -> None:
        self.request = request
        self.channel = channel
        self.gpu = gpu
        self.variant = "gpu" if gpu else "cpu"
        self.device = torch.device("cuda" if gpu else "cpu")
        self.hooks = test_hooks()
        self.modules: dict[str, Any] = {}
        self.module_errors: dict[str, str] = {}
        self.triton_error: str | None = None
        self.triton_version: str | None = None

    def sync(self) -> None:
        if self.gpu:
            torch.cuda.synchronize()

    def load_templates(self) -> None:
        try:
            triton = importlib.import_module("triton")
            self.triton_version = str(getattr(triton, "__version__", "?"))
        except Exception as exc:  # noqa: BLE001 - a broken triton is a finding, not a crash
            self.triton_error = one_line(exc)
        folder = self.request.templates_dir
        for name in self.request.templates:
            try:
                self.modules[name] = self.with_warnings(
                    functools.partial(templates.load, folder, name)
                )
            except Exception as exc:  # noqa: BLE001
                self.module_errors[name] = one_line(exc)

    def module(self, template: str) -> Any:
        if template not in self.modules:
            raise Unavailable(self.module_errors.get(template, template + " was not loaded"))
        return self.modules[template]

    def needs_triton(self) -> None:
        if self.triton_error is not None:
            raise Unavailable("triton is not importable (" + self.triton_error + ")")

    def forward(self, caught: list[Any]) -> None:
        """Send on the templates' own warnings (they all start "rocmfix:"), once each."""
        seen = set()
        for item in caught:
            message = str(item.message)
            if message.startswith("rocmfix") and message not in seen:
                seen.add(message)
                self.channel.send(KernelWarning(code="kernel", message=message))

    def with_warnings(self, fn: Callable[[], Any]) -> Any:
        """Run fn, forwarding the templates' own warnings (a corrupt tuned file, say)."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = fn()
        self.forward(caught)
        return result


def device_info(ctx: Context) -> DeviceFacts:
    hip = getattr(torch.version, "hip", None)
    cuda = getattr(torch.version, "cuda", None)
    conv_library = None
    try:
        version = torch.backends.cudnn.version()
        if version:
            conv_library = ("MIOpen " if hip else "cuDNN ") + str(version)
    except Exception:  # noqa: BLE001
        pass
    facts = DeviceFacts(
        kind="gpu" if ctx.gpu else "cpu",
        backend=("hip" if hip else "cuda") if ctx.gpu else "cpu",
        torch=str(torch.__version__),
        hip=str(hip) if hip else None,
        cuda=str(cuda) if cuda else None,
        triton=ctx.triton_version,
        triton_error=ctx.triton_error,
        arch="cpu",
        conv_library=conv_library,
    )
    if not ctx.gpu:
        return facts
    props = torch.cuda.get_device_properties(0)
    if hip:
        arch = (str(getattr(props, "gcnArchName", "") or "").split(":")[0]) or "?"
    else:
        arch = f"sm_{props.major}{props.minor}"
    return dataclasses.replace(
        facts,
        name=str(props.name),
        count=int(torch.cuda.device_count()),
        memory_gib=round(props.total_memory / 2**30, 1),
        arch=arch,
        cc_major=int(props.major),
    )
