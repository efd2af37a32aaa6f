"""Triton dilated conv2d for DocLayout-YOLO's ``DilatedBlock.dilated_conv`` (rocmfix template).

rocmfix dropped this file into ``doclayout_yolo/nn/modules/`` as ``g2l_crm_triton.py`` and rewrote
``DilatedBlock.dilated_conv`` to call :func:`dilated_conv2d` for GPU inputs with the block's
``bn`` and ``act``, which the kernel applies as it stores (an eval-mode BatchNorm and SiLU; other
modules are called on its output).  ``rocmfix revert`` removes this file and restores the
original method.

Why: on ROCm, MIOpen has no fast solver for dilation > 1 and falls back to a naive kernel.  This
module computes the same thing as ``F.conv2d(x, w, None, stride=1, padding=p, dilation=d)``
(then, where the block passes them, its BatchNorm and SiLU) with a Triton kernel:

* the ``dot`` kernel (the default): implicit GEMM.  Output pixels (N*OH*OW) x output channels
  are tiled, the C*KH*KW reduction runs through ``tl.dot`` with an fp32 accumulator, and no
  im2col buffer exists.  Config flags pick how the input is read: ``nhwc`` (a channels-last
  copy of x, so each thread moves 16 bytes), ``tma`` (tensor descriptors: Hopper's TMA, one
  output-row segment per program) or neither (strided loads straight from x, any layout).
* the ``fma`` kernel (config ``"kernel": "fma"``): the same tiling with an outer-product FMA
  loop instead of ``tl.dot``, for GPUs or compilers where ``tl.dot`` misbehaves.

Launch configurations are data (:data:`SHIPPED_CONFIGS`, keyed by GPU arch); the shared
``rocmfix_kernel_config`` module, dropped beside this one, merges them with the tuned file and
``$ROCMFIX_DILATED_CONV_CONFIG``.  Batch, height and width are
kept out of Triton's specialisation, so a new page size does not compile a new kernel.  There is no
backward pass: run inference under ``torch.no_grad()`` or ``torch.inference_mode()``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from . import rocmfix_kernel_config as kc

if TYPE_CHECKING:
    # (scale, shift, code): code 1 applies y * scale + shift per output channel, 2 then SiLU.
    Epilogue = tuple[torch.Tensor, torch.Tensor, int]

try:
    import triton
    import triton.language as tl
except Exception as _exc:  # noqa: BLE001  # ImportError, or a broken install failing on import
    triton = None
    tl = None
    _TRITON_IMPORT_ERROR: Exception | None = _exc
else:
    _TRITON_IMPORT_ERROR = None

SCHEME = "gemm"
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
        "kernel": kc.one_of("dot", "fma"),
        "input_precision": kc.one_of("tf32", "tf32x3", "bf16x3", "bf16x6", "ieee"),
    },
)
_SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INT32_MAX = 2**31 - 1

_NO_BACKWARD_MSG = (
    "rocmfix's Triton dilated conv (doclayout_yolo g2l_crm_triton) has no backward pass. "
    "Run inference under torch.no_grad() or torch.inference_mode(), or `rocmfix revert` the "
    "patch to train."
)

# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------

# Everything that changes with the page size (batch, H, W and the strides built from them) and
# the per-call dilation/padding stay out of Triton's specialisation: one compile per
# (C, C_out, kernel size, dtype, layout, config) serves every page and every dilation.
# (*) The kernels call builtins only, no @triton.jit helpers of triton.language.standard: those
# are decorated when triton is imported, so they break the interpreter if triton was imported
# before TRITON_INTERPRET=1 was set.
_DNS = ["N", "H", "W", "OH", "OW", "M", "sxn", "sxc", "sxh", "sxw", "pad_h", "pad_w", "dil"]

if triton is not None:

    @triton.jit
    def _epilogue_apply(acc, s_ptr, t_ptr, offs_n, CO: tl.constexpr, EPILOGUE: tl.constexpr):
        # Eval-mode BatchNorm as a per-channel scale and shift, then SiLU (EPILOGUE 2): the
        # block's act(bn(conv)) in the store instead of two more passes over the output.
        if EPILOGUE > 0:
            n_ok = offs_n < CO
            scale = tl.load(s_ptr + offs_n, mask=n_ok, other=0.0)
            shift = tl.load(t_ptr + offs_n, mask=n_ok, other=0.0)
            acc = acc * scale[None, :] + shift[None, :]
            if EPILOGUE == 2:
                acc = acc / (1.0 + tl.exp(-acc))  # builtins only (*): tl.sigmoid is @jit
        return acc

    @triton.jit(do_not_specialize=_DNS)
    def _dconv_gemm_kernel(
        x_ptr, w_ptr, y_ptr, s_ptr, t_ptr,
        N, H, W, OH, OW, M,
        sxn, sxc, sxh, sxw,
        pad_h, pad_w, dil,
        C: tl.constexpr, CO: tl.constexpr, C_PAD: tl.constexpr, CO_PAD: tl.constexpr,
        KH: tl.constexpr, KW: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        X_W_UNIT: tl.constexpr, X_C_UNIT: tl.constexpr,
        DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, TAPS_INNER: tl.constexpr,
        NHWC: tl.constexpr, W_KMAJOR: tl.constexpr, EPILOGUE: tl.constexpr,
    ):  # fmt: skip
        # Output-channel tiles of one pixel tile are neighbours in launch order, so they run
        # together and share the input tile through L2.
        pid = tl.program_id(0)
        num_pid_n: tl.constexpr = (CO + BLOCK_N - 1) // BLOCK_N
        pid_m = pid // num_pid_n
        pid_n = pid % num_pid_n
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        m_ok = offs_m < M
        ohw = OH * OW
        n_idx = offs_m // ohw
        pix = offs_m - n_idx * ohw
        oh = pix // OW
        ow = pix - oh * OW
        ih0 = oh - pad_h
        iw0 = ow - pad_w
        x_row0 = n_idx * sxn
        acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)  # builtin; tl.zeros is @jit (*)
        CB: tl.constexpr = C_PAD // BLOCK_K
        TAPS: tl.constexpr = KH * KW
        # One flat loop over taps x channel blocks: a long loop pipelines better than a short
        # channel loop nested in an unrolled tap loop.
        for i in range(0, TAPS * CB):
            if TAPS_INNER:
                # Consecutive steps read shifted windows of the same channels: L1 hits.
                cb = i // TAPS
                rs = i - cb * TAPS
            else:
                rs = i // CB
                cb = i - rs * CB
            c0 = cb * BLOCK_K
            r = rs // KW
            s = rs - r * KW
            ih = ih0 + r * dil
            iw = iw0 + s * dil
            row_ok = m_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            cc = c0 + offs_k
            a_mask = row_ok[:, None] if C % BLOCK_K == 0 else row_ok[:, None] & (cc < C)[None, :]
            if NHWC:
                # Dense channels-last input: offsets are multiples of the constexpr C, so the
                # compiler can prove 16-byte alignment and move 4 fp32 / 8 bf16 per access.
                a_row = ((n_idx * H + ih) * W + iw) * C
                col_off = cc
            else:
                # Unit strides are passed as flags: they vectorise/coalesce, and the stride
                # values themselves (which depend on H and W) stay unspecialised.
                a_row = x_row0 + (ih * sxh + iw if X_W_UNIT else ih * sxh + iw * sxw)
                col_off = cc if X_C_UNIT else cc * sxc
                if X_W_UNIT and not X_C_UNIT:
                    # NCHW: neighbouring output pixels are (mostly) neighbouring addresses.
                    # Saying so puts a warp's threads along M, which coalesces the loads; the
                    # divisibility stays unknown, so each thread still loads single elements.
                    a_row = tl.max_contiguous(a_row, BLOCK_M)
            # 32-bit offsets on one base pointer: half the registers of a pointer tile.
            a = tl.load(x_ptr + (a_row[:, None] + col_off[None, :]), mask=a_mask, other=0.0)
            # The packed weight is zero-padded to (CO_PAD, C_PAD): no mask needed.
            if W_KMAJOR:
                # K-contiguous weight tile: 16-byte copies into the K-major shared layout that
                # Hopper's 32-bit wgmma wants for both operands.
                b = tl.load(w_ptr + (rs * CO_PAD + offs_n)[None, :] * C_PAD + cc[:, None])
            else:
                # N-contiguous: what the FMA (strict fp32) dot reads fastest.
                b = tl.load(w_ptr + (rs * C_PAD + cc)[:, None] * CO_PAD + offs_n[None, :])
            if UPCAST:
                # The CPU interpreter multiplies bf16 bit patterns in tl.dot (triton#11584).
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        acc = _epilogue_apply(acc, s_ptr, t_ptr, offs_n, CO, EPILOGUE)
        y_row = n_idx * (CO * ohw) + pix
        y_ptrs = y_ptr + y_row[:, None] + offs_n[None, :] * ohw
        y_mask = m_ok[:, None] & (offs_n < CO)[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=y_mask)

    @triton.jit(do_not_specialize=_DNS)
    def _dconv_fma_kernel(
        x_ptr, w_ptr, y_ptr, s_ptr, t_ptr,
        N, H, W, OH, OW, M,
        sxn, sxc, sxh, sxw,
        pad_h, pad_w, dil,
        C: tl.constexpr, CO: tl.constexpr, C_PAD: tl.constexpr, CO_PAD: tl.constexpr,
        KH: tl.constexpr, KW: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        X_W_UNIT: tl.constexpr, X_C_UNIT: tl.constexpr,
        DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, TAPS_INNER: tl.constexpr,
        NHWC: tl.constexpr, W_KMAJOR: tl.constexpr, EPILOGUE: tl.constexpr,
    ):  # fmt: skip
        # Same tiling as the GEMM kernel, but rank-1 fp32 FMA updates instead of tl.dot.
        pid = tl.program_id(0)
        num_pid_n: tl.constexpr = (CO + BLOCK_N - 1) // BLOCK_N
        pid_m = pid // num_pid_n
        pid_n = pid % num_pid_n
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        m_ok = offs_m < M
        ohw = OH * OW
        n_idx = offs_m // ohw
        pix = offs_m - n_idx * ohw
        oh = pix // OW
        ow = pix - oh * OW
        ih0 = oh - pad_h
        iw0 = ow - pad_w
        x_rows = x_ptr + n_idx * sxn
        acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)  # builtin; tl.zeros is @jit (*)
        for rs in range(0, KH * KW):
            r = rs // KW
            s = rs - r * KW
            ih = ih0 + r * dil
            iw = iw0 + s * dil
            row_ok = m_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            a_ptrs = x_rows + (ih * sxh + iw if X_W_UNIT else ih * sxh + iw * sxw)
            if W_KMAJOR:
                w_ptrs = w_ptr + (rs * CO_PAD + offs_n) * C_PAD
            else:
                w_ptrs = w_ptr + rs * C_PAD * CO_PAD + offs_n
            for c in range(0, C):
                a = tl.load(a_ptrs + (c if X_C_UNIT else c * sxc), mask=row_ok, other=0.0)
                b = tl.load(w_ptrs + (c if W_KMAJOR else c * CO_PAD))
                acc += a.to(tl.float32)[:, None] * b.to(tl.float32)[None, :]
        acc = _epilogue_apply(acc, s_ptr, t_ptr, offs_n, CO, EPILOGUE)
        y_row = n_idx * (CO * ohw) + pix
        y_ptrs = y_ptr + y_row[:, None] + offs_n[None, :] * ohw
        y_mask = m_ok[:, None] & (offs_n < CO)[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=y_mask)

    @triton.jit(do_not_specialize=_DNS)
    def _dconv_gemm_tma_kernel(
        x_ptr, w_ptr, y_ptr, s_ptr, t_ptr,
        N, H, W, OH, OW, M,
        sxn, sxc, sxh, sxw,
        pad_h, pad_w, dil,
        C: tl.constexpr, CO: tl.constexpr, C_PAD: tl.constexpr, CO_PAD: tl.constexpr,
        KH: tl.constexpr, KW: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        X_W_UNIT: tl.constexpr, X_C_UNIT: tl.constexpr,
        DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, TAPS_INNER: tl.constexpr,
        NHWC: tl.constexpr, W_KMAJOR: tl.constexpr, EPILOGUE: tl.constexpr,
    ):  # fmt: skip
        # Implicit GEMM fed by tensor descriptors (TMA on Hopper) over the channels-last input:
        # a program owns BLOCK_M pixels of one output row, so every (tap, channel block) operand
        # is one [1, 1, BLOCK_M, BLOCK_K] box.  The hardware zero-fills the parts of a box that
        # fall outside the image (the conv padding) or past C: no masks, no address math.
        pid = tl.program_id(0)
        num_pid_n: tl.constexpr = (CO + BLOCK_N - 1) // BLOCK_N
        pid_m = pid // num_pid_n
        pid_n = pid % num_pid_n
        segs = (OW + BLOCK_M - 1) // BLOCK_M
        row = pid_m // segs
        ow0 = (pid_m - row * segs) * BLOCK_M
        n = row // OH
        oh = row - n * OH
        x_desc = tl.make_tensor_descriptor(
            x_ptr,
            shape=[N, H, W, C],
            strides=[H * W * C, W * C, C, 1],
            block_shape=[1, 1, BLOCK_M, BLOCK_K],
        )
        w_desc = tl.make_tensor_descriptor(
            w_ptr,
            shape=[KH * KW * CO_PAD, C_PAD],
            strides=[C_PAD, 1],
            block_shape=[BLOCK_N, BLOCK_K],
        )
        acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
        CB: tl.constexpr = C_PAD // BLOCK_K
        TAPS: tl.constexpr = KH * KW
        for i in range(0, TAPS * CB):
            if TAPS_INNER:
                cb = i // TAPS
                rs = i - cb * TAPS
            else:
                rs = i // CB
                cb = i - rs * CB
            r = rs // KW
            s = rs - r * KW
            a = x_desc.load([n, oh + r * dil - pad_h, ow0 + s * dil - pad_w, cb * BLOCK_K])
            a = tl.reshape(a, (BLOCK_M, BLOCK_K))
            b = w_desc.load([rs * CO_PAD + pid_n * BLOCK_N, cb * BLOCK_K])
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, tl.trans(b), acc, input_precision=DOT_PRECISION)
        offs_m = ow0 + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = _epilogue_apply(acc, s_ptr, t_ptr, offs_n, CO, EPILOGUE)
        ohw = OH * OW
        y_ptrs = y_ptr + (n * (CO * ohw) + oh * OW + offs_m)[:, None] + offs_n[None, :] * ohw
        y_mask = (offs_m < OW)[:, None] & (offs_n < CO)[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=y_mask)

    _KERNELS = {
        "dot": _dconv_gemm_kernel,
        "fma": _dconv_fma_kernel,
        "tma": _dconv_gemm_tma_kernel,
    }
    _TMA_KERNEL: Any = _dconv_gemm_tma_kernel
    # The interpreter is chosen when the kernels are decorated (TRITON_INTERPRET=1 at import).
    INTERPRETED = type(_dconv_gemm_kernel).__name__ == "InterpretedFunction"
else:
    _KERNELS = {}
    _TMA_KERNEL = None
    INTERPRETED = False

# --------------------------------------------------------------------------------------------
# Device arch, precision and configuration lookup
# --------------------------------------------------------------------------------------------

_LOCK = threading.Lock()
device_arch = kc.device_arch


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


def clear_config_cache() -> None:
    """Forget the cached tuned file, env parse, resolved configs, launch plans and folded
    BatchNorms (for ``rocmfix tune`` and tests)."""
    CONFIG.clear()
    with _LOCK:
        _PLANS.clear()
        _FOLDED.clear()


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


# --------------------------------------------------------------------------------------------
# Weight packing
# --------------------------------------------------------------------------------------------

_PACK_CACHE: OrderedDict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
PACK_CACHE_SIZE = 64


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _packed_weight(
    weight: torch.Tensor, c_pad: int, co_pad: int, dtype: torch.dtype, kmajor: bool
) -> torch.Tensor:
    """Weight as a zero-padded ``[KH*KW, CO_PAD, C_PAD]`` (``kmajor``: C_in contiguous) or
    ``[KH*KW, C_PAD, CO_PAD]`` tensor.

    DocLayout-YOLO shares one weight between three dilations, so packs are cached.  The key
    holds the tensor version, so an in-place update (``load_state_dict``) repacks, and the entry
    holds the source tensor so its address cannot be reused while cached.
    """
    co, c, kh, kw = weight.shape
    # Inference tensors have no version counter (asking raises, slowly): no cache.
    version = None if weight.is_inference() else weight._version
    key = (
        weight.data_ptr(),
        tuple(weight.shape),
        tuple(weight.stride()),
        weight.dtype,
        weight.device,
        version,
        c_pad,
        co_pad,
        dtype,
        kmajor,
    )
    if version is not None:
        with _LOCK:
            hit = _PACK_CACHE.get(key)
            if hit is not None:
                _PACK_CACHE.move_to_end(key)
                return hit[1]
    if kmajor:
        packed = torch.zeros((kh * kw, co_pad, c_pad), dtype=dtype, device=weight.device)
        packed[:, :co, :c] = weight.detach().permute(2, 3, 0, 1).reshape(kh * kw, co, c)
    else:
        packed = torch.zeros((kh * kw, c_pad, co_pad), dtype=dtype, device=weight.device)
        packed[:, :c, :co] = weight.detach().permute(2, 3, 1, 0).reshape(kh * kw, c, co)
    if version is not None:
        with _LOCK:
            _PACK_CACHE[key] = (weight, packed)
            while len(_PACK_CACHE) > PACK_CACHE_SIZE:
                _PACK_CACHE.popitem(last=False)
    return packed


# --------------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------------


def _pair(v: Any, name: str) -> tuple[int, int]:
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"{name} must be an int or a pair, got {v!r}")
        return int(v[0]), int(v[1])
    return int(v), int(v)


def _triton_usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    if triton is None:
        kc.warn_once(
            "no-triton",
            f"rocmfix: triton is not importable ({_TRITON_IMPORT_ERROR!r}); "
            "the dilated conv falls back to F.conv2d",
        )
        return False
    if x.device.type == "cuda":
        return not INTERPRETED
    return x.device.type == "cpu" and INTERPRETED


def prepare_launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    dilation: int,
    padding: int | tuple[int, int],
    config: dict[str, Any],
    out: torch.Tensor | None = None,
    epilogue: Epilogue | None = None,
) -> tuple[Any, tuple[int], tuple[Any, ...], dict[str, Any], torch.Tensor]:
    """Kernel, grid, positional args, launch kwargs and output for one call (no launch).

    Exposed so tests and ``rocmfix tune`` can inspect Triton's specialisation key.
    """
    n, c, h, w = x.shape
    co, _, kh, kw = weight.shape
    pad_h, pad_w = _pair(padding, "padding")
    oh = h + 2 * pad_h - dilation * (kh - 1)
    ow = w + 2 * pad_w - dilation * (kw - 1)
    fma = config.get("kernel") == "fma"
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    if fma:
        bk = 1  # no dot: no channel padding needed
    c_pad, co_pad = _cdiv(c, bk) * bk, _cdiv(co, bn) * bn
    interp_low = INTERPRETED and x.dtype != torch.float32
    nhwc = not fma and bool(config.get("nhwc", True))
    if nhwc and not x.is_contiguous(memory_format=torch.channels_last):
        # One copy to channels-last buys vector loads of whole channel runs (see kernel).
        x = x.contiguous(memory_format=torch.channels_last)
    tma = nhwc and bool(config.get("tma", False))
    kmajor = tma or bool(config.get("w_kmajor", True))  # the descriptor route reads K-major
    packed = _packed_weight(weight, c_pad, co_pad, x.dtype, kmajor)
    if out is None:
        out = torch.empty((n, co, oh, ow), dtype=x.dtype, device=x.device)
    m = n * oh * ow
    sxn, sxc, sxh, sxw = x.stride()
    # Without an epilogue the scale and shift pointers are never read: the packed weight
    # stands in, so that every launch passes tensors of one layout there.
    scale, shift, code = epilogue if epilogue is not None else (packed, packed, 0)
    args = (x, packed, out, scale, shift,
            n, h, w, oh, ow, m, sxn, sxc, sxh, sxw, pad_h, pad_w, dilation)  # fmt: skip
    kwargs: dict[str, Any] = dict(
        C=c, CO=co, C_PAD=c_pad, CO_PAD=co_pad, KH=kh, KW=kw,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=max(bk, 16),
        X_W_UNIT=sxw == 1, X_C_UNIT=sxc == 1,
        DOT_PRECISION=config["input_precision"], UPCAST=interp_low,
        TAPS_INNER=bool(config.get("taps_inner", False)), NHWC=nhwc, W_KMAJOR=kmajor,
        EPILOGUE=code, **kc.launch_options(config),
    )  # fmt: skip
    if tma and _tma_ok(x, packed, c):
        _ensure_allocator()
        grid = (n * oh * _cdiv(ow, bm) * _cdiv(co, bn),)
        return _KERNELS["tma"], grid, args, kwargs, out
    grid = (_cdiv(m, bm) * _cdiv(co, bn),)
    return _KERNELS["fma" if fma else "dot"], grid, args, kwargs, out


def prepare(
    x: torch.Tensor,
    weight: torch.Tensor,
    dilation: int,
    padding: int | tuple[int, int],
    config: dict[str, Any] | None = None,
    epilogue: int = 0,
) -> tuple[Any, tuple[int], tuple[Any, ...], dict[str, Any]]:
    """What one call of :func:`dilated_conv2d` would launch, from the same config resolution
    and preparation, without launching: rocmfix's ahead-of-time compile check compiles it for
    GPUs it does not have. ``epilogue`` 2 is the kernel a block with an eval BatchNorm and
    SiLU runs (1: BatchNorm alone)."""
    c_out, c_in, kh, kw = weight.shape
    cfg = (
        _explicit(x, c_in, c_out, max(kh, kw), config)
        if config
        else (resolve_config(x.device, c_in, c_out, max(kh, kw), x.dtype))
    )
    fold = None
    if epilogue:
        zeros = torch.zeros(c_out, dtype=torch.float32, device=x.device)
        fold = (zeros, zeros, epilogue)
    kernel, grid, args, kwargs, _ = prepare_launch(x, weight, dilation, padding, cfg, epilogue=fold)
    return kernel, grid, args, kwargs


def _explicit(x: torch.Tensor, c: int, co: int, k: int, config: dict[str, Any]) -> dict[str, Any]:
    """The resolved config with ``config``'s fields over it, as tune and tests pass them; a
    tf32 setting only applies where tf32 is this GPU's precision for ``x``."""
    cfg = resolve_config(x.device, c, co, k, x.dtype)
    cfg.update(CONFIG.validate(config))
    if precision_class(x.dtype, device_arch(x.device)) != "tf32":
        cfg["input_precision"] = "ieee"
    return cfg


