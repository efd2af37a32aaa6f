"""Written for rocmfix's tests: per-device settings that already pick the tower's backend."""

import os


def _get_device_config(device_type):
    return {"rocm": {"mm_encoder_attn_backend": "FLASH_ATTN"}}.get(device_type or os.name)
