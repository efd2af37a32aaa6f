"""A call the profiled command made, as ``rocmfix profile``'s replay measures it through
doctor's loop (:mod:`rocmfix.guest.doctor`): the inputs as the call had them (shape, dtype,
strides), the call as it ran (``native``), the other forms of it that compute the same thing
(``setting``: another memory layout, a kernel-sized stride as one GEMM, the native kernel with
the vendor library off) and each scheme of the call's op (``scheme``: the function of its entry
that takes the call's arguments as its torch functional does, ``OpSpec.replay``; it raises
NotImplementedError for a call it does not compute). The reference is the call as it ran."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from .. import context
from ..context import Context, Unavailable
from ..protocol import Call, OpSpec
from . import base


def _tensor(ctx: Context, shape: list[int], dtype: str, strides: list[int] | None) -> Any:
    """A random tensor of the recorded shape, dtype and strides (so its memory layout). An
    expanded input (stride 0: one element seen at many places) is replayed as what it was,
    the expanded view of a smaller tensor: random values cannot be written into it."""
    torch = context.torch
    kind = getattr(torch, dtype, None)
    if not isinstance(kind, torch.dtype):
        raise Unavailable(f"no replay in dtype {dtype[:40]!r}")
    if strides and len(strides) == len(shape):
        base_ = [1 if st == 0 else n for n, st in zip(shape, strides)]
        t = torch.empty_strided(base_, [st or 1 for st in strides], dtype=kind, device=ctx.device)
    else:
        t = torch.empty(shape, dtype=kind, device=ctx.device)
    t = t.normal_() if t.is_floating_point() else t.zero_()
    return t.expand(shape)


def use_backend(flags: Mapping[str, Any]) -> None:
    """The run's torch backend flags, as the profiler recorded them."""
    torch = context.torch
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    setters: dict[str, Callable[[Any], Any]] = {
        "cudnn.enabled": lambda v: setattr(cudnn, "enabled", bool(v)),
        "cudnn.benchmark": lambda v: setattr(cudnn, "benchmark", bool(v)),
        "cudnn.deterministic": lambda v: setattr(cudnn, "deterministic", bool(v)),
        "cudnn.allow_tf32": lambda v: setattr(cudnn, "allow_tf32", bool(v)),
        "matmul.allow_tf32": lambda v: setattr(matmul, "allow_tf32", bool(v)),
        "float32_matmul_precision": torch.set_float32_matmul_precision,
        # The run's own thread count: a CPU op replayed on more threads than it ran on, on a
        # loaded machine, waits on the scheduler and reads many times slower than it ran.
        "num_threads": lambda v: torch.set_num_threads(max(1, int(v))),
    }
    for key, value in flags.items():
        if key in setters:
            with contextlib.suppress(Exception):
                setters[key](value)


