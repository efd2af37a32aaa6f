"""The Triton kernel of rocmfix's depthwise conv, and how one call becomes its launch (rocmfix
template; the host side is ``depthwise_conv_triton``).

rocmfix drops this file, under this name, beside that module; ``rocmfix revert`` removes it
with it. One kernel, :data:`KERNEL`: a tile of [BLOCK_C channels x BLOCK_P output pixels] of
one image, the weights in registers, an fp32 accumulator, and the folded BatchNorm and the
activation applied as it stores (``_fold_act``, inlined by Triton). ``VEC`` 2 reads a row's
window as aligned input pairs (see :func:`prepare_launch` for when it may); ``ROWS`` 2 computes
two output rows at the same columns, each input row loaded once for both. ``BLOCK_P`` counts
positions (columns of ``ROWS`` rows): a program stores ``ROWS * BLOCK_P`` outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import rocmfix_kernel_config as kc
from . import rocmfix_triton as rt

if rt.HAS_TRITON:
    # The modules rocmfix_triton imported, bound here for the kernels' annotations: that
    # module alone decides whether Triton is usable.
    import triton
    import triton.language as tl

KERNEL: Any = None

if rt.HAS_TRITON:
    # Builtins only, no @triton.jit helpers of triton.language (tl.sigmoid, tl.cdiv): those are
    # compiled-or-interpreted when triton is first imported, and tests set TRITON_INTERPRET=1
    # after that. Sizes stay out of the specialisation: a new page size compiles nothing new.

    @triton.jit
    def _fold_act(acc, scale, shift, HAS_SCALE: tl.constexpr, HAS_SHIFT: tl.constexpr,
                  ACT: tl.constexpr):  # fmt: skip
        if HAS_SCALE:
            acc = acc * scale
        if HAS_SHIFT:
            acc = acc + shift
        if ACT == 1:
            acc = tl.maximum(acc, 0.0)
        elif ACT == 2:
            acc = acc / (1.0 + tl.exp(-acc))
        elif ACT == 3:
            acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
        elif ACT == 4:
            acc = acc * tl.minimum(tl.maximum(acc + 3.0, 0.0), 6.0) / 6.0
        return acc

    @triton.jit(do_not_specialize=("H", "W", "OH", "OW"))
    def _dw_kernel(
        x_ptr, w_ptr, scale_ptr, shift_ptr, out_ptr, C, H, W, OH, OW, sxn, sxc, sxh, sxw,
        KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
        PH: tl.constexpr, PW: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_SHIFT: tl.constexpr,
        ACT: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, VEC: tl.constexpr,
        ROWS: tl.constexpr,
    ):  # fmt: skip
        pid_p = tl.program_id(0)
        pid_c = tl.program_id(1)
        n = tl.program_id(2)
        npix = OH * OW
        # The tile runs over positions: ROWS output rows (oh, oh + 1) at one column. Row oh + 1
        # reads input rows SH below row oh's, so the two share KH - SH of them: a program
        # loads KH + SH rows where two of one row each would load 2 * KH (5x5: 6 for 10).
        npos = ((OH + ROWS - 1) // ROWS) * OW
        NROW: tl.constexpr = KH + (ROWS - 1) * SH
        offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        mask_c = offs_c < C
        # A tail channel reads the last one's weights (its outputs are not stored): the weight
        # loads, one per tap, need no mask and no fill value.
        w_base = w_ptr + tl.minimum(offs_c, C - 1) * (KH * KW)
        scale = tl.load(scale_ptr + offs_c, mask=mask_c & HAS_SCALE, other=1.0)
        shift = tl.load(shift_ptr + offs_c, mask=mask_c & HAS_SHIFT, other=0.0)
        if VEC == 2:
            # Pairs of outputs (even, odd) of one row (OW, W and every stride but the pixel
            # one even, stride 1 along W): each tap row is read as aligned input pairs, one
            # 2-element load serving two taps of both outputs; an odd tap's pair straddles
            # two of them (the high half of one, the low half of the next). Half the loads,
            # conversions and address sums of one load per tap and output.
            offs_q = pid_p * (BLOCK_P // 2) + tl.arange(0, BLOCK_P // 2)
            p0 = offs_q * 2
            mask_q = p0 < npos
            r = p0 // OW
            ow = p0 - r * OW
            oh = r * ROWS
            ih0 = oh * SH - PH
            half = tl.arange(0, 2)
            # One 64-bit pointer a pair, then a uniform offset a row and a constant one a pair
            # of taps (folded into the load's immediate): no address sum per load.
            row0 = x_ptr + (n * sxn + offs_c[:, None] * sxc + (oh * SH * sxh + ow)[None, :])
            S0: tl.constexpr = -(PW + PW % 2)
            NPAIR: tl.constexpr = (KW - PW - S0) // 2 + 1
            # A pointer's alignment is in bytes.
            PAIR_BYTES: tl.constexpr = x_ptr.dtype.element_ty.primitive_bitwidth // 4
            acc = tl.zeros((BLOCK_C, BLOCK_P // 2, 2), dtype=tl.float32)
            acc1 = tl.zeros((BLOCK_C, BLOCK_P // 2, 2), dtype=tl.float32)
            for j in tl.static_range(NROW):
                ih = ih0 + j
                row_ok = mask_c[:, None] & (mask_q & (ih >= 0) & (ih < H))[None, :]
                row = row0 + (j - PH) * sxh
                prev = acc
                for t in tl.static_range(NPAIR):
                    s = S0 + 2 * t
                    iw = ow + s
                    ok = row_ok & ((iw >= 0) & (iw < W))[None, :]
                    ptr = tl.multiple_of((row + s)[:, :, None] + half[None, None, :],
                                         [1, 1, PAIR_BYTES])  # fmt: skip
                    cur = tl.load(
                        ptr,
                        mask=tl.broadcast_to(ok[:, :, None], (BLOCK_C, BLOCK_P // 2, 2)),
                        other=0.0,
                    ).to(tl.float32)
                    if s + PW >= 0 and s + PW < KW:
                        # Input row j is tap row j of output row oh, j - SH of oh + 1.
                        if j < KH:
                            wv = tl.load(w_base + (j * KW + s + PW))
                            acc += cur * wv.to(tl.float32)[:, None, None]
                        if ROWS == 2 and j >= SH:
                            wv = tl.load(w_base + ((j - SH) * KW + s + PW))
                            acc1 += cur * wv.to(tl.float32)[:, None, None]
                    if t > 0 and s - 1 + PW >= 0 and s - 1 + PW < KW:
                        _, prev_hi = tl.split(prev)
                        cur_lo, _ = tl.split(cur)
                        mid = tl.join(prev_hi, cur_lo)
                        if j < KH:
                            wv = tl.load(w_base + (j * KW + s - 1 + PW))
                            acc += mid * wv.to(tl.float32)[:, None, None]
                        if ROWS == 2 and j >= SH:
                            wv = tl.load(w_base + ((j - SH) * KW + s - 1 + PW))
                            acc1 += mid * wv.to(tl.float32)[:, None, None]
                    prev = cur
            out_off = tl.multiple_of(
                ((n * C + offs_c[:, None]) * npix + (oh * OW + ow)[None, :])[:, :, None]
                + half[None, None, :],
                [1, 1, 2],
            )
            store_ok = mask_c[:, None] & mask_q[None, :]
            acc = _fold_act(acc, scale[:, None, None], shift[:, None, None], HAS_SCALE,
                            HAS_SHIFT, ACT)  # fmt: skip
            tl.store(
                out_ptr + out_off,
                acc.to(out_ptr.dtype.element_ty),
                mask=tl.broadcast_to(store_ok[:, :, None], (BLOCK_C, BLOCK_P // 2, 2)),
            )
            if ROWS == 2:
                # The second row of an odd-height plane's last position is not there.
                acc1 = _fold_act(acc1, scale[:, None, None], shift[:, None, None], HAS_SCALE,
                                 HAS_SHIFT, ACT)  # fmt: skip
                store_ok1 = store_ok & (oh + 1 < OH)[None, :]
                tl.store(
                    out_ptr + (out_off + OW),
                    acc1.to(out_ptr.dtype.element_ty),
                    mask=tl.broadcast_to(store_ok1[:, :, None], (BLOCK_C, BLOCK_P // 2, 2)),
                )
        else:
            offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
            mask_p = offs_p < npos
            r = offs_p // OW
            ow = offs_p - r * OW
            oh = r * ROWS
            ih0 = oh * SH - PH
            iw0 = ow * SW - PW
            # One offset per output, then a uniform one per tap: a tap costs an add, not the
            # products of its row and column with their strides.
            base = x_ptr + (n * sxn + offs_c[:, None] * sxc + (ih0 * sxh + iw0 * sxw)[None, :])
            acc2 = tl.zeros((BLOCK_C, BLOCK_P), dtype=tl.float32)
            acc3 = tl.zeros((BLOCK_C, BLOCK_P), dtype=tl.float32)
            for j in tl.static_range(NROW):
                ih = ih0 + j
                row_ok = mask_c[:, None] & (mask_p & (ih >= 0) & (ih < H))[None, :]
                for kw in tl.static_range(KW):
                    iw = iw0 + kw
                    ok = row_ok & ((iw >= 0) & (iw < W))[None, :]
                    xv = tl.load(base + (j * sxh + kw * sxw), mask=ok, other=0.0)
                    xv = xv.to(tl.float32)
                    if j < KH:
                        wv = tl.load(w_base + (j * KW + kw))
                        acc2 += xv * wv.to(tl.float32)[:, None]
                    if ROWS == 2 and j >= SH:
                        wv = tl.load(w_base + ((j - SH) * KW + kw))
                        acc3 += xv * wv.to(tl.float32)[:, None]
            out = out_ptr + (n * C + offs_c[:, None]) * npix + (oh * OW + ow)[None, :]
            store_ok2 = mask_c[:, None] & mask_p[None, :]
            acc2 = _fold_act(acc2, scale[:, None], shift[:, None], HAS_SCALE, HAS_SHIFT, ACT)
            tl.store(out, acc2.to(out_ptr.dtype.element_ty), mask=store_ok2)
            if ROWS == 2:
                acc3 = _fold_act(acc3, scale[:, None], shift[:, None], HAS_SCALE, HAS_SHIFT, ACT)
                tl.store(out + OW, acc3.to(out_ptr.dtype.element_ty),
                         mask=store_ok2 & (oh + 1 < OH)[None, :])  # fmt: skip

    KERNEL = _dw_kernel


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pairs_fit(
    x: torch.Tensor, stride: tuple[int, int], ow: Any, aligned: Callable[[Any], bool] | None = None
) -> bool:
    """Whether the kernel may read the input as aligned pairs of a row (``VEC`` 2): stride 1
    along rows, unit column stride, every other stride, the widths and the address even, so
    that an even output column reads an even input one and a pair is never half in bounds.
    On a fake tensor (the traced op) sizes may be symbolic (each test guards: a new parity
    recompiles, as Inductor's own choices do) and ``aligned`` proves the address from the
    storage offset (``rocmfix_custom_op.offset_aligned``); else it is read."""
    n, _, _, w = x.shape
    sn, sc, sh, sw = x.stride()
    return (
        stride[1] == 1
        and bool(sw == 1)
        and bool(w % 2 == 0)
        and bool(ow % 2 == 0)
        and bool(sh % 2 == 0)
        and bool(sc % 2 == 0)
        and (bool(sn % 2 == 0) or bool(n == 1))
        and (x.data_ptr() % (2 * x.element_size()) == 0 if aligned is None else aligned(x))
    )


def prepare_launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    stride: tuple[int, int],
    padding: tuple[int, int],
    config: dict[str, Any],
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    act: int = 0,
    out: torch.Tensor | None = None,
    aligned: Callable[[Any], bool] | None = None,
) -> tuple[Any, tuple[int, int, int], tuple[Any, ...], dict[str, Any], torch.Tensor]:
    """Kernel, grid, positional arguments, launch keywords and output of one call; ``weight``
    is ``[C, 1, KH, KW]``; ``aligned`` as :func:`pairs_fit`'s. Nothing is checked here: the
    entry point did."""
    n, c, h, w = x.shape
    kh, kw = int(weight.shape[2]), int(weight.shape[3])
    oh = (h + 2 * padding[0] - kh) // stride[0] + 1
    ow = (w + 2 * padding[1] - kw) // stride[1] + 1
    if out is None:
        out = torch.empty((n, c, oh, ow), dtype=x.dtype, device=x.device)
    # The kernel reads [C, KH*KW], a contiguous weight's own layout: passed as it is, the
    # compiled graph launches it without a reinterpret_tensor view per call.
    wk = weight if weight.is_contiguous() else weight.contiguous()
    block_p, block_c = int(config["BLOCK_P"]), int(config["BLOCK_C"])
    vec = 2 if int(config.get("VEC", 2)) == 2 and pairs_fit(x, stride, ow, aligned) else 1
    if vec == 2:
        # Fewer pairs than lanes replicate the tile across lanes: 4x slower on an H100 (a
        # 128-pixel tile on 4 warps). A wave is 64 lanes on CDNA, 32 on RDNA and NVIDIA.
        lanes = 64 if kc.is_hip() else 32
        block_p = max(block_p, 2 * lanes * int(config["num_warps"]))
    # Two output rows a position where the config asks and the plane has them.
    rows = 2 if int(config.get("ROWS", 1)) == 2 and oh > 1 else 1
    grid = (_cdiv(_cdiv(oh, rows) * ow, block_p), _cdiv(c, block_c), n)
    sn, sc, sh, sw = x.stride()
    args = (x, wk, wk if scale is None else scale, wk if shift is None else shift, out,
            c, h, w, oh, ow, sn, sc, sh, sw)  # fmt: skip
    kwargs = {
        "KH": kh,
        "KW": kw,
        "SH": stride[0],
        "SW": stride[1],
        "PH": padding[0],
        "PW": padding[1],
        "HAS_SCALE": scale is not None,
        "HAS_SHIFT": shift is not None,
        "ACT": act,
        "BLOCK_P": block_p,
        "BLOCK_C": block_c,
        "VEC": vec,
        "ROWS": rows,
        **kc.launch_options(config),
    }
    return KERNEL, grid, args, kwargs, out
