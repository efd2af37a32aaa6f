"""Qwen2-VL patch embedding as a Triton GEMM (rocmfix scheme ``gemm``).

rocmfix dropped this file beside a Qwen-VL vision tower (vllm's ``qwen2_vl_vision_kernels.py``,
transformers' ``rocmfix_patch_embed.py``) and rewrote the patch embed's ``forward`` to call
:func:`triton_conv3d_patchify` instead of the Conv3d, whose MIOpen path takes seconds per
call on ROCm. ``rocmfix revert`` removes it.

The conv has kernel == stride and no padding, so it is exactly
``x.view(L, K) @ W.view(N, K).T (+ bias)`` with K = C*T*P*P (1176 for Qwen2-VL / MinerU2.5).
The module needs stdlib, torch, triton and the ``rocmfix_kernel_config`` module dropped beside
it, never the package it sits in (vllm 0.8.x has no ``tl``/``triton`` in
``vllm.triton_utils``). CPU inputs run the stock ``F.conv3d``.

Tile configs are data (:data:`PATCH_EMBED_CONFIGS`, keyed by GPU arch, then by precision class:
``"f16"`` for bf16/fp16 inputs, ``"fp32"`` for fp32). The shared ``rocmfix_kernel_config``
module, dropped beside this one, merges them with the tuned file and
``$ROCMFIX_PATCH_EMBED_CONFIG``; :func:`patchify_gemm` takes an explicit config, for
``rocmfix tune``/``doctor``. Nothing is tuned at inference time.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from . import rocmfix_kernel_config as kc

SCHEME = "gemm"
OP_NAME = "patch_embed_gemm"
KERNEL = "patch_embed_gemm"
CONFIG_ENV = "ROCMFIX_PATCH_EMBED_CONFIG"

try:
    import triton
    import triton.language as tl

    _HAS_TRITON = True
except Exception:  # noqa: BLE001 - a broken triton install must not break vllm's import
    triton = None  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]
    _HAS_TRITON = False

try:
    # Host-side descriptors need no device-side scratch allocator (triton >= 3.4).
    from triton.tools.tensor_descriptor import TensorDescriptor

    _HAS_HOST_TMA = True
except Exception:  # noqa: BLE001
    TensorDescriptor = None  # type: ignore[assignment,misc]
    _HAS_HOST_TMA = False

# RDNA has no fp32 matrix instruction, so a 64x64 fp32 tile on 4 wave32 warps holds 128
# accumulators per lane and spills (256 VGPRs, ~105 spills, 288 bytes of scratch, compiled for
# gfx1100/gfx1201 by `rocmfix kernels`); 8 warps halve that: 174 VGPRs, 8 waves, no spills.
_RDNA_FP32: dict[str, dict[str, Any]] = {"fp32": {"num_warps": 8}}

# Shipped tile configs: arch ("gfx1100", "sm_90", ...) -> precision class -> config; "any"
# applies to every precision, and every arch starts from "default". The arch entries are sized
# for 16-bit operands (what vllm and transformers run); fp32 inputs take "default"'s "fp32"
# tile, since an exact fp32 dot ("ieee", to match F.linear without TF32) runs on FMA units on
# NVIDIA and RDNA, where small tiles are the fast ones (CDNA has fp32 MFMA).
# "tma"/"tma_min_m"/"epilogue_subtile"/"flatten" select and shape the sm_90 descriptor kernel
# (from tma_min_m rows of x on; "flatten": its tile loop fused with the K loop);
# "persistent"/"occupancy" make either kernel walk the tiles with a grid of occupancy x SM
# count programs;
# waves_per_eu/matrix_instr_nonkdim/kpack are passed to the launch on ROCm. Every entry is
# compiled for every arch by `rocmfix kernels` (docs/amd-kernels.md).
PATCH_EMBED_CONFIGS: dict[str, dict[str, dict[str, Any]]] = {
    "default": {
        # Portable pointer kernel; 48 KiB of shared memory at 3 stages fits every current GPU.
        "any": {
            "BLOCK_M": 128,
            "BLOCK_N": 128,
            "BLOCK_K": 32,
            "GROUP_M": 8,
            "num_warps": 4,
            "num_stages": 3,
            "tma": False,
            "persistent": False,
            "occupancy": 1,
            "tma_min_m": 0,
            "epilogue_subtile": False,
            "flatten": False,
            "pack_weight": True,
        },
        "fp32": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2},
    },
    # RX 7900 XTX: the seed author's hand-tuned tile. Unmeasured here; AITER uses num_stages=1 on
    # RDNA (no async global->LDS copy), so `rocmfix tune` should A/B the stage count.
    "gfx1100": {
        "f16": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "num_warps": 8, "num_stages": 4},
        **_RDNA_FP32,
    },
    # RX 9070 XT: the default 16-bit tile compiles to 212 VGPRs and 7 waves with WMMA, no
    # spills (docs/amd-kernels.md); only fp32 needs RDNA's own tile.
    "gfx1201": {**_RDNA_FP32},
    # MI300X: unmeasured; 8 warps / 2 stages / 16x16 MFMA as in AITER's gfx942 GEMM tables. A
    # 128x128 tile keeps 430 tiles for 304 CUs at M=5476, where 256x256 would leave CUs idle.
    "gfx942": {
        "f16": {
            "BLOCK_M": 128,
            "BLOCK_N": 128,
            "BLOCK_K": 64,
            "GROUP_M": 4,
            "num_warps": 8,
            "num_stages": 2,
            "matrix_instr_nonkdim": 16,
        }
    },
    # H100/H200, measured on an H200 (docs/performance-patch-embed.md): TMA descriptors with
    # hardware zero-fill of the K tail, persistent grid, flattened tile loop, and the weight's
    # rows padded to 128 bytes (pack_weight, in "default"), 4 stages with a split epilogue.
    # 128x256 is the largest tile whose accumulator one m64n256 wgmma per warpgroup fills;
    # taller tiles built from several accumulators halve the wgmma width and measured slower,
    # despite fewer L2 bytes. The 4 stages leave 3 KB of shared memory: a Triton that needs
    # more drops to 3 stages (the previous shipped config) at the first launch.
    "sm_90": {
        "f16": {
            "BLOCK_M": 128,
            "BLOCK_N": 256,
            "BLOCK_K": 64,
            "GROUP_M": 8,
            "num_warps": 8,
            "num_stages": 4,
            "tma": True,
            "persistent": True,
            "epilogue_subtile": True,
            "flatten": True,
            # Triton encodes the descriptors at every launch: 35 us of host time a call against
            # the pointer kernel's 22 and F.linear's 21 (H200, 2026-11-24). Below 4096 rows the
            # GPU finishes first, and the pointer kernel (persistent, the same tile) is 1.6x
            # faster for the caller; at MinerU's 5476 the descriptor kernel's GPU time wins.
            "tma_min_m": 4096,
        }
    },
}

CONFIG = kc.KernelConfig(
    KERNEL,
    CONFIG_ENV,
    PATCH_EMBED_CONFIGS,
    {
        "GROUP_M": kc.integer(1, 64),
        "occupancy": kc.integer(1, 64),
        "tma_min_m": kc.integer(0, 1 << 31),
        "tma": kc.flag,
        "persistent": kc.flag,
        "epilogue_subtile": kc.flag,
        "flatten": kc.flag,
        "pack_weight": kc.flag,
    },
)

_lock = threading.Lock()
_plan_cache: dict[tuple[Any, ...], Any] = {}
# Weight descriptors by (address, shape, strides, dtype, block): the descriptor holds the weight,
# so its address cannot be reused by another tensor while the entry lives.
_w_desc_cache: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
_W_DESC_CACHE_SIZE = 8
# Weights copied into rows padded to whole 128-byte lines, by (address, shape, strides, dtype,
# device, version counter): see _packed_weight. Each entry holds its source tensor too.
_packed_cache: OrderedDict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
_PACKED_CACHE_SIZE = 8
# Prepared calls, by everything that fixes a call's launch but the addresses of x, bias and the
# output (see _call_key). Vision towers see a new M per image, so a few entries per model.
_calls: dict[tuple[Any, ...], _Call] = {}
_CALL_CACHE_SIZE = 64
PACK_ROW_BYTES = 128


def clear_config_cache() -> None:
    """Forget the parsed tuned file, env config, arch queries, plans and packed weights."""
    CONFIG.clear()
    with _lock:
        _plan_cache.clear()
        _w_desc_cache.clear()
        _packed_cache.clear()
        _calls.clear()


def precision_class(dtype: torch.dtype) -> str:
    return "fp32" if dtype == torch.float32 else "f16"


def resolve_config(
    device: torch.device | str | int | None = None, dtype: torch.dtype = torch.bfloat16
) -> dict[str, Any]:
    """The tile config of ``dtype`` inputs on ``device`` (see rocmfix_kernel_config)."""
    return CONFIG.resolve(kc.device_arch(device), ("any", precision_class(dtype)))


device_arch = kc.device_arch


# "SMs" of a persistent grid in Triton's CPU interpreter.
INTERPRETER_SM_COUNT = 4


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------

if _HAS_TRITON:
    # The kernels call no @triton.jit helpers of triton.language (tl.cdiv, tl.sum, ...): those
    # are compiled-or-interpreted when triton is first imported, and tests may set
    # TRITON_INTERPRET=1 only after that.

    @triton.jit
    def _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
        # Grouped order: consecutive programs share W column tiles and a band of A rows in L2.
        width = GROUP_M * num_pid_n
        group = tile // width
        first_m = group * GROUP_M
        group_m = min(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + (tile % width) % group_m
        pid_n = (tile % width) // group_m
        return pid_m, pid_n

    @triton.jit
    def _ptr_tile(
        a_ptr,
        w_ptr,
        bias_ptr,
        c_ptr,
        tile,
        M,
        N,
        K,
        stride_am,
        stride_ak,
        stride_wn,
        stride_wk,
        stride_cm,
        stride_cn,
        num_pid_m,
        num_pid_n,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr,
        EVEN_K: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        UPCAST: tl.constexpr,
    ):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        # Wrapped rows/cols keep every main-loop load in bounds with no mask; they are
        # computed twice and never stored.
        ram = rm % M
        rbn = rn % N
        rk = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + ram[:, None].to(tl.int64) * stride_am + rk[None, :] * stride_ak
        w_ptrs = w_ptr + rbn[None, :].to(tl.int64) * stride_wn + rk[:, None] * stride_wk
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        k_full = K // BLOCK_K
        for _ in range(0, k_full):
            a = tl.load(a_ptrs)
            b = tl.load(w_ptrs)
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision="ieee")
            a_ptrs += BLOCK_K * stride_ak
            w_ptrs += BLOCK_K * stride_wk
        if not EVEN_K:
            # The K tail (1176 = 18*64 + 24) is peeled so only this one step pays for masks.
            k_left = K - k_full * BLOCK_K
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b = tl.load(w_ptrs, mask=rk[:, None] < k_left, other=0.0)
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision="ieee")
        if HAS_BIAS:
            bias = tl.load(bias_ptr + rn, mask=rn < N, other=0.0)
            acc = acc + bias.to(tl.float32)[None, :]
        c_ptrs = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))

    # M and NUM_PROGS vary per call; specialising on them would only multiply compilations.
    @triton.jit(do_not_specialize=["M", "NUM_PROGS"])
    def _gemm_ptr_kernel(
        a_ptr,
        w_ptr,
        bias_ptr,
        c_ptr,
        M,
        N,
        K_q,
        stride_am_q,
        stride_ak,
        stride_wn_q,
        stride_wk,
        stride_cm,
        stride_cn,
        NUM_PROGS,
        A_ALIGN: tl.constexpr,
        W_ALIGN: tl.constexpr,
        K_ALIGN: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr,
        EVEN_K: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        UPCAST: tl.constexpr,
        PERSISTENT: tl.constexpr,
    ):
        # Row strides arrive divided by their alignment: triton only specialises integers
        # divisible by 16, and 1176 is not, so without this it cannot prove 16-byte rows and
        # falls back to 2-byte loads. K likewise, so the tail mask comes in runs of K_ALIGN.
        K = K_q * K_ALIGN
        stride_am = stride_am_q * A_ALIGN
        stride_wn = stride_wn_q * W_ALIGN
        num_pid_m = (M + BLOCK_M - 1) // BLOCK_M
        num_pid_n = (N + BLOCK_N - 1) // BLOCK_N
        if PERSISTENT:
            # NUM_PROGS programs walk the tiles. A 128x256 tile fills an SM alone, and with a
            # program per tile every tile then pays for its program's start and pipeline
            # fill: 0.76-0.92x of cuBLAS persistent against 0.57-0.71x (H200, M >= 5476).
            # Not flattened into the K loop: that measured 1.7-3.1x slower for every pointer
            # tile, where it pays for the descriptor kernel.
            for tile in range(tl.program_id(0), num_pid_m * num_pid_n, NUM_PROGS):
                _ptr_tile(
                    a_ptr, w_ptr, bias_ptr, c_ptr, tile, M, N, K, stride_am, stride_ak,
                    stride_wn, stride_wk, stride_cm, stride_cn, num_pid_m, num_pid_n,
                    BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, EVEN_K, HAS_BIAS, UPCAST,
                )  # fmt: skip
        else:
            _ptr_tile(
                a_ptr, w_ptr, bias_ptr, c_ptr, tl.program_id(0), M, N, K, stride_am, stride_ak,
                stride_wn, stride_wk, stride_cm, stride_cn, num_pid_m, num_pid_n,
                BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, EVEN_K, HAS_BIAS, UPCAST,
            )  # fmt: skip

    @triton.jit(do_not_specialize=["M", "NUM_PROGS"])
    def _gemm_tma_kernel(
        a_desc,
        w_desc,
        c_desc,
        bias_ptr,
        M,
        N,
        K,
        NUM_PROGS,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        UPCAST: tl.constexpr,
        EPILOGUE_SUBTILE: tl.constexpr,
        FLATTEN: tl.constexpr,
    ):
        # The TMA unit zero-fills out-of-range rows and the K tail, so no load needs a mask,
        # and clips the store to M. With NUM_PROGS < tiles this is a persistent kernel, and
        # FLATTEN lets the pipeliner prefetch the next tile's K steps during this epilogue.
        pid = tl.program_id(0)
        num_pid_m = (M + BLOCK_M - 1) // BLOCK_M
        num_pid_n = (N + BLOCK_N - 1) // BLOCK_N
        num_tiles = num_pid_m * num_pid_n
        k_tiles = (K + BLOCK_K - 1) // BLOCK_K
        for tile in tl.range(pid, num_tiles, NUM_PROGS, flatten=FLATTEN):
            pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
            off_m = pid_m * BLOCK_M
            off_n = pid_n * BLOCK_N
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for ki in range(k_tiles):
                off_k = ki * BLOCK_K
                a = a_desc.load([off_m, off_k])
                b = w_desc.load([off_n, off_k])
                if UPCAST:
                    a = a.to(tl.float32)
                    b = b.to(tl.float32)
                acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")
            if HAS_BIAS:
                rn = off_n + tl.arange(0, BLOCK_N)
                bias = tl.load(bias_ptr + rn, mask=rn < N, other=0.0)
                acc = acc + bias.to(tl.float32)[None, :]
            if EPILOGUE_SUBTILE:
                # Two half-width stores halve the registers the bf16 copy of the tile needs.
                acc3 = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
                acc0, acc1 = tl.split(acc3)
                c_desc.store([off_m, off_n], acc0.to(c_desc.dtype))
                c_desc.store([off_m, off_n + BLOCK_N // 2], acc1.to(c_desc.dtype))
            else:
                c_desc.store([off_m, off_n], acc.to(c_desc.dtype))

    _INTERPRETING = type(_gemm_ptr_kernel).__name__ == "InterpretedFunction"
else:
    _INTERPRETING = False

try:
    from triton.runtime.errors import OutOfResources as _OutOfResources

    _OUT_OF_RESOURCES: tuple[type[BaseException], ...] = (_OutOfResources,)
except Exception:  # noqa: BLE001
    _OUT_OF_RESOURCES = ()


# --------------------------------------------------------------------------------------------
# Launch
# --------------------------------------------------------------------------------------------


def _row_align(t: torch.Tensor, stride: int) -> int:
    # Largest power of two (elements, <= 16 bytes) dividing the row stride and the base address.
    align = max(1, 16 // t.element_size())
    while align > 1 and (stride % align or (t.data_ptr() // t.element_size()) % align):
        align //= 2
    return align


class _Plan:
    """A resolved config turned into launch arguments once, off the per-call path.

    Triton's own launch costs ~30-40 us of host time per call on an H200 host; everything the
    wrapper adds on top is visible in eager mode, so the per-call work is kept to shape checks,
    two descriptors and the launch.
    """

    __slots__ = (
        "bk",
        "bm",
        "bn",
        "flatten",
        "group",
        "half",
        "occupancy",
        "opts",
        "pack",
        "persistent",
        "programs",
        "tma",
        "tma_min_m",
    )

    def __init__(self, cfg: Mapping[str, Any], device: torch.device) -> None:
        self.bm, self.bn, self.bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
        self.group = cfg["GROUP_M"]
        self.opts = kc.launch_options(cfg)
        on_gpu, cc_major, sm_count = kc.gpu(device)
        # Host descriptors drive Hopper's TMA unit; the interpreter runs them too.
        where = (not kc.is_hip() and cc_major >= 9) if on_gpu else _INTERPRETING
        self.tma = bool(cfg.get("tma")) and _HAS_HOST_TMA and where
        self.tma_min_m = int(cfg.get("tma_min_m", 0))
        # The interpreter runs persistent grids too (over INTERPRETER_SM_COUNT "SMs"), so the
        # CPU tests cover the persistent loop.
        self.persistent = bool(cfg.get("persistent")) and (on_gpu or _INTERPRETING)
        self.occupancy = int(cfg.get("occupancy", 1))
        self.programs = self.occupancy * (sm_count if on_gpu else INTERPRETER_SM_COUNT)
        self.half = bool(cfg.get("epilogue_subtile")) and self.bn >= 32
        self.flatten = bool(cfg.get("flatten"))
        self.pack = bool(cfg.get("pack_weight"))


def _tma_ok(t: torch.Tensor) -> bool:
    # The TMA unit needs 16-byte aligned bases and row strides (1176 bf16 = 2352 bytes is).
    return (
        t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0
    )


def _packed_weight(w: torch.Tensor) -> torch.Tensor:
    """``w`` with each row starting on a 128-byte line, copied once and cached.

    K = 1176 makes 2352-byte rows, so every other row starts 16 bytes into a 32-byte L2 sector
    and each 128-byte load of it touches five sectors instead of four. The weight is re-read
    from L2 for every row block of x, and padding its rows measured 11-23% faster on an H200
    for both kernels (docs/performance-patch-embed.md, item 11). x cannot be padded without
    a copy per call. The pad columns are zeros and never read: shapes stay [N, K].

    The key holds the tensor's version, so an in-place update through the tensor (``copy_``
    under ``no_grad``, ``load_state_dict``) makes a fresh copy. Writes through ``.data`` bypass
    the counter: vllm's weight loaders write that way, which is harmless at load time (before
    the first forward), but code that reloads weights into a live model must call
    :func:`clear_config_cache` afterwards. Inference tensors keep no version counter and are
    used as they are.
    """
    align = max(1, PACK_ROW_BYTES // w.element_size())
    if w.stride(1) == 1 and w.stride(0) % align == 0 and w.data_ptr() % PACK_ROW_BYTES == 0:
        return w
    if w.is_inference():  # asking its version would raise, slowly
        return w
    version = int(w._version)
    key = (w.data_ptr(), tuple(w.shape), tuple(w.stride()), w.dtype, w.device, version)
    hit = _packed_cache.get(key)
    if hit is not None:
        return hit[1]
    if w.is_cuda and torch.cuda.is_current_stream_capturing():
        # A copy recorded into a graph runs only at replay; an eager call before that would
        # read an unwritten buffer. Use the weight as it is until the next eager call.
        return w
    rows, cols = w.shape
    store = torch.zeros((rows, -(-cols // align) * align), dtype=w.dtype, device=w.device)
    packed = store[:, :cols]
    with torch.no_grad():
        packed.copy_(w)
    with _lock:
        _packed_cache[key] = (w, packed)
        while len(_packed_cache) > _PACKED_CACHE_SIZE:
            _packed_cache.popitem(last=False)
    return packed


def _weight_descriptor(w: torch.Tensor, bn: int, bk: int) -> Any:
    key = (w.data_ptr(), tuple(w.shape), tuple(w.stride()), w.dtype, w.device, bn, bk)
    desc = _w_desc_cache.get(key)
    if desc is None:
        desc = TensorDescriptor.from_tensor(w, [bn, bk])
        with _lock:
            _w_desc_cache[key] = desc
            while len(_w_desc_cache) > _W_DESC_CACHE_SIZE:
                _w_desc_cache.popitem(last=False)
    return desc


Launch = tuple[Any, tuple[int], tuple[Any, ...], dict[str, Any]]


def _launch(
    a: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    plan: _Plan,
    keep: bool = True,
) -> tuple[kc.Launcher, tuple[Any, ...]] | None:
    """Launch one call; with ``keep``, return the Launcher and arguments it used, which a
    later call with the same key (see :func:`_call_key`) repeats with its own tensors."""
    kernel, grid, args, kwargs = prepare_launch(a, w, bias, out, plan)
    launcher = kc.Launcher(kernel, grid, kwargs, device=kc.device_index(a))
    if not keep:
        launcher.launch_once(*args)
        return None
    launcher(*args)  # a config that does not fit raises here, before anything is kept
    return launcher, args


if TensorDescriptor is not None and not hasattr(TensorDescriptor, "__slots__"):

    def _rebase(desc: Any, base: torch.Tensor) -> Any:
        # A descriptor is a record read at launch (base address, shape, strides, block):
        # copying the first call's record skips from_tensor's checks, which that call made
        # and the call key holds (shape, strides, 16-byte alignment).
        clone = object.__new__(TensorDescriptor)
        clone.__dict__.update(desc.__dict__)
        clone.base = base
        return clone

else:

    def _rebase(desc: Any, base: torch.Tensor) -> Any:
        return dataclasses.replace(desc, base=base)


class _Call:
    """A call's launch made once: the Launcher that Triton's first call adopted, the weight as
    the kernel reads it (packed) and every argument after the per-call tensors. For the
    descriptor kernel, the first call's x and output descriptors, rebased each call."""

    __slots__ = ("a_desc", "c_desc", "device", "dtype", "launcher", "shape", "source", "tail",
                 "weight")  # fmt: skip

    def __init__(
        self, launcher: kc.Launcher, args: tuple[Any, ...], source: torch.Tensor, out: torch.Tensor
    ) -> None:
        self.launcher = launcher
        tma = launcher.kernel is _gemm_tma_kernel
        self.a_desc = args[0] if tma else None
        self.c_desc = args[2] if tma else None
        self.weight = args[1]
        self.tail = args[4:]
        # Holds the caller's weight, so its address (in the key) is not reused while this lives.
        self.source = source
        self.shape, self.dtype, self.device = out.shape, out.dtype, out.device

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        if self.a_desc is None:
            self.launcher(x, self.weight, out if bias is None else bias, out, *self.tail)
        else:
            a_desc, c_desc = _rebase(self.a_desc, x), _rebase(self.c_desc, out)
            self.launcher(a_desc, self.weight, c_desc, out if bias is None else bias, *self.tail)
        return out


