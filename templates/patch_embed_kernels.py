"""The Triton kernels of rocmfix's patch-embed GEMM and their tile configs (rocmfix
template; the host side is ``patch_embed_gemm``).

rocmfix drops this file, under this name, beside that module; ``rocmfix revert`` removes it
with it. ``x.view(L, K) @ W.view(N, K).T (+ bias)`` in two kernels: one on plain pointers
(any GPU, the interpreter) and one fed by host tensor descriptors (Hopper's TMA unit).
:func:`graph` is the body of the triton op ``rocmfix::patch_embed_gemm`` (see
``rocmfix_custom_op``): the pointer kernel launched through ``wrap_triton`` with the tile the
eager plan resolves, traced on fake tensors, so Inductor launches the kernel from its own
generated code instead of calling back into rocmfix's Python per node.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import rocmfix_custom_op as rop
from . import rocmfix_kernel_config as kc
from . import rocmfix_triton as rt

if rt.HAS_TRITON:
    # The modules rocmfix_triton imported, bound here for the kernels' annotations: that
    # module alone decides whether Triton is usable.
    import triton
    import triton.language as tl

KERNEL = "patch_embed_gemm"
CONFIG_ENV = "ROCMFIX_PATCH_EMBED_CONFIG"

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

PTR_KERNEL: Any = None
TMA_KERNEL: Any = None

if rt.HAS_TRITON:
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
        # PERSISTENT: NUM_PROGS programs walk the tiles. A 128x256 tile fills an SM alone, and
        # with a program per tile every tile then pays for its program's start and pipeline
        # fill: 0.76-0.92x of cuBLAS persistent against 0.57-0.71x (H200, M >= 5476). Not
        # flattened into the K loop: that measured 1.7-3.1x slower for every pointer tile,
        # where it pays for the descriptor kernel. Otherwise a program per tile (the loop
        # runs once: NUM_PROGS is the tile count).
        first = tl.program_id(0)
        if PERSISTENT:
            end, step = num_pid_m * num_pid_n, NUM_PROGS
        else:
            end, step = first + 1, 1
        for tile in range(first, end, step):
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
            c_mask = (rm[:, None] < M) & (rn[None, :] < N)
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)

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

    PTR_KERNEL, TMA_KERNEL = _gemm_ptr_kernel, _gemm_tma_kernel


def ptr_launch(
    a: Any, w: Any, bias: Any, out: Any, aligns: tuple[int, int], progs: Any, plan: Any,
    upcast: bool, options: dict[str, Any],
) -> tuple[tuple[Any, ...], dict[str, Any]]:  # fmt: skip
    """The pointer kernel's arguments and keywords for ``out = a[M, K] @ w[N, K].T (+ bias)``
    with ``plan``'s tile, the rows of ``a`` and ``w`` aligned to ``aligns`` elements, on
    ``progs`` programs: the eager launch's and the graph body's."""
    m, k = a.shape
    k_align = max(1, 16 // a.element_size())
    while k % k_align:
        k_align //= 2
    a_align, w_align = aligns
    args = (a, w, out if bias is None else bias, out, m, w.shape[0], k // k_align,
            a.stride(0) // a_align, a.stride(1), w.stride(0) // w_align, w.stride(1),
            out.stride(0), out.stride(1), progs)  # fmt: skip
    kwargs = dict(
        A_ALIGN=a_align, W_ALIGN=w_align, K_ALIGN=k_align, BLOCK_M=plan.bm, BLOCK_N=plan.bn,
        BLOCK_K=plan.bk, GROUP_M=plan.group, EVEN_K=k % plan.bk == 0, HAS_BIAS=bias is not None,
        UPCAST=upcast, PERSISTENT=plan.persistent, **options,
    )  # fmt: skip
    return args, kwargs


def takes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether the graph launches the kernel for these (fake) tensors: a CUDA/HIP device and
    one dtype, as the eager path launches it. Not under the interpreter, whose kernel is not
    one ``wrap_triton`` can trace."""
    return (
        PTR_KERNEL is not None
        and not rt.INTERPRETING
        and x.device.type == "cuda"
        and weight.dtype == x.dtype
        and (bias is None or bias.dtype == x.dtype)
    )


def graph(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, plan: Any, pack_bytes: int
) -> torch.Tensor:
    """``x[M, K] @ weight[N, K].T (+ bias)``: the eager ``plan``'s tile on the pointer kernel,
    the weight's rows padded to ``pack_bytes`` where the plan packs it (a torch op Inductor
    schedules, as the eager path's cached copy). No tensor descriptors, as in the dilated
    conv's graph: Triton encodes them on the host at every launch, and their checks read
    addresses, which a fake tensor does not have."""
    m, k = x.shape
    n = weight.shape[0]
    w = weight
    if plan.pack:
        align = max(1, pack_bytes // w.element_size())
        w = F.pad(w, (0, -(-k // align) * align - k))[:, :k]
    if bias is not None:
        bias = bias.contiguous()  # the kernel reads bias[n] at bias_ptr + n
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    tiles = -(-m // plan.bm) * -(-n // plan.bn)
    progs = torch.sym_min(tiles, plan.programs) if plan.persistent else tiles
    aligns = (row_align(x), row_align(w))
    args, kwargs = ptr_launch(x, w, bias, out, aligns, progs, plan, False, plan.opts)
    rop.launch_traced(PTR_KERNEL, (progs,), args, kwargs)
    return out


def row_align(t: torch.Tensor) -> int:
    """``patch_embed_gemm._row_align`` on what a fake tensor knows: the row stride, and for
    the address the storage offset (``rop.offset_aligned``); an offset it cannot prove
    aligned reads single elements."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if not rop.offset_aligned(t):
        return 1
    align = max(1, rop.GRAPH_ALIGN // t.element_size())
    while align > 1 and not statically_known_true(t.stride(0) % align == 0):
        align //= 2
    return align
