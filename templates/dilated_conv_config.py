"""The launch configurations of rocmfix's dilated conv kernels, and which one a call runs
(rocmfix template; the kernels are ``dilated_conv_kernels``, the entry ``dilated_conv_triton``).

rocmfix drops this file, under this name, beside those modules; ``rocmfix revert`` removes it
with them. The configs are data (:data:`SHIPPED_CONFIGS`, keyed by GPU arch);
``rocmfix_kernel_config`` merges them with the tuned file and ``$ROCMFIX_DILATED_CONV_CONFIG``.
"""

from __future__ import annotations

from typing import Any

import torch

from . import rocmfix_kernel_config as kc

CONFIG_ENV = "ROCMFIX_DILATED_CONV_CONFIG"
KERNEL = "dilated_conv"

# Launch configurations per GPU arch.  Inside an arch, keys go from least to most specific:
# "any", then the precision class ("tf32": fp32 through a reduced-precision dot, "fp32": strict
# IEEE fp32, "f16": fp16/bf16), then the shape class "c<C>_k<K>" (C in = C out) or
# "c<Cin>x<Cout>_k<K>", then "<shape class>_<precision class>".  More specific keys override
# fields of less specific ones; "default" is the base for every arch.
SHIPPED_CONFIGS: dict[str, dict[str, dict[str, Any]]] = {
    "default": {
        "any": {
            "BLOCK_M": 64,
            "BLOCK_N": 64,
            "BLOCK_K": 32,
            "num_warps": 4,
            "num_stages": 2,
            "taps_inner": True,
            "nhwc": True,
            "tma": False,
            "w_kmajor": True,
        },
        # Strict fp32 runs on FMA units everywhere: short K steps keep register use down, and
        # the FMA dot reads an N-contiguous weight tile best.
        "fp32": {"BLOCK_K": 16, "w_kmajor": False},
    },
    # NVIDIA Hopper: bench/dilated_conv.py's sweep on an H200 (torch 2.11, Triton 3.6,
    # 2026-11-22), ranked by CUDA-graph GPU time at batch 1 + batch 4; tables in
    # docs/performance-dilated-conv.md.  Every fast fp32/bf16 config reads a channels-last copy
    # of x (16-byte cp.async); strict fp32 (an FMA dot) is fastest on the strided loads.
    "sm_90": {
        "any": {
            "BLOCK_M": 128,
            "BLOCK_N": 64,
            "BLOCK_K": 32,
            "num_warps": 4,
            "num_stages": 3,
            "taps_inner": True,
            "nhwc": True,
            "tma": False,
        },
        "f16": {"BLOCK_K": 64},
        "fp32": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_stages": 2, "nhwc": False},
        # P3 of yolov10m-doclayout: 96 -> 96, 5x5, d = 1, 2, 3. Chosen for the worst ratio to
        # cuDNN over batch 1 and 4 (bench/dilated_batches.py): 0.82x, where the earlier
        # 64x128x32 tile, picked on the batch sum, fell to 0.70x at batch 4. On 8 warps since
        # 2026-11-23: on 4 it spills 38 registers under Triton 3.6/3.7 (docs/amd-kernels.md),
        # and 8 measured 0.84x worst case against 4's 0.82x (H200, torch 2.11, Triton 3.6).
        "c96_k5_tf32": {
            "BLOCK_M": 128,
            "BLOCK_N": 128,
            "BLOCK_K": 32,
            "num_warps": 8,
            "tma": True,
        },
        "c96_k5_f16": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "num_stages": 4, "tma": True},
        "c96_k5_fp32": {"BLOCK_N": 32, "BLOCK_K": 16},
        # P4: 192 -> 192, 3x3, d = 1, 3, 5 (the "any"/"f16"/"fp32" entries are its winners).
    },
    # CDNA3 (MI300): tf32 exists only here among AMD archs.  Unmeasured: AITER's general-conv
    # tile (64x64, 4 warps), with BLOCK_K 32 because it divides both model widths (96, 192).
    "gfx942": {
        "any": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2},
    },
    # RDNA3 (7900 XTX).  Unmeasured: no async copy, so deeper pipelines only cost LDS
    # (AITER DESIGN section 5.0); BLOCK_K a multiple of 16 keeps WMMA for fp16/bf16.  fp32 has
    # no WMMA on RDNA3: the dot runs on FMA.
    "gfx1100": {
        "any": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 1},
        "fp32": {"BLOCK_K": 16},
        "tf32": {"BLOCK_K": 16},
    },
}

