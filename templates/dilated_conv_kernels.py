"""The Triton kernels of rocmfix's dilated conv (rocmfix template; the host side is
``dilated_conv_triton``, which rocmfix drops as DocLayout-YOLO's ``g2l_crm_triton.py``).

rocmfix drops this file, under this name, beside that module; ``rocmfix revert`` removes it
with it. One kernel, two reductions (its constexpr ``KIND``) over one tiling (output pixels
N*OH*OW x output channels, the C*KH*KW reduction in an fp32 accumulator) and one store (the
block's eval BatchNorm as a per-channel scale and shift, then SiLU, applied as the tile is
written): ``dot`` (implicit GEMM through ``tl.dot``) and ``tma`` (the dot fed by tensor
descriptors). Its prologue and store are the ``@triton.jit`` helpers
below, inlined by Triton. :func:`prepare_launch` turns one call and its config
(``dilated_conv_config``) into a launch.

Everything that changes with the page size (batch, H, W and the strides built from them) and
the per-call dilation/padding stay out of Triton's specialisation: one compile per (C, C_out,
kernel size, dtype, layout, config) serves every page and every dilation.
(*) The kernels call builtins and the helpers here only, no @triton.jit helpers of
triton.language.standard: those are decorated when triton is imported, so they break the
interpreter if triton was imported before TRITON_INTERPRET=1 was set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from . import rocmfix_kernel_config as kc
from . import rocmfix_kernel_support as ks
from . import rocmfix_triton as rt

if rt.HAS_TRITON:
    # The modules rocmfix_triton imported, bound here for the kernels' annotations: that
    # module alone decides whether Triton is usable.
    import triton
    import triton.language as tl

if TYPE_CHECKING:
    # (scale, shift, code): code 1 applies y * scale + shift per output channel, 2 then SiLU.
    Epilogue = tuple[torch.Tensor, torch.Tensor, int]

_DNS = ["N", "H", "W", "OH", "OW", "M", "sxn", "sxc", "sxh", "sxw", "pad_h", "pad_w", "dil"]

# The store's codes (the kernels' EPILOGUE): 0 none, 1 the scale and shift, 2 then SiLU.
EPILOGUE_NONE, EPILOGUE_FOLD, EPILOGUE_FOLD_SILU = 0, 1, 2

KERNEL: Any = None

if rt.HAS_TRITON:

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
    def _pixels(offs_m, M, OH, OW, pad_h, pad_w):
        # The tile's output pixels as (image, flat pixel) and the top-left input tap of each.
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
    def _step(i, CB: tl.constexpr, TAPS: tl.constexpr, TAPS_INNER: tl.constexpr):
        # One flat loop over taps x channel blocks: a long loop pipelines better than a short
        # channel loop nested in an unrolled tap loop. The (channel block, tap) of step i:
        if TAPS_INNER:
            # Consecutive steps read shifted windows of the same channels: L1 hits.
            cb = i // TAPS
            rs = i - cb * TAPS
        else:
            rs = i // CB
            cb = i - rs * CB
        return cb, rs

    @triton.jit
    def _fold_act(acc, s_ptr, t_ptr, offs_n, CO: tl.constexpr, EPILOGUE: tl.constexpr):
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

    @triton.jit
    def _store(acc, y_ptr, y_row, row_ok, offs_n, ohw, CO: tl.constexpr):
        # The NCHW output tile: rows are pixels (y_row: their image's and pixel's offset),
        # columns output channels, ohw apart.
        y_ptrs = y_ptr + y_row[:, None] + offs_n[None, :] * ohw
        y_mask = row_ok[:, None] & (offs_n < CO)[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=y_mask)

    @triton.jit(do_not_specialize=_DNS)
    def _dconv_kernel(
        x_ptr, w_ptr, y_ptr, s_ptr, t_ptr,
        N, H, W, OH, OW, M,
        sxn, sxc, sxh, sxw,
        pad_h, pad_w, dil,
        C: tl.constexpr, CO: tl.constexpr, C_PAD: tl.constexpr, CO_PAD: tl.constexpr,
        KH: tl.constexpr, KW: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        X_W_UNIT: tl.constexpr, X_C_UNIT: tl.constexpr,
        DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, TAPS_INNER: tl.constexpr,
        NHWC: tl.constexpr, W_KMAJOR: tl.constexpr, EPILOGUE: tl.constexpr, KIND: tl.constexpr,
    ):  # fmt: skip
        # KIND (a constexpr: each compiles to its own loop alone) is the reduction: "dot" or
        # "tma" (see the module docstring).
        pid_m, pid_n = _tile(CO, BLOCK_N)
        acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)  # builtin; tl.zeros is @jit (*)
        CB: tl.constexpr = C_PAD // BLOCK_K
        TAPS: tl.constexpr = KH * KW
        if KIND == "tma":
            # Tensor descriptors over the channels-last input: a program owns BLOCK_M pixels
            # of one output row, so every (tap, channel block) operand is one
            # [1, 1, BLOCK_M, BLOCK_K] box. The hardware zero-fills the parts of a box that
            # fall outside the image (the conv padding) or past C: no masks, no address math.
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
            for i in range(0, TAPS * CB):
                cb, rs = _step(i, CB, TAPS, TAPS_INNER)
                r = rs // KW
                s = rs - r * KW
                a = x_desc.load([n, oh + r * dil - pad_h, ow0 + s * dil - pad_w, cb * BLOCK_K])
                a = tl.reshape(a, (BLOCK_M, BLOCK_K))
                b = w_desc.load([rs * CO_PAD + pid_n * BLOCK_N, cb * BLOCK_K])
                if UPCAST:
                    a = a.to(tl.float32)
                    b = b.to(tl.float32)
                acc = tl.dot(a, tl.trans(b), acc, input_precision=DOT_PRECISION)
        else:
            offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            m_ok, ohw, n_idx, pix, ih0, iw0 = _pixels(offs_m, M, OH, OW, pad_h, pad_w)
        if KIND == "dot":
            # Implicit GEMM through tl.dot.
            offs_k = tl.arange(0, BLOCK_K)
            x_row0 = n_idx * sxn
            for i in range(0, TAPS * CB):
                cb, rs = _step(i, CB, TAPS, TAPS_INNER)
                c0 = cb * BLOCK_K
                r = rs // KW
                s = rs - r * KW
                ih = ih0 + r * dil
                iw = iw0 + s * dil
                row_ok = m_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                cc = c0 + offs_k
                a_mask = row_ok[:, None]
                if C % BLOCK_K != 0:
                    a_mask = a_mask & (cc < C)[None, :]
                if NHWC:
                    # Dense channels-last input: offsets are multiples of the constexpr C, so
                    # the compiler can prove 16-byte alignment and move 4 fp32 / 8 bf16 per
                    # access.
                    a_row = ((n_idx * H + ih) * W + iw) * C
                    col_off = cc
                else:
                    # Unit strides are passed as flags: they vectorise/coalesce, and the
                    # stride values themselves (which depend on H and W) stay unspecialised.
                    a_row = x_row0 + (ih * sxh + iw if X_W_UNIT else ih * sxh + iw * sxw)
                    col_off = cc if X_C_UNIT else cc * sxc
                    if X_W_UNIT and not X_C_UNIT:
                        # NCHW: neighbouring output pixels are (mostly) neighbouring
                        # addresses. Saying so puts a warp's threads along M, which coalesces
                        # the loads; the divisibility stays unknown, so each thread still
                        # loads single elements.
                        a_row = tl.max_contiguous(a_row, BLOCK_M)
                # 32-bit offsets on one base pointer: half the registers of a pointer tile.
                a_offs = a_row[:, None] + col_off[None, :]
                a = tl.load(x_ptr + a_offs, mask=a_mask, other=0.0)
                # The packed weight is zero-padded to (CO_PAD, C_PAD): no mask needed.
                if W_KMAJOR:
                    # K-contiguous weight tile: 16-byte copies into the K-major shared layout
                    # that Hopper's 32-bit wgmma wants for both operands.
                    b = tl.load(w_ptr + (rs * CO_PAD + offs_n)[None, :] * C_PAD + cc[:, None])
                else:
                    # N-contiguous: what the FMA (strict fp32) dot reads fastest.
                    b = tl.load(w_ptr + (rs * C_PAD + cc)[:, None] * CO_PAD + offs_n[None, :])
                if UPCAST:
                    # The CPU interpreter multiplies bf16 bit patterns in tl.dot (triton#11584).
                    a = a.to(tl.float32)
                    b = b.to(tl.float32)
                acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        if KIND == "tma":
            offs_m = ow0 + tl.arange(0, BLOCK_M)
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            ohw = OH * OW
            y_row = n * (CO * ohw) + oh * OW + offs_m
            m_ok = offs_m < OW
        else:
            y_row = n_idx * (CO * ohw) + pix
        acc = _fold_act(acc, s_ptr, t_ptr, offs_n, CO, EPILOGUE)
        _store(acc, y_ptr, y_row, m_ok, offs_n, ohw, CO)

    KERNEL = _dconv_kernel


# --------------------------------------------------------------------------------------------
# Weight packing
# --------------------------------------------------------------------------------------------

PACK_CACHE_SIZE = 64
_PACKS: ks.BoundedCache[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = ks.BoundedCache(
    PACK_CACHE_SIZE
)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def clear_packs() -> None:
    """Forget every packed weight (clear_config_cache, a training call)."""
    _PACKS.clear()


def pack(
    weight: torch.Tensor, c_pad: int, co_pad: int, dtype: torch.dtype, kmajor: bool
) -> torch.Tensor:
    """Weight as a zero-padded ``[KH*KW, CO_PAD, C_PAD]`` (``kmajor``: C_in contiguous) or
    ``[KH*KW, C_PAD, CO_PAD]`` tensor, in torch ops (the graph's packing: Inductor's CSE merges
    the three dilations of one weight)."""
    co, c, kh, kw = weight.shape
    if kmajor:
        wt = weight.permute(2, 3, 0, 1).reshape(kh * kw, co, c)
        packed = torch.nn.functional.pad(wt, (0, c_pad - c, 0, co_pad - co))
    else:
        wt = weight.permute(2, 3, 1, 0).reshape(kh * kw, c, co)
        packed = torch.nn.functional.pad(wt, (0, co_pad - co, 0, c_pad - c))
    return packed.to(dtype).contiguous()


def _packed_weight(
    weight: torch.Tensor, c_pad: int, co_pad: int, dtype: torch.dtype, kmajor: bool
) -> torch.Tensor:
    """:func:`pack`, cached: DocLayout-YOLO shares one weight between three dilations. The key
    holds the tensor version, so an in-place update (``load_state_dict``) repacks, and the entry
    holds the source tensor so its address cannot be reused while cached.
    """
    # Inference tensors have no version counter (asking raises, slowly): no cache.
    version = None if weight.is_inference() else weight._version
    key = (weight.data_ptr(), weight.shape, weight.stride(), weight.dtype, weight.device,
           version, c_pad, co_pad, dtype, kmajor)  # fmt: skip
    if version is not None:
        hit = _PACKS.get(key)
        if hit is not None:
            return hit[1]
    with torch.no_grad():
        packed = pack(weight, c_pad, co_pad, dtype, kmajor)
    if version is not None:
        _PACKS.put(key, (weight, packed))
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


def launch_args(
    x: torch.Tensor,
    weight: torch.Tensor,
    dilation: int,
    padding: tuple[int, int],
    config: dict[str, Any],
    epilogue: Epilogue | None,
    eager: bool,
) -> tuple[str, tuple[int], tuple[Any, ...], dict[str, Any]]:
    """The kind, grid, positional args and constexprs of one call, eager (x copied to
    channels-last where it is not, the weight packed through the cache, the output made) or
    for ``torch.compile`` to trace, on fake tensors whose sizes may be symbolic and whose
    addresses are unknown: the copy and the pack as torch ops (Inductor may fuse the copy into
    the producer of x, and its CSE merges the three dilations' packs of one weight), no pack
    cache, and no tensor descriptors (the ``tma`` config runs the ``dot`` kind over the same
    channels-last copy: descriptors need Triton's allocator at run time and addresses checked
    per call)."""
    n, c, h, w = x.shape
    co, _, kh, kw = weight.shape
    pad_h, pad_w = padding
    oh = h + 2 * pad_h - dilation * (kh - 1)
    ow = w + 2 * pad_w - dilation * (kw - 1)
    kind = "dot"
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    c_pad, co_pad = _cdiv(c, bk) * bk, _cdiv(co, bn) * bn
    nhwc = bool(config.get("nhwc", True))
    if nhwc and not (eager and x.is_contiguous(memory_format=torch.channels_last)):
        # One copy to channels-last buys vector loads of whole channel runs (see kernel); said
        # in torch, the graph's copy is a node Inductor may fuse into the producer of x.
        x = x.contiguous(memory_format=torch.channels_last)
    tma = nhwc and bool(config.get("tma", False))
    kmajor = tma or bool(config.get("w_kmajor", True))  # the descriptor route reads K-major
    if eager:
        packed = _packed_weight(weight, c_pad, co_pad, x.dtype, kmajor)
    else:
        packed = pack(weight, c_pad, co_pad, x.dtype, kmajor)
    m = n * oh * ow
    sxn, sxc, sxh, sxw = x.stride()
    # Without an epilogue the scale and shift pointers are never read: the packed weight
    # stands in, so that every launch passes tensors of one layout there.
    scale, shift, code = epilogue if epilogue is not None else (packed, packed, 0)
    out = torch.empty((n, co, oh, ow), dtype=x.dtype, device=x.device)
    args = (x, packed, out, scale, shift,
            n, h, w, oh, ow, m, sxn, sxc, sxh, sxw, pad_h, pad_w, dilation)  # fmt: skip
    grid = (_cdiv(m, bm) * _cdiv(co, bn),)
    if eager and tma and _tma_ok(x, packed, c):
        kind, grid = "tma", (n * oh * _cdiv(ow, bm) * _cdiv(co, bn),)
    constexprs = dict(
        C=c, CO=co, C_PAD=c_pad, CO_PAD=co_pad, KH=kh, KW=kw,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        # bool(): under torch.compile a stride may be symbolic; the comparison guards on it.
        X_W_UNIT=bool(sxw == 1), X_C_UNIT=bool(sxc == 1),
        DOT_PRECISION=config["input_precision"],
        UPCAST=rt.INTERPRETING and x.dtype != torch.float32,
        TAPS_INNER=bool(config.get("taps_inner", False)), NHWC=nhwc, W_KMAJOR=kmajor,
        EPILOGUE=code, KIND=kind,
    )  # fmt: skip
    return kind, grid, args, constexprs


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
    kind, grid, args, kwargs = launch_args(
        x, weight, dilation, _pair(padding, "padding"), config, epilogue, eager=True
    )
    if out is not None:
        args = (*args[:2], out, *args[3:])
    if kind == "tma":
        _ensure_allocator()
    kwargs.update(kc.launch_options(config))
    return KERNEL, grid, args, kwargs, args[2]


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
    if rt.INTERPRETING:
        return
    try:
        from triton.runtime import _allocation

        if not isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
            return
    except (ImportError, AttributeError):
        pass
    triton.set_allocator(_torch_scratch)