def _tma_ok(x: torch.Tensor, packed: torch.Tensor, c: int) -> bool:
    # Descriptor rules: 16-byte aligned bases and 16-byte multiples for all but the last stride.
    return (
        x.data_ptr() % 16 == 0
        and packed.data_ptr() % 16 == 0
        and (c * x.element_size()) % 16 == 0
        and (packed.shape[-1] * packed.element_size()) % 16 == 0
    )


def _torch_scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_allocator() -> None:
    """In-kernel tensor descriptors need Triton's scratch allocator; install a torch-backed one
    unless the application set its own (the setting is per thread/context)."""
    if INTERPRETED:
        return
    try:
        from triton.runtime import _allocation

        if not isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
            return
    except (ImportError, AttributeError):
        pass
    triton.set_allocator(_torch_scratch)


def dilated_conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    dilation: int,
    padding: int | tuple[int, int],
    *,
    bn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    act: Callable[[torch.Tensor], torch.Tensor] | None = None,
    config: dict[str, Any] | None = None,
) -> torch.Tensor:
    """``F.conv2d(x, weight, None, stride=1, padding=padding, dilation=dilation)``, then
    ``act(bn(...))`` where they are given (the block's own modules).

    Runs the Triton kernel for fp32/fp16/bf16 GPU tensors (CPU tensors only under
    ``TRITON_INTERPRET=1``) at dilation > 1, and ``F.conv2d`` otherwise.  An eval-mode
    ``nn.BatchNorm2d`` and an ``nn.SiLU`` or ``nn.Identity`` without hooks run in the kernel's
    store; any other module is called on the output, as the block would call it.  ``config``
    overrides the resolved launch config field by field (``rocmfix tune`` uses it); it is not
    validated against the hardware.  Output is NCHW-contiguous.
    """
    if config is None and kc.is_compiling():
        return _traced(x, weight, dilation, padding, bn, act)
    epilogue, fused = None, False
    if dilation == 1 and config is None:
        # A dense conv: the vendor libraries run it fast (MIOpen leaves out its GEMM solvers
        # only for dilation > 1), and DocLayout-YOLO's blocks make a third of their calls at
        # d = 1. Explicit configs (tests, tune) still run the kernel.
        y = F.conv2d(x, weight, None, 1, padding, 1)
    else:
        if bn is not None:
            epilogue = _epilogue(bn, act)
        y, fused = _conv(x, weight, dilation, padding, config, epilogue)
    if not fused:  # the kernel did not apply them: the modules see a plain conv
        if bn is not None:
            y = bn(y)
        if act is not None:
            y = act(y)
    return y


