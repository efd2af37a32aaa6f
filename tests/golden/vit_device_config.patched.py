"""Written for rocmfix's tests: an engine-settings module shaped like MinerU's (a dict of
per-device settings, looked up by a device name the user may leave unset)."""

import os
from typing import Any

# rocmfix: the vision tower's attention on vLLM's TRITON_ATTN (issue 42)
def _rocmfix_vit_attention(config):
    """MinerU's per-device vLLM settings with mm_encoder_attn_backend=TRITON_ATTN, which
    `rocmfix doctor` measured faster than vLLM's own choice (TORCH_SDPA) on this GPU. The
    user's own backend argument and FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE win; off ROCm
    nothing changes. `rocmfix revert` removes this."""
    try:
        import os

        import torch

        flash_triton = os.environ.get("FLASH_ATTENTION_TRITON_AMD_ENABLE", "")
        if getattr(torch.version, "hip", None) and flash_triton.upper() != "TRUE":
            config = dict(config or {})
            config.setdefault("mm_encoder_attn_backend", "TRITON_ATTN")
    except Exception:
        pass
    return config


def _get_device_config(device_type: str) -> dict[str, Any] | None:
    """Settings for one accelerator family."""

    SETTINGS = {
        "acme": {"block_size": 64},
        "other": {"dtype": "float16", "enforce_eager": True},
    }

    def unused() -> int:
        return 1

    return _rocmfix_vit_attention(SETTINGS.get(device_type.lower()))


def settings_for_engine(kwargs: dict[str, Any]) -> dict[str, Any]:
    config = _get_device_config(os.getenv("ACME_DEVICE", ""))
    for key, value in (config or {}).items():
        kwargs.setdefault(key, value)
    return kwargs
