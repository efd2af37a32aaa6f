"""The Triton kernels of rocmfix's dilated conv (rocmfix template; the host side is
``dilated_conv_triton``, which rocmfix drops as DocLayout-YOLO's ``g2l_crm_triton.py``).

rocmfix drops this file, under this name, beside that module; ``rocmfix revert`` removes it
with it. Three kernels share one tiling (output pixels N*OH*OW x output channels, the
C*KH*KW reduction in an fp32 accumulator) and one store (the block's eval BatchNorm as a
per-channel scale and shift, then SiLU, applied as the tile is written): the ``dot`` kernel
(implicit GEMM through ``tl.dot``), the ``fma`` kernel (rank-1 FMA updates) and the ``tma``
kernel (the dot kernel fed by tensor descriptors). Their prologue and store are the
``@triton.jit`` helpers below, inlined by Triton into each kernel.

Everything that changes with the page size (batch, H, W and the strides built from them) and
the per-call dilation/padding stay out of Triton's specialisation: one compile per (C, C_out,
kernel size, dtype, layout, config) serves every page and every dilation.
(*) The kernels call builtins and the helpers here only, no @triton.jit helpers of
triton.language.standard: those are decorated when triton is imported, so they break the
interpreter if triton was imported before TRITON_INTERPRET=1 was set.
"""

from __future__ import annotations

from typing import Any

import torch

from . import rocmfix_kernel_config as kc
from .rocmfix_triton import tl, triton

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


_DNS = ["N", "H", "W", "OH", "OW", "M", "sxn", "sxc", "sxh", "sxw", "pad_h", "pad_w", "dil"]

# The store's codes (the kernels' EPILOGUE): 0 none, 1 the scale and shift, 2 then SiLU.
EPILOGUE_NONE, EPILOGUE_FOLD, EPILOGUE_FOLD_SILU = 0, 1, 2

KERNELS: dict[str, Any] = {}
TMA_KERNEL: Any = None

if triton is not None:

    @triton.jit
    def _tile(CO: tl.constexpr, BLOCK_N: tl.constexpr):
        # Output-channel tiles of one pixel tile are neighbours in launch order, so they run
        # together and share the input tile through L2.
        pid = tl.program_id(0)
        num_pid_n: tl.constexpr = (CO + BLOCK_N - 1) // BLOCK_N
        pid_m = pid // num_pid_n
        pid_n = pid % num_pid_n
        return pid_m, pid_n

    @triton.jit
    def _pixels(pid_m, M, OH, OW, pad_h, pad_w, BLOCK_M: tl.constexpr):
        # The tile's output pixels as (image, flat pixel) and the top-left input tap of each.
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        m_ok = offs_m < M
        ohw = OH * OW
        n_idx = offs_m // ohw
        pix = offs_m - n_idx * ohw
        oh = pix // OW
        ow = pix - oh * OW
        ih0 = oh - pad_h
        iw0 = ow - pad_w
        return m_ok, ohw, n_idx, pix, ih0, iw0

    @triton.jit
    def _step(i, KW: tl.constexpr, CB: tl.constexpr, TAPS: tl.constexpr, TAPS_INNER: tl.constexpr):
        # One flat loop over taps x channel blocks: a long loop pipelines better than a short
        # channel loop nested in an unrolled tap loop.
        if TAPS_INNER:
            # Consecutive steps read shifted windows of the same channels: L1 hits.
            cb = i // TAPS
            rs = i - cb * TAPS
        else:
            rs = i // CB
            cb = i - rs * CB
        r = rs // KW
        s = rs - r * KW
        return cb, rs, r, s

    @triton.jit
    def _store(acc, y_ptr, s_ptr, t_ptr, y_row, row_ok, offs_n, ohw, CO: tl.constexpr,
               EPILOGUE: tl.constexpr):  # fmt: skip
        # Eval-mode BatchNorm as a per-channel scale and shift, then SiLU (EPILOGUE 2): the
        # block's act(bn(conv)) in the store instead of two more passes over the output.
        if EPILOGUE > 0:
            n_ok = offs_n < CO
            scale = tl.load(s_ptr + offs_n, mask=n_ok, other=0.0)
            shift = tl.load(t_ptr + offs_n, mask=n_ok, other=0.0)
            acc = acc * scale[None, :] + shift[None, :]
            if EPILOGUE == 2:
                acc = acc / (1.0 + tl.exp(-acc))  # builtins only (*): tl.sigmoid is @jit
        y_ptrs = y_ptr + y_row[:, None] + offs_n[None, :] * ohw
        y_mask = row_ok[:, None] & (offs_n < CO)[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=y_mask)

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
        pid_m, pid_n = _tile(CO, BLOCK_N)
        m_ok, ohw, n_idx, pix, ih0, iw0 = _pixels(pid_m, M, OH, OW, pad_h, pad_w, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        x_row0 = n_idx * sxn
        acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)  # builtin; tl.zeros is @jit (*)
        CB: tl.constexpr = C_PAD // BLOCK_K
        TAPS: tl.constexpr = KH * KW
        for i in range(0, TAPS * CB):
            cb, rs, r, s = _step(i, KW, CB, TAPS, TAPS_INNER)
            c0 = cb * BLOCK_K
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
        y_row = n_idx * (CO * ohw) + pix
        _store(acc, y_ptr, s_ptr, t_ptr, y_row, m_ok, offs_n, ohw, CO, EPILOGUE)

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
        pid_m, pid_n = _tile(CO, BLOCK_N)
        m_ok, ohw, n_idx, pix, ih0, iw0 = _pixels(pid_m, M, OH, OW, pad_h, pad_w, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
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
        y_row = n_idx * (CO * ohw) + pix
        _store(acc, y_ptr, s_ptr, t_ptr, y_row, m_ok, offs_n, ohw, CO, EPILOGUE)

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
        pid_m, pid_n = _tile(CO, BLOCK_N)
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
            cb, rs, r, s = _step(i, KW, CB, TAPS, TAPS_INNER)
            a = x_desc.load([n, oh + r * dil - pad_h, ow0 + s * dil - pad_w, cb * BLOCK_K])
            a = tl.reshape(a, (BLOCK_M, BLOCK_K))
            b = w_desc.load([rs * CO_PAD + pid_n * BLOCK_N, cb * BLOCK_K])
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, tl.trans(b), acc, input_precision=DOT_PRECISION)
        offs_m = ow0 + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        ohw = OH * OW
        y_row = n * (CO * ohw) + oh * OW + offs_m
        _store(acc, y_ptr, s_ptr, t_ptr, y_row, offs_m < OW, offs_n, ohw, CO, EPILOGUE)

    KERNELS = {
        "dot": _dconv_gemm_kernel,
        "fma": _dconv_fma_kernel,
        "tma": _dconv_gemm_tma_kernel,
    }
    TMA_KERNEL = _dconv_gemm_tma_kernel