def _conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    dilation: Any,
    padding: Any,
    config: dict[str, Any] | None,
    epilogue: Epilogue | None,
) -> tuple[torch.Tensor, bool]:
    """The conv, and whether ``epilogue`` was applied to it: the kernel applies it, a call
    that falls back to ``F.conv2d`` does not."""
    key = None
    if config is None:
        # DocLayout-YOLO calls this 16 times per page at d > 1 and is launch-bound at batch 1,
        # so a call whose key was seen before skips straight to the launch: the checks below
        # passed for that key, and only the input, the output and autograd are new.
        key = _plan_key(x, weight, dilation, padding, epilogue)
        plan = _PLANS.get(key) if key is not None else None
        if plan is not None and not (
            torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
        ):
            return _replay(x, plan, epilogue), epilogue is not None
    if isinstance(dilation, (tuple, list)):
        if len(set(dilation)) != 1:
            return F.conv2d(x, weight, None, 1, padding, dilation), False
        dilation = dilation[0]
    dilation = int(dilation)
    if (
        not _triton_usable(x, weight)
        or x.dim() != 4
        or weight.dim() != 4
        or x.dtype not in _SUPPORTED_DTYPES
        or weight.dtype != x.dtype
        or weight.device != x.device
        or weight.shape[1] != x.shape[1]
        or x.shape[0] == 0
        or dilation < 1
        or (epilogue is not None and not _epilogue_fits(epilogue, x, weight))
    ):
        return F.conv2d(x, weight, None, 1, padding, dilation), False
    pad_h, pad_w = _pair(padding, "padding")
    n, c, h, w = x.shape
    co, _, kh, kw = weight.shape
    oh = h + 2 * pad_h - dilation * (kh - 1)
    ow = w + 2 * pad_w - dilation * (kw - 1)
    (sn, sc, sh, sw) = x.stride()
    span = 1 + (n - 1) * sn + (c - 1) * sc + (h - 1) * sh + (w - 1) * sw
    if (
        pad_h < 0
        or pad_w < 0
        or oh < 1
        or ow < 1
        or c == 0
        or co == 0
        or span > _INT32_MAX
        or n * co * oh * ow > _INT32_MAX
    ):
        # Let torch raise its own error or handle what 32-bit indexing cannot.
        return F.conv2d(x, weight, None, 1, padding, dilation), False
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        raise RuntimeError(_NO_BACKWARD_MSG)
    device = kc.device_index(x)
    if config:  # explicit configs (tests, `rocmfix tune`) skip the plan cache
        cfg = _explicit(x, c, co, max(kh, kw), config)
        kernel, grid, args, kwargs, out = prepare_launch(
            x, weight, dilation, (pad_h, pad_w), cfg, epilogue=epilogue
        )
        kc.Launcher(kernel, grid, kwargs, device).launch_once(*args)
        return out, epilogue is not None
    # The tuned file and the environment are read here, when a key is first seen (and again
    # after clear_config_cache()), not per call: each lookup is host time.
    cfg = resolve_config(x.device, c, co, max(kh, kw), x.dtype)
    kernel, grid, args, kwargs, out = prepare_launch(
        x, weight, dilation, (pad_h, pad_w), cfg, epilogue=epilogue
    )
    # Every tensor's alignment is fixed by the key (the input is keyed; its channels-last copy,
    # the output and the epilogue's scale and shift are fresh allocations), as the Launcher
    # needs.
    launcher = kc.Launcher(kernel, grid, kwargs, device)
    launcher(*args)
    if key is not None:
        with _LOCK:
            if len(_PLANS) >= PLAN_CACHE_SIZE:
                _PLANS.clear()
            # args[1] is the packed weight; the plan also holds `weight`, so its id() and
            # data_ptr() in the key stay its own.
            _PLANS[key] = (launcher, args[0] is not x, args[1], args[5:], weight, out.shape)
    return out, epilogue is not None


