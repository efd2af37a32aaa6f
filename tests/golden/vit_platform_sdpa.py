"""Written for rocmfix's tests: a ROCm platform whose tower backend falls back to SDPA."""

import enum


class Backend(enum.Enum):
    FLASH_ATTN = 1
    TRITON_ATTN = 2
    TORCH_SDPA = 3


class RocmPlatform:
    @classmethod
    def get_supported_vit_attn_backends(cls):
        return [Backend.FLASH_ATTN, Backend.TRITON_ATTN, Backend.TORCH_SDPA]

    @classmethod
    def get_vit_attn_backend(cls, head_size, dtype, backend=None):
        if backend is not None:
            return backend
        if head_size % 32 == 0:
            return Backend.FLASH_ATTN
        return Backend.TORCH_SDPA
