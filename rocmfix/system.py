"""What the probe sees of a target environment beyond its Python packages: the settings and
files the engine traps of a first run show themselves by (issue 42), and which onnxruntime
build owns the ``onnxruntime/`` folder. The probe reads them without importing anything; this
module asks for them and checks the answer, which is untrusted like all of the probe's."""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The onnxruntime builds that all install into one ``onnxruntime/`` folder (the last install
# wins, RapidTable#32), and the providers each lists (their get_available_providers(), read
# from the real wheels by tests/test_mineru_tables.py; the CPU's left out).
ONNXRUNTIME_BUILDS: Mapping[str, tuple[str, ...]] = {
    "onnxruntime": (),
    "onnxruntime-gpu": ("CUDAExecutionProvider", "TensorrtExecutionProvider"),
    "onnxruntime-rocm": ("ROCMExecutionProvider",),
    "onnxruntime-migraphx": ("MIGraphXExecutionProvider",),
}
ONNXRUNTIME_INIT = "onnxruntime/__init__.py"
# Distributions the traps and the tables read, beyond rocmfix.environment's own.
EXTRAS = (*ONNXRUNTIME_BUILDS, "torch-c-dlpack-ext", "lmdeploy", "mineru-llama-cpp", "amdsmi")
# What the probe is asked for.
REQUEST: dict[str, Any] = {
    "env": ["HSA_OVERRIDE_GFX_VERSION", "MINERU_LMDEPLOY_BACKEND", "MINERU_TABLE_DEVICE"],
    # One properties file per GPU node, with its ``gfx_target_version`` (the kernel's KFD).
    "kfd": "/sys/class/kfd/kfd/topology/nodes",
    "devices": ["/dev/kfd"],
    "modules": ["amdsmi"],
    # RECORD lines that show a build: vllm's compiled ops (a ROCm build has _rocm_C), the
    # dlpack extension's per-device addons, and which builds claim onnxruntime/.
    "listings": {
        "vllm": ["vllm/_C.", "vllm/_rocm_C."],
        "torch-c-dlpack-ext": ["torch_c_dlpack_ext/libtorch_c_dlpack_addon"],
        **{name: [ONNXRUNTIME_INIT] for name in ONNXRUNTIME_BUILDS},
    },
    # The file a build writes its own name into: whichever was installed last.
    "owners": {"onnxruntime": "onnxruntime/capi/build_and_package_info.py"},
}
_MAX = 64


@dataclass(frozen=True)
class Owner:
    """The build whose files ``onnxruntime/`` holds, as its own ``build_and_package_info``
    says; ``claimants``: the installed builds whose RECORD lists the folder."""

    package: str | None
    version: str | None
    claimants: tuple[str, ...]


@dataclass(frozen=True)
class System:
    platform: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    # The GPUs' architectures the kernel's KFD lists (``gfx1100``), none where it lists none.
    gfx: tuple[str, ...] = ()
    devices: Mapping[str, bool] = field(default_factory=dict)
    modules: Mapping[str, bool] = field(default_factory=dict)
    listings: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    onnxruntime: Owner | None = None

    def lists(self, distribution: str, prefix: str) -> bool:
        return any(p.startswith(prefix) for p in self.listings.get(distribution, ()))


def gfx_name(target_version: int) -> str | None:
    """``gfx1100`` for the KFD's ``gfx_target_version`` 110000 (``gfx90a`` for 90010)."""
    major, minor, step = target_version // 10000, target_version // 100 % 100, target_version % 100
    if not 7 <= major <= 99 or minor > 15 or step > 15:
        return None
    return f"gfx{major}{minor:x}{step:x}"


def _clean(value: Any) -> str | None:
    if not isinstance(value, str) or len(value) > 200:
        return None
    if any(unicodedata.category(c) == "Cc" for c in value):
        return None
    return value


def _strings(raw: Any) -> tuple[str, ...] | None:
    if not isinstance(raw, list) or len(raw) > _MAX:
        return None
    values = [_clean(v) for v in raw]
    return None if any(v is None for v in values) else tuple(v for v in values if v)


def _flags(raw: Any) -> dict[str, bool] | None:
    if not isinstance(raw, dict) or not all(isinstance(v, bool) for v in raw.values()):
        return None
    return {str(k): v for k, v in raw.items() if _clean(k)}


def parse(raw: Any) -> tuple[System, tuple[str, ...]]:
    """The probe's ``system`` answer, and a note for each part of it that was not what the
    probe writes (left out: less evidence, never a wrong one)."""
    if raw is None:
        return System(), ()
    if not isinstance(raw, dict):
        return System(), ("the probe's system facts are not an object; ignored",)
    bad: list[str] = []
    env_raw: dict[Any, Any] = raw["env"] if isinstance(raw.get("env"), dict) else {}
    env = {str(k): v for k, v in env_raw.items() if _clean(k) and _clean(v) is not None}
    if len(env) != sum(v is not None for v in env_raw.values()):
        bad.append("env")
    numbers = raw.get("gfx", [])
    ok = isinstance(numbers, list) and all(type(n) is int for n in numbers[:_MAX])
    gfx = tuple(n for n in map(gfx_name, numbers[:_MAX]) if n) if ok else None
    devices, modules = _flags(raw.get("devices", {})), _flags(raw.get("modules", {}))
    listings: dict[str, tuple[str, ...]] = {}
    for name, paths in (raw.get("listings") or {}).items():
        found = _strings(paths)
        if found is None or not _clean(name):
            bad.append(f"listings.{name}")
        else:
            listings[name] = found
    owner = None
    onnx = (raw.get("owners") or {}).get("onnxruntime")
    if isinstance(onnx, dict):
        claimants = tuple(n for n in ONNXRUNTIME_BUILDS if ONNXRUNTIME_INIT in listings.get(n, ()))
        owner = Owner(_clean(onnx.get("package_name")), _clean(onnx.get("__version__")), claimants)
    platform = _clean(raw.get("platform", ""))
    for name, value in (
        ("platform", platform),
        ("gfx", gfx),
        ("devices", devices),
        ("modules", modules),
    ):
        if value is None:
            bad.append(name)
    system = System(
        platform=platform or "",
        env=env,
        gfx=gfx or (),
        devices=devices or {},
        modules=modules or {},
        listings=listings,
        onnxruntime=owner,
    )
    notes = tuple(
        f"the probe's system.{name} was not what the probe writes; ignored" for name in bad
    )
    return system, notes
