"""The GPU side of ``rocmfix doctor`` and ``rocmfix tune``, started in the target interpreter as
``python -c BOOT FOLDER worker REQUEST`` (see :mod:`rocmfix.guest`).

The request and every line sent back are :mod:`.protocol` messages. The parent
(:func:`rocmfix.worker.run`) kills this process when one item outlasts its time limit and starts
it again with the finished items in ``Request.skip``: a GPU library blocked in C
(MIOpen searching for a kernel for seconds) cannot be interrupted from Python, only killed.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import traceback
from collections.abc import Callable

from . import check, context, doctor, tune
from .context import Channel, Context, device_info, one_line
from .harness import call
from .protocol import DeviceFacts, End, Fatal, Hello, ProtocolError, Request


def main(argv: list[str]) -> int:
    channel = Channel()
    try:
        request = Request.parse(json.loads(base64.b64decode(argv[1]).decode("utf-8")), "request")
    except (ValueError, ProtocolError) as exc:
        channel.send(Fatal(message="a request out of protocol: " + one_line(exc)))
        return 0
    try:
        context.import_torch()
    except Exception as exc:  # noqa: BLE001
        channel.send(Fatal(message="cannot import torch: " + one_line(exc)))
        return 0
    torch = context.torch
    gpu = bool(torch.cuda.is_available()) and not request.interpret
    mode = request.mode
    if mode == "check" or gpu:
        # Compiled, for this GPU or for one this machine may not have: never interpreted,
        # whatever the shell exported.
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        # Chosen before the templates import triton: the kernels then run on CPU tensors.
        os.environ["TRITON_INTERPRET"] = "1"
    # The config overrides a user may have exported for the requested ops' kernels: tune
    # measures without them and doctor reports them.
    envs = request.config_envs()
    overrides = {k: os.environ[k] for k in envs if os.environ.get(k)}
    if mode in ("tune", "resolve"):
        for name in envs:
            os.environ.pop(name, None)
    if request.tuned_file:
        os.environ["ROCMFIX_TUNED_FILE"] = request.tuned_file
    ctx = Context(request, channel, gpu)
    try:
        ctx.load_templates()
        info = device_info(ctx)
        channel.send(
            Hello(pid=os.getpid(), python=sys.executable, device=info, overrides=overrides)
        )
        if mode == "tune" and request.require_gpu and not gpu:
            channel.send(End())
            return 0
        if mode == "replay":
            call.use_backend(request.backend)
        _MODES[mode](ctx, info)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which decides
        channel.send(Fatal(message=one_line(exc), traceback=traceback.format_exc()))
        return 0
    channel.send(End())
    return 0


# Each mode's run (Request.parse has refused any other mode).
_MODES: dict[str, Callable[[Context, DeviceFacts], None]] = {
    "measure": lambda ctx, _info: doctor.measure(ctx),
    "replay": lambda ctx, _info: doctor.measure(ctx),
    "tune": tune.tune,
    "resolve": lambda ctx, _info: tune.resolve(ctx),
    "check": lambda ctx, _info: check.check(ctx),
}
