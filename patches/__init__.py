"""Every patch rocmfix ships, one module per target file (or per family of files with one
shape), in the order status lists them."""

from . import (
    doclayout_conv,
    doclayout_dilated_conv,
    lmdeploy_vision,
    mineru_graphs,
    mineru_pytorchocr,
    mineru_tables,
    mineru_tokenizer,
    mineru_vit_attention,
    sglang_vision,
    transformers_hgnet,
    transformers_vision,
    vllm_vision,
)

PATCHES = (
    *vllm_vision.PATCHES,
    *transformers_vision.PATCHES,
    *sglang_vision.PATCHES,
    *lmdeploy_vision.PATCHES,
    *transformers_hgnet.PATCHES,
    *mineru_pytorchocr.PATCHES,
    *mineru_graphs.PATCHES,
    *mineru_tables.PATCHES,
    *mineru_vit_attention.PATCHES,
    doclayout_conv.PATCH,
    doclayout_dilated_conv.PATCH,
    mineru_tokenizer.PATCH,
)
