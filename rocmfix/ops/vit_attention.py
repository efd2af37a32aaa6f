"""The attention of the VLM's vision tower: MinerU2.5's (a Qwen2-VL tower, head_dim 80) as
vLLM runs it, every image of a batch one variable-length sequence (``cu_seqlens``).

vLLM's ``platforms/rocm.py::get_vit_attn_backend`` gives RDNA (gfx11/gfx12) ``TORCH_SDPA``
unless flash-attn's Triton-AMD backend is installed and enabled, and torch's SDPA on those
archs silently runs its math path unless ``TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1``
(3.6-11.8x slower, unsloth#8821, gfx1200). vLLM's ``TRITON_ATTN`` gives 1.8-6.5x better
time-to-first-token on Qwen-VL towers (vllm#32944). Which is fastest depends on the arch and
the ROCm release, so ``doctor`` times each backend this stack has at MinerU's shapes and
stores each one's speed-up over vLLM's stock choice (:mod:`rocmfix.measured`); ``env``
exports the AOTriton flag, and the ``mineru-vit-attention`` patches select ``TRITON_ATTN``,
only where it measured faster here. The schemes are settings of the user's own stack, not
templates: nothing is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .base import DTYPES, Case, Op, Scheme, TensorShape

# The MinerU2.5 tower (Qwen2-VL's vision config): embed 1280 over 16 heads of 80, 14-pixel
# patches merged 2x2, so a side is a multiple of 28 pixels and an image of W x H pixels is
# (W / 14) x (H / 14) tokens.
HEADS, HEAD_DIM, PATCH = 16, 80, 14
AOTRITON_ENV = "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"
# vLLM's name of the backend the Triton scheme is (``--mm-encoder-attn-backend``).
TRITON_BACKEND = "TRITON_ATTN"


def tokens(width: int, height: int) -> int:
    return (width // PATCH) * (height // PATCH)


def shape(*images: tuple[int, int], heads: int = HEADS, dtype: str = "bfloat16") -> dict[str, Any]:
    """One tower call: the images of a batch as pixel sizes, their token counts the
    sequences ``cu_seqlens`` separates."""
    return {
        "heads": heads,
        "head_dim": HEAD_DIM,
        "seqlens": [tokens(w, h) for w, h in images],
        "dtype": dtype,
    }


def _case(gpu: dict[str, Any]) -> Case:
    # The interpreter's shape: the same head_dim and number of sequences, two heads, each
    # sequence a sixteenth as long, in fp32 (CPU bf16 attention is slow and says nothing).
    small = [max(4, n // 16) for n in gpu["seqlens"]]
    lengths = "-".join(str(n) for n in gpu["seqlens"])
    return Case(
        f"vit-attention-h{gpu['heads']}-d{gpu['head_dim']}-s{lengths}-{DTYPES[gpu['dtype']]}",
        gpu,
        dict(gpu, heads=2, seqlens=small, dtype="float32"),
    )


# MinerU's two-step extraction: the whole page at 1036 x 1036 (its layout pass: 74 x 74 =
# 5476 tokens), then the page's blocks cropped and batched (a paragraph, a table, a heading,
# a formula, a figure: 5,024 tokens over five sequences).
PAGE = shape((1036, 1036))
BLOCKS = shape((1008, 252), (504, 504), (1008, 112), (280, 280), (728, 392))
CASES = (_case(PAGE), _case(BLOCKS))


# Which SDPA kernel a call ran, from the op it called.
SDPA_MATH = "aten::_scaled_dot_product_attention_math"
SDPA_KERNELS = {
    SDPA_MATH: "math",
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cuDNN",
}


def kernel_ran(
    callees: Sequence[str], hip: bool, env: Mapping[str, str]
) -> tuple[str, str | None] | None:
    """SDPA's kernel, and on ROCm without the AOTriton flag its math fallback's fix."""
    ran = next((SDPA_KERNELS[c] for c in callees if c in SDPA_KERNELS), None)
    if ran is None:
        return None
    if ran == "math" and hip and env.get(AOTRITON_ENV) != "1":
        return f"SDPA's {ran} kernel", (
            "ROCm torch keeps AOTriton flash attention for consumer Radeon cards behind "
            f"{AOTRITON_ENV}=1; `rocmfix env` exports it where `rocmfix doctor --op "
            "vit-attention` measured it faster"
        )
    return f"SDPA's {ran} kernel", None


def label(s: TensorShape) -> str:
    lengths = s["seqlens"]
    seqs = f"{lengths[0]} tokens" if len(lengths) == 1 else f"{len(lengths)} seqs {sum(lengths)}"
    return f"{s['heads']}h d{s['head_dim']} {seqs} {DTYPES.get(s['dtype'], s['dtype'])}"


OP = Op(
    name="vit-attention",
    title="vision attention",
    native="vLLM's TORCH_SDPA",
    schemes=(
        Scheme(
            "triton-attn",
            "vLLM's TRITON_ATTN for the vision tower (--mm-encoder-attn-backend)",
            "TRITON_ATTN",
            "",
            needs_triton=True,
        ),
        Scheme(
            "sdpa-aotriton",
            f"SDPA with {AOTRITON_ENV}=1 (AOTriton's kernels on RDNA)",
            "SDPA+AOTriton",
            "",
            env=((AOTRITON_ENV, "1"),),
        ),
        Scheme("sdpa-flash", "SDPA's flash kernel (sdpa_kernel)", "SDPA flash", ""),
        Scheme("sdpa-efficient", "SDPA's efficient kernel (sdpa_kernel)", "SDPA efficient", ""),
        Scheme("sdpa-math", "SDPA's math path (sdpa_kernel)", "SDPA math", ""),
    ),
    cases=CASES,
    harness="vit_attention",
    label=label,
    function="vit_attention",
    fallback="sdpa-efficient",
    dtypes=("bfloat16",),
    measured_verdict=True,
    order=60,
    # vLLM's TORCH_SDPA runs the tower's SDPA from its ViT wrappers (vllm#27190's refactor put
    # them in v1/attention/ops; earlier releases called it from the layer itself).
    calls=("scaled_dot_product_attention",),
    kernel_ran=kernel_ran,
    sites=(
        "vllm/v1/attention/ops/vit_attn_wrappers.py",
        "vllm/model_executor/layers/attention/mm_encoder_attention.py",
        "vllm/attention/layers/mm_encoder_attention.py",
    ),
)
