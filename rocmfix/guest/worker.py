"""The GPU side of ``rocmfix doctor`` and ``rocmfix tune``, started in the target interpreter as
``python -c BOOT FOLDER worker REQUEST`` (see :mod:`rocmfix.guest`).

The parent (:mod:`rocmfix.supervise`) kills this process when one item outlasts its time limit
and starts it again with the finished items in ``request["skip"]``: a GPU library blocked in C
(MIOpen searching for a kernel for seconds) cannot be interrupted from Python, only killed.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import traceback
from typing import Any

from . import check, context, doctor, tune
from .context import Channel, Context, device_info, one_line

WORKER_SCHEMA = 2


def config_envs(request: dict[str, Any]) -> list[str]:
    """The config overrides a user may have exported for the requested ops' kernels (each op
    names its own); tune measures without them and doctor reports them."""
    names = (op.get("config_env") for op in request.get("ops", {}).values())
    return [name for name in names if isinstance(name, str) and name]


def main(argv: list[str]) -> int:
    request: dict[str, Any] = json.loads(base64.b64decode(argv[1]).decode("utf-8"))
    mode = request.get("mode")
    channel = Channel()
    try:
        context.import_torch()
    except Exception as exc:  # noqa: BLE001
        channel.send({"event": "fatal", "message": "cannot import torch: " + one_line(exc)})
        return 0
    torch = context.torch
    gpu = bool(torch.cuda.is_available()) and not request.get("interpret")
    if mode == "check" or gpu:
        # Compiled, for this GPU or for one this machine may not have: never interpreted,
        # whatever the shell exported.
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        # Chosen before the templates import triton: the kernels then run on CPU tensors.
        os.environ["TRITON_INTERPRET"] = "1"
    envs = config_envs(request)
    overrides = {k: os.environ[k] for k in envs if os.environ.get(k)}
    if mode in ("tune", "resolve"):
        for name in envs:
            os.environ.pop(name, None)
    if request.get("tuned_file"):
        os.environ["ROCMFIX_TUNED_FILE"] = request["tuned_file"]
    ctx = Context(request, channel, gpu)
    try:
        ctx.load_templates()
        info = device_info(ctx)
        if mode != "compile":
            channel.send(
                {
                    "event": "hello",
                    "worker": WORKER_SCHEMA,
                    "pid": os.getpid(),
                    "python": sys.executable,
                    "device": info,
                    "overrides": overrides,
                    "template_errors": ctx.module_errors,
                    "test_hooks": bool(ctx.hooks),
                }
            )
        if mode == "tune" and request.get("require_gpu") and not gpu:
            channel.send({"event": "end"})
            return 0
        _run(ctx, mode, info)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which decides
        channel.send(
            {"event": "fatal", "message": one_line(exc), "traceback": traceback.format_exc()}
        )
        return 0
    channel.send({"event": "end"})
    return 0


def _run(ctx: Context, mode: Any, info: dict[str, Any]) -> None:
    if mode == "measure":
        doctor.measure(ctx)
    elif mode == "tune":
        tune.tune(ctx, info)
    elif mode == "compile":
        tune.compile_jobs(ctx)
    elif mode == "resolve":
        tune.resolve(ctx)
    elif mode == "check":
        check.check(ctx)
    else:
        raise ValueError("unknown mode " + repr(mode))
