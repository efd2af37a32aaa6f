"""The replay side of ``rocmfix profile``: runs in the target interpreter as
``python -c BOOT FOLDER profile_replay REQUEST`` and speaks the worker protocol of
:mod:`rocmfix.supervise` (``hello``, then ``start``/``item`` per op, then ``end``), so the host
can kill it when one op outlasts its time limit.

First a calibration (this machine's matmul rate and copy bandwidth), then each hot op's exact
call (shapes, dtypes, strides, arguments), under the backend flags the run had, against the
formulations that compute the same thing; each is checked against the call as it ran.
Python 3.9+, standard library and torch only.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import statistics
import sys
import time
import traceback
from functools import partial
from typing import Any, Callable


def send(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    request = json.loads(base64.b64decode(argv[1]).decode("utf-8"))
    skip = set(request.get("skip", ()))
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        send({"event": "fatal", "message": f"cannot import torch: {exc!r}"})
        return 0
    gpu = request.get("device") == "cuda" and torch.cuda.is_available()
    _backend(torch, request.get("backend") or {})
    send({"event": "hello", "pid": os.getpid(), "gpu": gpu, "device": _device_name(torch, gpu)})
    items = [{"id": "calibrate"}, *list(request.get("ops", ()))]
    for item in items:
        if item["id"] in skip:
            continue
        send({"event": "start", "id": item["id"]})
        try:
            if item["id"] == "calibrate":
                result = _calibrate(torch, gpu)
            else:
                result = _replay(torch, gpu, item, request.get("templates"))
            send({"event": "item", "id": item["id"], "status": "ok", **result})
        except Exception as exc:  # noqa: BLE001 - one op's failure is that op's verdict
            send(
                {
                    "event": "item",
                    "id": item["id"],
                    "status": "error",
                    "message": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()[-1500:],
                }
            )
    send({"event": "end"})
    return 0


def _device_name(torch: Any, gpu: bool) -> str:
    if gpu:
        return str(torch.cuda.get_device_name(0))
    import platform

    threads = torch.get_num_threads()
    return f"CPU ({platform.machine()}, {threads} thread{'s' if threads != 1 else ''})"


def _backend(torch: Any, flags: dict[str, Any]) -> None:
    setters = {
        "cudnn.enabled": lambda v: setattr(torch.backends.cudnn, "enabled", bool(v)),
        "cudnn.benchmark": lambda v: setattr(torch.backends.cudnn, "benchmark", bool(v)),
        "cudnn.deterministic": lambda v: setattr(torch.backends.cudnn, "deterministic", bool(v)),
        "cudnn.allow_tf32": lambda v: setattr(torch.backends.cudnn, "allow_tf32", bool(v)),
        "matmul.allow_tf32": lambda v: setattr(torch.backends.cuda.matmul, "allow_tf32", bool(v)),
        "float32_matmul_precision": torch.set_float32_matmul_precision,
        # The run's own thread count: a CPU op replayed on more threads than it ran on, on a
        # loaded machine, waits on the scheduler and reads many times slower than it ran.
        "num_threads": lambda v: torch.set_num_threads(max(1, int(v))),
    }
    for key, value in flags.items():
        if key in setters:
            with contextlib.suppress(Exception):
                setters[key](value)


def _sync(torch: Any, gpu: bool) -> None:
    if gpu:
        torch.cuda.synchronize()


def _time_ms(torch: Any, gpu: bool, fn: Callable[[], Any]) -> tuple[float, float]:
    """(first call ms, median steady ms) of one callable."""
    got = _time_forms(torch, gpu, {"": fn})[""]
    if isinstance(got, Exception):
        raise got
    first, ms = got
    return float(first), float(ms)


def _time_forms(
    torch: Any,
    gpu: bool,
    forms: dict[str, Callable[[], Any]],
    budget_s: float = 0.5,
    reps: int = 25,
) -> dict[str, Any]:
    """Each form's (first call ms, median steady ms), or the exception it raised: first calls,
    then rounds that call every form once in turn, so a machine's load falls on all of them
    alike (timed one after another, a form timed in a quiet second read 26x "faster"). A form
    whose one call outlasts the budget (a native Conv3d at 5476 patches) is timed once more,
    not three times: the op's time limit covers every form of it."""
    out: dict[str, Any] = {}
    live: dict[str, tuple[Callable[[], Any], float, list[float]]] = {}
    for label, fn in forms.items():
        try:
            _sync(torch, gpu)
            start = time.perf_counter()
            fn()
            _sync(torch, gpu)
            live[label] = (fn, (time.perf_counter() - start) * 1e3, [])
        except Exception as exc:  # noqa: BLE001 - that form's error, the others go on
            out[label] = exc
    deadline = time.perf_counter() + budget_s * max(1, len(live))

    def wanted(first: float, times: list[float]) -> bool:
        least = 3 if first < budget_s * 1e3 else 1
        return len(times) < reps and (len(times) < least or time.perf_counter() < deadline)

    while any(wanted(first, times) for _fn, first, times in live.values()):
        for label, (fn, first, times) in list(live.items()):
            if not wanted(first, times):
                continue
            try:
                times.append(_one_ms(torch, gpu, fn))
            except Exception as exc:  # noqa: BLE001
                out[label] = exc
                del live[label]
    for label, (_fn, first, times) in live.items():
        out[label] = (first, statistics.median(times))
    return out