class Bench(base.Bench):
    def __init__(self, ctx: Context, op: OpSpec | None, call: Call) -> None:
        torch = context.torch
        self.ctx, self.call, self.op = ctx, call, op
        torch.manual_seed(0)
        strides = call.strides + [[]] * len(call.shapes)
        dtypes = call.dtypes + ["float32"] * len(call.shapes)
        inputs: list[Any] = [
            _tensor(ctx, shape, dtypes[i], strides[i]) if shape else None
            for i, shape in enumerate(call.shapes[:3])
        ]
        self.inputs = inputs + [None] * (3 - len(inputs))
        self.x = self.inputs[0]
        self._ref: Any = None
        self.args: tuple[Any, ...] = ()
        if call.name == "aten::copy_":
            self.forms: dict[str, Callable[[], Any]] = {}
            self.as_run = partial(inputs[1].copy_, inputs[0])
        elif call.name == "aten::mm":
            self.forms = {}
            self.as_run = partial(torch.mm, inputs[0], inputs[1])
        else:
            self._conv()

    def _conv(self) -> None:
        """The conv as it ran, and its forms."""
        torch, fn, call = context.torch, context.F, self.call
        x, w, b = self.inputs
        dims = x.dim() - 2
        padding = call.padding_mode or call.padding  # "same"/"valid" as it ran
        if call.transposed:
            deconv = getattr(fn, f"conv_transpose{dims}d")

            def conv(x_: Any, w_: Any) -> Any:
                return deconv(x_, w_, b, call.stride, padding, call.output_padding, call.groups,
                              call.dilation)  # fmt: skip

        else:
            conv_ = getattr(fn, f"conv{dims}d")

            def conv(x_: Any, w_: Any) -> Any:
                return conv_(x_, w_, b, call.stride, padding, call.dilation, call.groups)

        self.as_run = partial(conv, x, w)
        self.forms = {}
        layout = {2: torch.channels_last, 3: torch.channels_last_3d}.get(dims)
        if layout is not None:
            xc, wc = x.contiguous(memory_format=layout), w.contiguous(memory_format=layout)
            if not (xc.stride() == x.stride() and wc.stride() == w.stride()):
                self.forms["channels-last"] = partial(conv, xc, wc)
            else:
                self.forms["contiguous"] = partial(conv, x.contiguous(), w.contiguous())
        kernel = list(w.shape[2:])
        plain = kernel == call.stride and not any(call.padding) and max(call.dilation) == 1
        if call.groups == 1 and plain and not call.transposed:
            self.forms["reshape+matmul"] = partial(_gemm_conv, x, w, b, kernel)
        if self.ctx.gpu and torch.backends.cudnn.enabled:

            def native() -> Any:
                with torch.backends.cudnn.flags(enabled=False):
                    return self.as_run()

            self.forms["native fallback"] = native
        # A "same" padding with an odd total pads the far side one more: the op's own forms
        # get the string there, and decline it.
        pad = padding if any(call.pad_far) else call.padding
        if call.transposed:
            self.args = (x, w, b, call.stride, pad, call.output_padding, call.groups,
                         call.dilation)  # fmt: skip
        else:
            self.args = (x, w, b, call.stride, pad, call.dilation, call.groups)

    @property
    def ref(self) -> Any:
        if self._ref is None:
            self._ref = self.as_run().double()
        return self._ref

    def native(self) -> Callable[[], Any]:
        return self.as_run

    def setting(self, scheme: str) -> Callable[[], Any]:
        if scheme not in self.forms:
            raise Unavailable(f"no {scheme} form of {self.call.name}")
        return self.forms[scheme]

    def scheme(self, module: Any) -> tuple[Callable[[], Any], dict[str, Any] | None]:
        entry = getattr(module, self.op.replay if self.op is not None else "", None)
        if not callable(entry):
            raise Unavailable(f"{getattr(module, '__name__', module)} replays no call")

        def run() -> Any:
            try:
                return entry(*self.args)
            except NotImplementedError as exc:  # a scheme that does not compute this call
                raise Unavailable(str(exc) or "the scheme does not compute this call") from None

        return run, None

    def tolerance(self) -> float:
        dtype = self.inputs[0].dtype
        return 1e-3 if dtype in (context.torch.float32, context.torch.float64) else 3e-2


def _gemm_conv(x: Any, w: Any, b: Any, kernel: list[int]) -> Any:
    """A conv whose kernel equals its stride (no padding, no dilation) as the GEMM it is."""
    n, c = x.shape[:2]
    dims = len(kernel)
    out = [s // k for s, k in zip(x.shape[2:], kernel)]
    index = (slice(None), slice(None), *(slice(0, o * k) for o, k in zip(out, kernel)))
    view = [n, c]
    for o, k in zip(out, kernel):
        view += [o, k]
    patches = x[index].reshape(view)
    # (n, o..., c, k...) then flattened into rows of c*k... features.
    order = [0] + [2 + 2 * i for i in range(dims)] + [1] + [3 + 2 * i for i in range(dims)]
    rows = patches.permute(order).reshape(-1, w[0].numel())
    y = context.F.linear(rows, w.reshape(w.shape[0], -1), b)
    return y.reshape([n, *out, w.shape[0]]).movedim(-1, 1)
