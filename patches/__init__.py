"""Every patch rocmfix ships, one module per target file, in the order status lists them."""

from . import mineru_tokenizer

PATCHES = (mineru_tokenizer.PATCH,)
