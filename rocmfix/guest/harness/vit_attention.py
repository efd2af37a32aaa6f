"""The vision tower's attention as vLLM runs it: ``q, k, v[1, S, H, D]`` with the batch's
images as sequences of ``cu_seqlens``. Native is vLLM's ``TORCH_SDPA`` wrapper (one
``F.scaled_dot_product_attention`` per image, torch's own kernel choice); each scheme is a
setting of the same stack, run by name (``rocmfix.ops.vit_attention``)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

from .. import context
from ..context import Context, Unavailable, one_line
from ..protocol import OpSpec
from . import base

# Read by ROCm torch's SDPA before it first dispatches: the host starts the worker that
# measures ``sdpa-aotriton`` with it set, and every other worker without it.
AOTRITON_ENV = "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"
_SDPA_BACKENDS = {
    "sdpa-flash": "FLASH_ATTENTION",
    "sdpa-efficient": "EFFICIENT_ATTENTION",
    "sdpa-math": "MATH",
}


def reference(q: Any, k: Any, v: Any, lengths: list[int], scale: float) -> Any:
    """fp64 attention of each sequence on its own, one head at a time (a page's 5476 tokens
    make a 240 MB score matrix a head)."""
    torch = context.torch
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    start = 0
    for n in lengths:
        for h in range(q.shape[2]):
            qi, ki, vi = (x[0, start : start + n, h].double() for x in (q, k, v))
            out[0, start : start + n, h] = torch.softmax(qi @ ki.T * scale, dim=-1) @ vi
        start += n
    return out


class Bench(base.Bench):
    def __init__(self, ctx: Context, op: OpSpec | None, shape: dict[str, Any]) -> None:
        super().__init__(ctx, op, shape)
        torch, s = context.torch, shape
        self.lengths = [int(n) for n in s["seqlens"]]
        size = (1, sum(self.lengths), int(s["heads"]), int(s["head_dim"]))
        q, k, v = (
            torch.randn(size, generator=self.generator, device=ctx.device).to(self.dtype)
            for _ in range(3)
        )
        self.q, self.k, self.v = q, k, v
        self.x = q  # the output has q's shape and dtype
        self.scale = float(s["head_dim"]) ** -0.5
        bounds = [0]
        for n in self.lengths:
            bounds.append(bounds[-1] + n)
        self.cu_seqlens = torch.tensor(bounds, dtype=torch.int32, device=ctx.device)
        self.ref = reference(q, k, v, self.lengths, self.scale)

    def _sdpa(self) -> Any:
        """vLLM's ``torch_sdpa_wrapper``: the lengths read back from ``cu_seqlens``, one
        SDPA call per image on ``b h s d`` views, the outputs concatenated."""
        torch, F = context.torch, context.F
        cu = self.cu_seqlens
        lengths = (cu[1:] - cu[:-1]).tolist()
        outs = []
        for qi, ki, vi in zip(*(torch.split(x, lengths, dim=1) for x in (self.q, self.k, self.v))):
            out = F.scaled_dot_product_attention(
                qi.transpose(1, 2),
                ki.transpose(1, 2),
                vi.transpose(1, 2),
                dropout_p=0.0,
                scale=self.scale,
            )
            outs.append(out.transpose(1, 2))
        return torch.cat(outs, dim=1)

    def native(self) -> Callable[[], Any]:
        return self._sdpa

    def setting(self, scheme: str) -> Callable[[], Any]:
        if scheme == "triton-attn":
            return self._triton()
        if scheme == "sdpa-aotriton":
            # The setting first: a CPU run then shows that the host started this worker with it.
            if os.environ.get(AOTRITON_ENV) != "1":
                raise Unavailable(f"this worker was started without {AOTRITON_ENV}=1")
            if not getattr(context.torch.version, "hip", None):
                raise Unavailable(f"{AOTRITON_ENV} is ROCm torch's; this torch is not a ROCm build")
            return self._sdpa
        if scheme not in _SDPA_BACKENDS:
            raise Unavailable(f"unknown setting {scheme}")
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
        except ImportError as exc:
            raise Unavailable(f"torch {context.torch.__version__} has no sdpa_kernel") from exc
        backend = getattr(SDPBackend, _SDPA_BACKENDS[scheme])

        def forced() -> Any:
            with sdpa_kernel(backend):
                return self._sdpa()

        try:  # a kernel this GPU, dtype or head_dim has none of: not a wrong result
            forced()
        except RuntimeError as exc:
            raise Unavailable(one_line(exc)) from exc
        return forced

    def _triton(self) -> Callable[[], Any]:
        """vLLM's own ``TRITON_ATTN`` kernel for the tower, from the installed vLLM, called as
        its ``triton_attn_wrapper`` calls it."""
        try:
            kernel = importlib.import_module("vllm.v1.attention.ops.triton_prefill_attention")
        except Exception as exc:  # no vLLM, or one that will not import here
            raise Unavailable(f"vLLM's Triton attention does not import: {one_line(exc)}") from exc
        q, k, v = (x[0] for x in (self.q, self.k, self.v))
        cu, longest = self.cu_seqlens, max(self.lengths)

        def call() -> Any:
            out = context.torch.empty_like(q)
            kernel.context_attention_fwd(
                q,
                k,
                v,
                out,
                b_start_loc=cu[:-1],
                b_seq_len=cu[1:] - cu[:-1],
                max_input_len=longest,
                is_causal=False,
                softmax_scale=self.scale,
            )
            return out

        return call

    def tolerance(self) -> float:
        return 1e-4 if self.shape["dtype"] == "float32" else 2e-2