def _plan_key(
    x: torch.Tensor, weight: torch.Tensor, dilation: Any, padding: Any, epilogue: Epilogue | None
) -> tuple[Any, ...] | None:
    """Everything a call's launch depends on but its tensors' addresses, or None for a call
    that is not cached (an inference-tensor weight has no version to see updates by, a
    list is no key)."""
    if weight.is_inference():  # asking its version would raise, slowly
        return None
    version = weight._version
    if type(dilation) is not int or not (
        type(padding) is int or (type(padding) is tuple and all(type(v) is int for v in padding))
    ):
        return None
    return (
        kc.layout_key(x),
        id(weight),
        weight.data_ptr(),
        version,
        weight.shape,
        weight.dtype,
        dilation,
        padding,
        # TF32 or IEEE is read from torch per call, as cuDNN reads it (fp32 only).
        torch_allows_tf32() if x.dtype == torch.float32 else None,
        # The fold's kind, device and length: the first call of a key checked them against
        # x's device and the weight's output channels.
        (epilogue[2], epilogue[0].get_device(), epilogue[0].shape) if epilogue else None,
    )


def _replay(x: torch.Tensor, plan: tuple[Any, ...], epilogue: Epilogue | None) -> torch.Tensor:
    launcher, to_cl, packed, tail, _weight, out_shape = plan
    if launcher.kernel is _TMA_KERNEL:
        _ensure_allocator()  # per thread: a plan made in one thread may run in another
    xin = x.contiguous(memory_format=torch.channels_last) if to_cl else x
    out = torch.empty(out_shape, dtype=x.dtype, device=x.device)
    if epilogue is None:
        launcher(xin, packed, out, packed, packed, *tail)
    else:
        launcher(xin, packed, out, epilogue[0], epilogue[1], *tail)
    return out


