"""The depthwise conv's op as ``torch.compile`` sees it (rocmfix template; the entry point is
``depthwise_conv_triton``, which rocmfix drops beside a conv-norm-act layer).

rocmfix drops this file, under this name, beside that module; ``rocmfix revert`` removes it
with it. :func:`graph` is the body of the triton op ``rocmfix::depthwise_conv2d`` (see
``rocmfix_custom_op``): torch ops and one ``wrap_triton`` launch of the kernel with the config
the eager plan resolves, traced on fake tensors, so Inductor launches the kernel from its own
generated code. :func:`reference` is the op in torch, for inputs the kernel does not take;
:func:`fake` its output's shape; :func:`conv` the kernel alone, with no checks (``rocmfix
tune``, ``doctor`` and the tests call it through the entry module).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import depthwise_conv_config as dc
from . import depthwise_conv_kernels as dk
from . import rocmfix_custom_op as rop
from . import rocmfix_kernel_config as kc
from . import rocmfix_kernel_support as ks
from . import rocmfix_launcher as rl
from . import rocmfix_triton as rt


def conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    *,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    act: int = 0,
    config: dict[str, Any] | None = None,
) -> torch.Tensor:
    """The kernel alone, no checks and no fallback, for ``rocmfix tune``/``doctor`` and tests:
    ``act(conv(x) * scale + shift)``; ``config`` over the resolved one."""
    if dk.KERNEL is None:
        raise RuntimeError("triton is not importable")
    st, pad = ks.pair(stride), ks.pair(padding)
    assert st is not None and pad is not None
    kh, kw = int(weight.shape[2]), int(weight.shape[3])
    cfg = dc.resolve_config(x.device, kh, kw, st[0], x.dtype, dc.layout_class(x))
    if config:
        cfg.update(dc.CONFIG.validate(config))
    kernel, grid, args, kwargs, out = dk.prepare_launch(x, weight, st, pad, cfg, scale, shift, act)
    rl.Launcher(kernel, grid, kwargs, rl.device_index(x)).launch_once(*args)
    return out


def reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    act: int,
) -> torch.Tensor:
    y = F.conv2d(x, weight, None, stride, padding, 1, x.shape[1]).float()
    if scale is not None:
        y = y * scale.view(1, -1, 1, 1)
    if shift is not None:
        y = y + shift.view(1, -1, 1, 1)
    return ks.apply_act(y, act).to(x.dtype)


def fake(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    act: int,
) -> torch.Tensor:
    """The op's output on fake tensors (its opaque op's fake implementation)."""
    n, c, h, w = x.shape
    oh = (h + 2 * padding[0] - weight.shape[2]) // stride[0] + 1
    ow = (w + 2 * padding[1] - weight.shape[3]) // stride[1] + 1
    return x.new_empty((n, c, oh, ow))


def graph(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    act: int,
) -> torch.Tensor:
    """``act(conv(x) * scale + shift)``, NCHW-contiguous: the kernel's launch for CUDA/HIP
    tensors (the entry's traced path checked the geometry), :func:`reference` elsewhere (the
    interpreter's kernel is not compiled: ``wrap_triton`` cannot trace it)."""
    if dk.KERNEL is None or rt.INTERPRETING or x.device.type != "cuda":
        return reference(x, weight, scale, shift, stride, padding, act).contiguous()
    st, pad = (int(stride[0]), int(stride[1])), (int(padding[0]), int(padding[1]))
    kh, kw = int(weight.shape[2]), int(weight.shape[3])
    cfg = dc.resolve_config(x.device, kh, kw, st[0], x.dtype, dc.layout_class(x))
    # The eager plan's launch; whether it reads pairs is chosen from what the fake promises.
    kernel, grid, args, kwargs, out = dk.prepare_launch(
        x, weight, st, pad, cfg, scale, shift, act, aligned=rop.offset_aligned
    )
    for key in kc.launch_options(cfg):
        if key not in rop.GRAPH_LAUNCH_KEYS:
            kwargs.pop(key, None)
    rop.wrap_triton(kernel)[grid](*args, **kwargs)
    return out