def _call_key(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> Any:
    """Everything Triton specialises on and prepare_launch reads, but addresses: shapes,
    strides, dtypes, device, 16-byte alignment; the weight by address and version (an
    in-place update makes a new key, and a new packed copy)."""
    # An inference tensor has no counter (asking raises, slowly), and it is used unpacked.
    version = None if weight.is_inference() else weight._version
    return (
        kc.layout_key(x),
        weight.data_ptr(),
        version,
        weight.shape,
        weight.stride(),
        weight.dtype,
        None if bias is None else (bias.data_ptr() % 16, bias.shape, bias.stride(), bias.dtype),
    )


def _cached_call(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x.flatten(1) @ weight.flatten(1).T (+ bias)`` on a GPU, its launch prepared once per
    key. Eager callers pay Triton's and torch's per-call costs on the host (bench/eager_host.py):
    a repeat call is one key, one torch.empty and the compiled kernel's own launch; even the
    two flatten views are left out, since the kernel reads x's rows by address and stride."""
    key = _call_key(x, weight, bias)
    hit = _calls.get(key)
    if hit is not None:
        return hit(x, bias)
    a = x.flatten(1)
    w = weight.flatten(1)
    out, used = _run(a, w, bias, _plan_for(a.device, a.dtype), None)
    if (
        used is not None
        # Views, not copies: a later call passes x and reads the weight through this entry.
        and a.data_ptr() == x.data_ptr()
        and w.data_ptr() == weight.data_ptr()
        # Anything converted or copied per call stays on this path.
        and weight.dtype == x.dtype
        and (bias is None or (bias.dtype == x.dtype and bias.stride(0) == 1))
        # A capture leaves the weight unpacked for this call only (see _packed_weight).
        and not (x.is_cuda and torch.cuda.is_current_stream_capturing())
    ):
        launcher, args = used
        with _lock:
            if len(_calls) >= _CALL_CACHE_SIZE:
                _calls.pop(next(iter(_calls)))
            _calls[key] = _Call(launcher, args, weight, out)
    return out


def prepare_launch(
    a: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    plan: _Plan,
) -> Launch:
    """The kernel, grid, arguments and launch options of one call, not launched."""
    M, K = a.shape
    N = w.shape[0]
    bm, bn, bk = plan.bm, plan.bn, plan.bk
    upcast = _INTERPRETING and a.dtype in (torch.bfloat16, torch.float16)
    bias_arg = bias if bias is not None else out
    tiles = ((M + bm - 1) // bm) * ((N + bn - 1) // bn)
    progs = min(tiles, plan.programs) if plan.persistent else tiles
    if plan.tma and plan.tma_min_m <= M and _tma_ok(a) and _tma_ok(w) and _tma_ok(out):
        a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
        w_desc = _weight_descriptor(w, bn, bk)
        c_desc = TensorDescriptor.from_tensor(out, [bm, bn // 2 if plan.half else bn])
        return (
            _gemm_tma_kernel,
            (progs,),
            (a_desc, w_desc, c_desc, bias_arg, M, N, K, progs),
            dict(
                BLOCK_M=bm,
                BLOCK_N=bn,
                BLOCK_K=bk,
                GROUP_M=plan.group,
                HAS_BIAS=bias is not None,
                UPCAST=upcast,
                EPILOGUE_SUBTILE=plan.half,
                FLATTEN=plan.flatten,
                **plan.opts,
            ),
        )
    a_align = _row_align(a, a.stride(0))
    w_align = _row_align(w, w.stride(0))
    k_align = max(1, 16 // a.element_size())
    while K % k_align:
        k_align //= 2
    args: tuple[Any, ...] = (a, w, bias_arg, out, M, N, K // k_align)
    args += (a.stride(0) // a_align, a.stride(1), w.stride(0) // w_align, w.stride(1))
    args += (out.stride(0), out.stride(1), progs)
    return (
        _gemm_ptr_kernel,
        (progs,),
        args,
        dict(
            A_ALIGN=a_align,
            W_ALIGN=w_align,
            K_ALIGN=k_align,
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=bk,
            GROUP_M=plan.group,
            EVEN_K=K % bk == 0,
            HAS_BIAS=bias is not None,
            UPCAST=upcast,
            PERSISTENT=plan.persistent,
            **plan.opts,
        ),
    )


def _check(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> None:
    if a.dim() != 2 or w.dim() != 2 or a.shape[1] != w.shape[1]:
        raise ValueError(f"patch embed: bad shapes x{tuple(a.shape)} weight{tuple(w.shape)}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != w.shape[0]):
        raise ValueError(f"patch embed: bias{tuple(bias.shape)} for {w.shape[0]} channels")


def _plan_for(device: torch.device, dtype: torch.dtype) -> _Plan:
    # The env var and the tuned file are read at the first call per device and dtype, not on
    # every call (each os.environ lookup is host time); clear_config_cache() re-reads them.
    key = (device, dtype)
    plan = _plan_cache.get(key)
    if plan is None:
        plan = _Plan(resolve_config(device, dtype), device)
        with _lock:
            _plan_cache[key] = plan
    return plan


def _run(
    a: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    plan: _Plan,
    out: torch.Tensor | None,
    keep: bool = True,
) -> tuple[torch.Tensor, tuple[kc.Launcher, tuple[Any, ...]] | None]:
    """The output, and with ``keep`` the launch made (None where nothing was launched)."""
    _check(a, w, bias)
    if w.dtype != a.dtype:
        w = w.to(a.dtype)
    elif plan.pack and w.dim() == 2 and w.numel() > 0:
        w = _packed_weight(w)
    if bias is not None and bias.dtype != a.dtype:
        bias = bias.to(a.dtype)
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()  # the kernel reads bias[n] at bias_ptr + n
    shape = (a.shape[0], w.shape[0])
    if out is None:
        out = torch.empty(shape, dtype=a.dtype, device=a.device)
    elif tuple(out.shape) != shape or out.dtype != a.dtype or not out.is_contiguous():
        raise ValueError(f"patch embed: out must be contiguous {shape} {a.dtype}")
    used = None
    if shape[0] > 0 and shape[1] > 0:
        try:
            used = _launch(a, w, bias, out, plan, keep)
        except _OUT_OF_RESOURCES as exc:
            # A tile config too big for this GPU or triton build (a tuned file from elsewhere,
            # a compiler that needs more shared memory than the one measured): one stage less
            # first, as long as that still pipelines, then the portable default. The plan
            # that fits replaces the cached one, so later calls do not fail again.
            kc.warn_once(
                f"oor:{plan.bm}x{plan.bn}x{plan.bk}s{plan.opts['num_stages']}",
                f"rocmfix: patch-embed config does not fit ({exc}); using a smaller one",
            )
            for smaller in _smaller_plans(plan, a):
                try:
                    used = _launch(a, w, bias, out, smaller, keep)
                except _OUT_OF_RESOURCES:
                    continue
                with _lock:
                    key = (a.device, a.dtype)
                    if _plan_cache.get(key) is plan:
                        _plan_cache[key] = smaller
                break
            else:
                raise
    return out, used


def prepare(
    a: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: Mapping[str, Any] | None = None,
) -> Launch:
    """What one call of ``patchify_gemm`` would launch, from the same config resolution and
    preparation (the weight packed, the output made), without launching: rocmfix's
    ahead-of-time compile check compiles it for GPUs it does not have."""
    cfg = resolve_config(a.device, a.dtype)
    cfg.update(CONFIG.validate(config or {}))
    plan = _Plan(cfg, a.device)
    if plan.pack and w.numel() > 0:
        w = _packed_weight(w)
    out = torch.empty((a.shape[0], w.shape[0]), dtype=a.dtype, device=a.device)
    return prepare_launch(a, w, bias, out, plan)


def _smaller_plans(plan: _Plan, a: torch.Tensor) -> Iterator[_Plan]:
    for stages in range(plan.opts["num_stages"] - 1, 1, -1):
        smaller = copy.copy(plan)
        smaller.opts = {**plan.opts, "num_stages": stages}
        yield smaller
    yield _Plan(CONFIG.shipped_config("default", ("any", precision_class(a.dtype))), a.device)


def patchify_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: Mapping[str, Any] | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``a[M, K] @ w[N, K].T (+ bias)`` with the Triton kernel and an explicit tile config.

    This is the entry point for ``rocmfix tune``/``doctor``; ``config`` keys override
    :func:`resolve_config` for ``a``'s device. ``out`` (contiguous ``[M, N]``, ``a``'s dtype)
    lets a caller pre-poison the result. It always runs Triton (the caller picks the device),
    and raises if triton is missing.
    """
    if not _HAS_TRITON:
        raise RuntimeError("triton is not importable")
    if config is None:
        plan = _plan_for(a.device, a.dtype)
    else:
        cfg = resolve_config(a.device, a.dtype)
        cfg.update(CONFIG.validate(config))
        plan = _Plan(cfg, a.device)
    return _run(a, w, bias, plan, out, keep=False)[0]


def _linear_fallback(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(a, w.to(a.dtype), None if bias is None else bias.to(a.dtype))


def _impl_cuda(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if not _HAS_TRITON:
        kc.warn_once("no-triton", "rocmfix: triton is not importable; patch embed uses F.linear")
        return _linear_fallback(a, w, bias)
    return _cached_call(a, w, bias)


def _impl_cpu(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if _INTERPRETING:
        return _run(a, w, bias, _plan_for(a.device, a.dtype), None, keep=False)[0]
    if not _HAS_TRITON:
        kc.warn_once("no-triton", "rocmfix: triton is not importable; patch embed uses F.linear")
    return _linear_fallback(a, w, bias)


def _impl_fake(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return a.new_empty((a.shape[0], w.shape[0]))


_OP = kc.register_op(
    OP_NAME, "(Tensor x, Tensor weight, Tensor? bias) -> Tensor", _impl_cuda, _impl_cpu, _impl_fake
)


def triton_conv3d_patchify(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Conv3d with kernel == stride on ``x[L, C, T, P, P]`` and ``weight[N, C, T, P, P]``.

    Returns ``[L, N]`` in ``x``'s dtype, computed as one GEMM with fp32 accumulation.
    """
    if not x.is_cuda and not _INTERPRETING:
        # CPU inputs keep the stock op, bit for bit.
        return F.conv3d(x, weight, bias, stride=tuple(weight.shape[2:])).flatten(1)
    if _HAS_TRITON and not kc.is_compiling():
        # Eager: call the implementation directly; the dispatcher round trip to a Python
        # kernel is several microseconds of host time per call. (The interpreter takes this
        # path too, so the CPU tests cover it.)
        return _cached_call(x, weight, bias)
    # torch.compile sees one opaque op with a fake-tensor rule. flatten(1), not
    # reshape(L, -1): the latter is ambiguous for an empty batch.
    out: torch.Tensor = _OP(x.flatten(1), weight.flatten(1), bias)
    return out