# Archs whose Triton backend accepts input_precision="tf32".  On AMD only CDNA3 has xf32; every
# NVIDIA arch from Ampere (sm_80) on has tf32 (checked in _arch_has_tf32).
TF32_HIP_ARCHS = frozenset({"gfx942"})
CONFIG = kc.KernelConfig(
    KERNEL,
    CONFIG_ENV,
    SHIPPED_CONFIGS,
    {
        "taps_inner": kc.flag,
        "nhwc": kc.flag,
        "tma": kc.flag,
        "w_kmajor": kc.flag,
        "input_precision": kc.one_of("tf32", "tf32x3", "bf16x3", "bf16x6", "ieee"),
    },
)


def _arch_has_tf32(arch: str) -> bool:
    if arch in TF32_HIP_ARCHS:
        return True
    if arch.startswith("sm_"):
        try:
            return int(arch[3:]) >= 80
        except ValueError:
            return False
    return False


def _conv_precision_reader() -> Any:
    """torch >= 2.9's getter behind ``torch.backends.cudnn.conv.fp32_precision``, bound to its
    scope: the attribute goes through a failed lookup and ``__getattr__`` first, ~1 us of
    host time on every call that asks (every fp32 call, as cuDNN asks too). None elsewhere."""
    try:
        getter = torch._C._get_fp32_precision_getter  # type: ignore[attr-defined]
        scope = torch.backends.cudnn.conv  # type: ignore[attr-defined]
        backend, op = scope.backend, scope.op
        if getter(backend, op) != scope.fp32_precision:
            return None
    except Exception:  # noqa: BLE001  # torch < 2.9, or laid out otherwise
        return None
    return lambda: getter(backend, op)


_read_conv_precision = _conv_precision_reader()


def torch_allows_tf32() -> bool:
    """Whether torch lets cuDNN/MIOpen convolutions use TF32 for fp32 (torch's default: yes)."""
    try:
        if _read_conv_precision is not None:
            prec = _read_conv_precision()
        else:
            prec = torch.backends.cudnn.conv.fp32_precision  # type: ignore[attr-defined]  # torch >= 2.9
        if prec == "none":  # inherit from the parent scopes
            prec = getattr(torch.backends.cudnn, "fp32_precision", "none")
            if prec == "none":
                prec = getattr(torch.backends, "fp32_precision", "none")
        if prec in ("tf32", "ieee"):
            return bool(prec == "tf32")
    except Exception:  # noqa: BLE001  # torch < 2.9 has no fp32_precision: legacy flag
        pass
    try:
        return bool(torch.backends.cudnn.allow_tf32)
    except Exception:  # noqa: BLE001  # mixed legacy/new flags raise on read: be strict
        return False


def precision_class(dtype: torch.dtype, arch: str) -> str:
    """``f16`` for fp16/bf16; for fp32 ``tf32`` if torch allows it and the arch has it, else
    ``fp32`` (strict IEEE)."""
    if dtype in (torch.float16, torch.bfloat16):
        return "f16"
    if dtype == torch.float32 and _arch_has_tf32(arch) and torch_allows_tf32():
        return "tf32"
    return "fp32"


def shape_class(c_in: int, c_out: int, k: int) -> str:
    chans = f"c{c_in}" if c_in == c_out else f"c{c_in}x{c_out}"
    return f"{chans}_k{k}"


def resolve_config(
    device: torch.device | str | int | None = None,
    c_in: int = 0,
    c_out: int = 0,
    k: int = 3,
    dtype: torch.dtype = torch.float32,
    *,
    arch: str | None = None,
) -> dict[str, Any]:
    """Launch config for one conv shape on ``device``.

    Layers, least specific first: "any", the precision class, the shape class, then
    "<shape>_<precision>" (see rocmfix_kernel_config for the sources). The result always holds
    BLOCK_M/N/K, num_warps, num_stages and input_precision.
    """
    arch = arch or kc.device_arch(device)
    prec = precision_class(dtype, arch)
    shape = shape_class(c_in, c_out, k)
    cfg = CONFIG.resolve(arch, ("any", prec, shape, f"{shape}_{prec}"))
    if prec == "tf32":
        cfg.setdefault("input_precision", "tf32")
    else:
        # Strict fp32 must stay IEEE whatever a config says; 16-bit dots ignore the field.
        cfg["input_precision"] = "ieee"
    return cfg