_PLANS: dict[tuple[Any, ...], tuple[Any, ...]] = {}
PLAN_CACHE_SIZE = 256

# --------------------------------------------------------------------------------------------
# The block's BatchNorm and activation, folded into the kernel's store
# --------------------------------------------------------------------------------------------

_ACTS = {torch.nn.Identity: 1, torch.nn.SiLU: 2}
_FOLDED: dict[int, tuple[Any, ...]] = {}
FOLDED_CACHE_SIZE = 256


def _epilogue(bn: Any, act: Any) -> Epilogue | None:
    """``act(bn(y))`` as a per-channel scale and shift (and SiLU), for an ``nn.BatchNorm2d`` in
    eval mode with running statistics and an ``nn.SiLU``/``nn.Identity``/None activation;
    None for anything else, where a hook would see the modules called (a subclass, a
    forward hook, train mode: the block calls them itself), or where autograd records
    through the BatchNorm's parameters (to autograd the fold is a constant).

    The fold is computed once per module and reused while its statistics, affine parameters
    and eps are the same tensors at the same addresses and versions (an in-place update, a
    ``load_state_dict`` or a ``.to()`` moves one of them).
    """
    code = 1 if act is None else _ACTS.get(type(act))
    if (
        code is None
        or type(bn) is not torch.nn.BatchNorm2d
        or bn.training
        or bn._forward_hooks
        or bn._forward_pre_hooks
        or (act is not None and (act._forward_hooks or act._forward_pre_hooks))
        or _global_hooks()
    ):
        return None
    buffers, params = bn._buffers, bn._parameters
    tensors = (
        buffers.get("running_mean"),
        buffers.get("running_var"),
        params.get("weight"),
        params.get("bias"),
    )
    if tensors[0] is None or tensors[1] is None:
        return None  # no running statistics: BatchNorm uses the batch's, even in eval
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return None
    try:
        state = tuple((t, t.data_ptr(), t._version) if t is not None else None for t in tensors)
    except RuntimeError:
        # Inference tensors (a model built under inference_mode) have no version to see an
        # update by: the modules run as the block calls them. (The raise costs ~10 us, but
        # only there; asking is_inference() of four tensors would cost every call ~1 us.)
        return None
    folded = _FOLDED.get(id(bn))
    if folded is None or folded[0] != bn.eps or not _same(folded[1], state):
        scale, shift = _fold(tensors, bn.eps)
        folded = (bn.eps, state, scale, shift)
        with _LOCK:
            if len(_FOLDED) >= FOLDED_CACHE_SIZE:
                _FOLDED.clear()
            _FOLDED[id(bn)] = folded
    return folded[2], folded[3], code


