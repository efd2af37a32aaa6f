"""Written for rocmfix's tests: an engine-settings module shaped like MinerU's (a dict of
per-device settings, looked up by a device name the user may leave unset)."""

import os
from typing import Any


def _get_device_config(device_type: str) -> dict[str, Any] | None:
    """Settings for one accelerator family."""

    SETTINGS = {
        "acme": {"block_size": 64},
        "other": {"dtype": "float16", "enforce_eager": True},
    }

    def unused() -> int:
        return 1

    return SETTINGS.get(device_type.lower())


def settings_for_engine(kwargs: dict[str, Any]) -> dict[str, Any]:
    config = _get_device_config(os.getenv("ACME_DEVICE", ""))
    for key, value in (config or {}).items():
        kwargs.setdefault(key, value)
    return kwargs