def _one_ms(torch: Any, gpu: bool, fn: Callable[[], Any]) -> float:
    if gpu:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        return float(a.elapsed_time(b))
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def _calibrate(torch: Any, gpu: bool) -> dict[str, Any]:
    device = "cuda" if gpu else "cpu"
    out: dict[str, Any] = {"matmul_tflops": {}}
    dtypes = ("float32", "float16", "bfloat16") if gpu else ("float32",)
    n = 4096 if gpu else 1024
    for name in dtypes:
        dtype = getattr(torch, name)
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        _first, ms = _time_ms(torch, gpu, partial(torch.mm, a, b))
        out["matmul_tflops"][name] = 2 * n**3 / (ms * 1e-3) / 1e12
    elems = (256 if gpu else 32) * 2**20 // 4
    src = torch.empty(elems, device=device, dtype=torch.float32).normal_()
    dst = torch.empty_like(src)
    _first, ms = _time_ms(torch, gpu, lambda: dst.copy_(src))
    out["copy_gbps"] = 2 * src.numel() * 4 / (ms * 1e-3) / 1e9
    return out


def _tensor(
    torch: Any, shape: list[int], dtype: str, strides: list[int] | None, device: str
) -> Any:
    """A random tensor of the recorded shape, dtype and strides (so its memory layout). An
    expanded input (stride 0: one element seen at many places) is replayed as what it was,
    the expanded view of a smaller tensor: random values cannot be written into it."""
    dtype = getattr(torch, dtype)
    if strides and len(strides) == len(shape):
        base = [1 if st == 0 else n for n, st in zip(shape, strides)]
        t = torch.empty_strided(base, [st or 1 for st in strides], dtype=dtype, device=device)
    else:
        t = torch.empty(shape, dtype=dtype, device=device)
    t = t.normal_() if t.is_floating_point() else t.zero_()
    return t.expand(shape)


def _dtype_name(raw: str | None) -> str:
    table = {"float": "float32", "c10::half": "float16", "half": "float16",
             "c10::bfloat16": "bfloat16", "bfloat16": "bfloat16", "double": "float64"}  # fmt: skip
    return table.get((raw or "float").lower(), "float32")