def _same(seen: tuple[Any, ...], now: tuple[Any, ...]) -> bool:
    # The fold holds the tensors it was made from, so `is` cannot match a new tensor that
    # reuses a freed one's id.
    return all(
        (a is None and b is None)
        or (a is not None and b is not None and a[0] is b[0] and a[1:] == b[1:])
        for a, b in zip(seen, now)
    )


def _fold(tensors: tuple[Any, ...], eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    mean, var, gamma, beta = tensors
    with torch.no_grad():
        scale = torch.rsqrt(var.float() + eps)
        if gamma is not None:
            scale = scale * gamma.float()
        shift = -mean.float() * scale
        if beta is not None:
            shift = shift + beta.float()
    return scale.contiguous(), shift.contiguous()


def _epilogue_fits(epilogue: Epilogue, x: torch.Tensor, weight: torch.Tensor) -> bool:
    scale = epilogue[0]
    return scale.device == x.device and scale.numel() == weight.shape[0]


def _global_hooks() -> bool:
    module = torch.nn.modules.module
    return bool(
        getattr(module, "_global_forward_hooks", None)
        or getattr(module, "_global_forward_pre_hooks", None)
    )


# --------------------------------------------------------------------------------------------
# torch.compile: one opaque op
# --------------------------------------------------------------------------------------------

OP_NAME = "dilated_conv2d"
# The BatchNorm's fold and the activation travel as tensors and a code, never as modules: an
# op's arguments are what the graph can hold. act 0: none (scale and shift unused), 1: the
# scale and shift, 2: then SiLU.
OP_SCHEMA = (
    "(Tensor x, Tensor weight, int dilation, int[2] padding, Tensor? scale, Tensor? shift, "
    "int act) -> Tensor"
)


def _apply_fold(
    y: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, code: int
) -> torch.Tensor:
    # What the kernel's store computes: fp32 math, then the output's dtype.
    z = y.float() * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1)
    if code == 2:
        z = F.silu(z)
    return z.to(y.dtype)


