"""The patch embed's op as ``torch.compile`` sees it (rocmfix template; the entry point is
``patch_embed_gemm``, which rocmfix drops beside a Qwen-VL vision tower).

rocmfix drops this file, under this name, beside that module; ``rocmfix revert`` removes it
with it. :func:`graph` is the body of the triton op ``rocmfix::patch_embed_gemm`` (see
``rocmfix_custom_op``): the pointer kernel launched through ``wrap_triton`` with the tile the
eager plan resolves, traced on fake tensors, so Inductor launches the kernel from its own
generated code instead of calling back into rocmfix's Python per node.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import patch_embed_kernels as pk
from . import rocmfix_custom_op as rop
from . import rocmfix_triton as rt


def takes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether the graph launches the kernel for these (fake) tensors: a CUDA/HIP device and
    one dtype, as the eager path launches it. Not under the interpreter, whose kernel is not
    one ``wrap_triton`` can trace."""
    return (
        pk.PTR_KERNEL is not None
        and not rt.INTERPRETING
        and x.device.type == "cuda"
        and weight.dtype == x.dtype
        and (bias is None or bias.dtype == x.dtype)
    )


def graph(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, plan: Any, pack_bytes: int
) -> torch.Tensor:
    """``x[M, K] @ weight[N, K].T (+ bias)``: the eager ``plan``'s tile on the pointer kernel,
    the weight's rows padded to ``pack_bytes`` where the plan packs it (a torch op Inductor
    schedules, as the eager path's cached copy). No tensor descriptors, as in the dilated
    conv's graph: Triton encodes them on the host at every launch, and their checks read
    addresses, which a fake tensor does not have."""
    m, k = x.shape
    n = weight.shape[0]
    w = weight
    if plan.pack:
        align = max(1, pack_bytes // w.element_size())
        w = F.pad(w, (0, -(-k // align) * align - k))[:, :k]
    if bias is not None:
        bias = bias.contiguous()  # the kernel reads bias[n] at bias_ptr + n
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    tiles = -(-m // plan.bm) * -(-n // plan.bn)
    progs = torch.sym_min(tiles, plan.programs) if plan.persistent else tiles
    opts = {key: plan.opts[key] for key in rop.GRAPH_LAUNCH_KEYS}
    aligns = (row_align(x), row_align(w))
    args, kwargs = pk.ptr_launch(x, w, bias, out, aligns, progs, plan, False, opts)
    rop.wrap_triton(pk.PTR_KERNEL)[(progs,)](*args, **kwargs)
    return out


def row_align(t: torch.Tensor) -> int:
    """``patch_embed_gemm._row_align`` on what a fake tensor knows: the row stride, and for
    the address the storage offset (``rop.offset_aligned``); an offset it cannot prove
    aligned reads single elements."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if not rop.offset_aligned(t):
        return 1
    align = max(1, rop.GRAPH_ALIGN // t.element_size())
    while align > 1 and not statically_known_true(t.stride(0) % align == 0):
        align //= 2
    return align