def _replay(torch: Any, gpu: bool, item: dict[str, Any], templates: str | None) -> dict[str, Any]:
    device = "cuda" if gpu else "cpu"
    shapes, strides = item["shapes"], item.get("strides") or []
    dtypes = [_dtype_name(d) for d in item.get("dtypes") or []]
    conv_ = item.get("conv")  # the call's arguments, as rocmfix.profile.analyse reads them
    if not conv_:
        raise ValueError("no replay for " + item["name"])
    stride, dilation, groups = conv_["stride"], conv_["dilation"], conv_["groups"]
    transposed, out_pad = conv_["transposed"], conv_["output_padding"]
    padding = conv_.get("padding_mode") or conv_["padding"]  # "same"/"valid" as it ran
    torch.manual_seed(0)
    x = _tensor(torch, shapes[0], dtypes[0], strides[0] if strides else None, device)
    w = _tensor(torch, shapes[1], dtypes[1], strides[1] if len(strides) > 1 else None, device)
    has_bias = len(shapes) > 2 and bool(shapes[2])
    b = _tensor(torch, shapes[2], dtypes[2], None, device) if has_bias else None
    dims = x.dim() - 2
    fn = torch.nn.functional
    if transposed:
        deconv = {1: fn.conv_transpose1d, 2: fn.conv_transpose2d, 3: fn.conv_transpose3d}[dims]

        def conv(
            x_: Any, w_: Any, b_: Any, stride_: Any, padding_: Any, dilation_: Any, groups_: Any
        ) -> Any:
            return deconv(x_, w_, b_, stride_, padding_, out_pad, groups_, dilation_)

    else:
        conv = {1: fn.conv1d, 2: fn.conv2d, 3: fn.conv3d}[dims]

    def as_run() -> Any:
        return conv(x, w, b, stride, padding, dilation, groups)

    forms = {"as run": as_run}
    layout = {2: torch.channels_last, 3: torch.channels_last_3d}.get(dims)
    if layout is not None:
        xc, wc = x.contiguous(memory_format=layout), w.contiguous(memory_format=layout)
        if not (xc.stride() == x.stride() and wc.stride() == w.stride()):
            forms["channels-last"] = lambda: conv(xc, wc, b, stride, padding, dilation, groups)
        else:
            xn, wn = x.contiguous(), w.contiguous()
            forms["contiguous"] = lambda: conv(xn, wn, b, stride, padding, dilation, groups)
    kernel = list(w.shape[2:])

    def axes(values: Any) -> list[int]:
        return list(values) * dims if len(values) == 1 else list(values)

    st, dl, op_, pd = axes(stride), axes(dilation), axes(out_pad), axes(conv_["padding"])
    # A "same" padding with an odd total pads the far side one more: the op's own forms get
    # the string there, and decline it.
    pad = padding if any(conv_.get("pad_far") or ()) else pd
    plain = kernel == st and not any(pd) and all(d == 1 for d in dl)
    if groups == 1 and plain and not transposed:
        forms["reshape+matmul"] = lambda: _gemm_conv(torch, x, w, b, kernel)
    # The op's own schemes, named by the registry (rocmfix.ops.Op.replay): each takes the
    # call's arguments as its torch functional does, one number per axis.
    args = (x, w, b, st, pad, op_, groups, dl) if transposed else (x, w, b, st, pad, dl, groups)
    for form in item.get("forms") or ():
        if form.get("triton") and not gpu:
            continue  # on a CPU, Triton runs only in its interpreter: nothing a user runs
        module = _template(templates, str(form["template"])) if templates else None
        entry = getattr(module, str(form["function"]), None)
        if callable(entry):
            forms[str(form["label"])] = partial(entry, *args)
    if gpu:

        def native() -> Any:
            with torch.backends.cudnn.flags(enabled=False):
                return as_run()

        if torch.backends.cudnn.enabled:
            forms["native fallback"] = native
    results: dict[str, dict[str, Any]] = {}
    timed = _time_forms(torch, gpu, forms)
    ref = None
    for label, fn in forms.items():
        try:
            got = timed[label]
            if isinstance(got, NotImplementedError):
                continue  # a form of the op's that does not compute this call
            if isinstance(got, Exception):
                raise got
            first, ms = got
            out = fn()
            if ref is None:
                ref = out.double()
                error = 0.0
            else:
                error = float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))
            limit = 1e-3 if out.dtype in (torch.float32, torch.float64) else 3e-2
            results[label] = {"ms": ms, "first_ms": first, "rel_err": error, "ok": error <= limit}
        except Exception as exc:  # noqa: BLE001
            results[label] = {"error": f"{type(exc).__name__}: {exc}"}
    return {"forms": results}


def _gemm_conv(torch: Any, x: Any, w: Any, b: Any, kernel: list[int]) -> Any:
    """A conv whose kernel equals its stride (no padding, no dilation) as the GEMM it is."""
    n, c = x.shape[:2]
    dims = len(kernel)
    out = [s // k for s, k in zip(x.shape[2:], kernel)]
    index = (slice(None), slice(None), *(slice(0, o * k) for o, k in zip(out, kernel)))
    crop = x[index]
    view = [n, c]
    for o, k in zip(out, kernel):
        view += [o, k]
    patches = crop.reshape(view)
    # (n, o..., c, k...) then flattened into rows of c*k... features.
    order = [0] + [2 + 2 * i for i in range(dims)] + [1] + [3 + 2 * i for i in range(dims)]
    rows = patches.permute(order).reshape(-1, w[0].numel())
    y = torch.nn.functional.linear(rows, w.reshape(w.shape[0], -1), b)
    return y.reshape([n, *out, w.shape[0]]).movedim(-1, 1)


_loaded: dict[str, Any] = {}


def _template(folder: str, name: str) -> Any:
    if name not in _loaded:
        try:
            from . import templates as loader

            _loaded[name] = loader.load(folder, name)
        except Exception:  # noqa: BLE001
            _loaded[name] = None
    return _loaded[name]