def _impl(
    x: torch.Tensor,
    weight: torch.Tensor,
    dilation: int,
    padding: list[int],
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    act: int,
) -> torch.Tensor:
    """The op on real tensors: the eager path (the cached launcher, or F.conv2d wherever the
    kernel does not apply), then the fold in torch where the kernel did not apply it. The
    result is NCHW-contiguous, as the fake says: Inductor lays out what follows by it."""
    epilogue = (scale, shift, act) if act and scale is not None and shift is not None else None
    y, fused = _conv(x, weight, dilation, (padding[0], padding[1]), None, epilogue)
    if epilogue is not None and not fused:
        y = _apply_fold(y, epilogue[0], epilogue[1], act)
    return y.contiguous()


def _fake(
    x: torch.Tensor,
    weight: torch.Tensor,
    dilation: int,
    padding: list[int],
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    act: int,
) -> torch.Tensor:
    n, _, h, w = x.shape
    co, _, kh, kw = weight.shape
    oh = h + 2 * padding[0] - dilation * (kh - 1)
    ow = w + 2 * padding[1] - dilation * (kw - 1)
    return x.new_empty((n, co, oh, ow))


# The CPU implementation is the same function: it runs the interpreted kernel under
# TRITON_INTERPRET=1 and F.conv2d otherwise (_triton_usable decides, as in eager mode).
_OP = kc.register_op(OP_NAME, OP_SCHEMA, _impl, _impl, _fake)


