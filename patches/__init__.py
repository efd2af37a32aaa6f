"""Every patch rocmfix ships, one module per target file, in the order status lists them."""

from . import (
    doclayout_dilated_conv,
    mineru_tokenizer,
    vllm_qwen2_5_vl,
    vllm_qwen2_vl,
    vllm_qwen3_vl,
)

PATCHES = (
    vllm_qwen2_vl.PATCH,
    vllm_qwen2_5_vl.PATCH,
    vllm_qwen3_vl.PATCH,
    doclayout_dilated_conv.PATCH,
    mineru_tokenizer.PATCH,
)