def _traced_fold(bn: Any, act: Any) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    """:func:`_epilogue` as traced ops: the graph recomputes the fold (a few per-channel ops)
    instead of looking it up by the module's id and versions, which would guard the graph on
    them."""
    code = 1 if act is None else _ACTS.get(type(act))
    if (
        code is None
        or type(bn) is not torch.nn.BatchNorm2d
        or bn.training
        or bn._forward_hooks
        or bn._forward_pre_hooks
        or (act is not None and (act._forward_hooks or act._forward_pre_hooks))
        or _global_hooks()
    ):
        return None
    tensors = (bn.running_mean, bn.running_var, bn.weight, bn.bias)
    if tensors[0] is None or tensors[1] is None:
        return None
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return None
    scale, shift = _fold(tensors, bn.eps)
    return scale, shift, code


def _traced(
    x: torch.Tensor,
    weight: torch.Tensor,
    dilation: Any,
    padding: Any,
    bn: Callable[[torch.Tensor], torch.Tensor] | None,
    act: Callable[[torch.Tensor], torch.Tensor] | None,
) -> torch.Tensor:
    """What :func:`dilated_conv2d` is under ``torch.compile``: one ``rocmfix::dilated_conv2d``
    node (the per-call plan lookup is host-side state the graph must not see), and plain
    torch wherever eager mode would not run the kernel either."""
    d = dilation
    if isinstance(d, (tuple, list)) and len(set(d)) == 1:
        d = d[0]
    pad = padding if isinstance(padding, (tuple, list)) else (padding, padding)
    if (
        type(d) is not int
        or d < 2
        or len(pad) != 2
        or not all(type(p) is int and p >= 0 for p in pad)
        or x.dim() != 4
        or weight.dim() != 4
        or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    ):
        # A dense conv (the vendor's is fast), a shape the kernel does not take, or autograd
        # (the op has no backward): what the block itself runs.
        y = F.conv2d(x, weight, None, 1, padding, dilation)
        fold = None
    else:
        fold = _traced_fold(bn, act) if bn is not None else None
        if fold is not None:
            return _OP(x, weight, d, list(pad), fold[0], fold[1], fold[2])  # type: ignore[no-any-return]
        y = _OP(x, weight, d, list(pad), None, None, 0)
    if bn is not None:
        y = bn(y)
    return y if act is None else act(y)
