"""The Qwen-VL patch embed: a Conv3d whose kernel equals its stride (2, 14, 14), which is a GEMM
of the flattened patches with the flattened weight. MIOpen has no fast kernel for it and
spends seconds a call (seed 000; pytorch#146998); vllm and transformers both run it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .base import DTYPES, TRITON_SUPPORT, Case, GridGroup, Op, Scheme, TensorShape, tile

# MinerU2.5's vision tower on one page (Qwen2-VL: 3x2x14x14 patches -> 1280; the 1036x1036
# layout thumbnail is 74 x 74 = 5476 patches), and a shape the CPU interpreter runs in seconds.
MINERU_PAGE = {"m": 5476, "c": 3, "t": 2, "p": 14, "n": 1280, "dtype": "bfloat16"}


# The portable pointer kernel (every GPU but sm_90's descriptor path), with a program per tile
# or one per compute unit walking the tiles. Persistence lifted the 128x256 tile from 0.57-0.71x
# to 0.76-0.92x of cuBLAS on an H200 and slowed 128x128 tiles, which share an SM without it
# (docs/performance.md); on AMD the tiles compile cleanly but are unmeasured, so tune decides.
_PTR = {"tma": False, "persistent": False, "flatten": False, "epilogue_subtile": False}
_PERSISTENT = {**_PTR, "persistent": True}
_TMA = {"tma": True, "persistent": True, "flatten": True, "epilogue_subtile": False}

GRID = (
    GridGroup(
        ("cpu",),
        (
            tile(16, 16, 32, 4, 1, tma=False),
            tile(32, 16, 64, 4, 1, tma=False),
            tile(16, 32, 16, 4, 1, tma=False),
        ),
    ),
    GridGroup(
        ("hip",),
        (
            tile(128, 128, 32, 8, 1, **_PTR),
            tile(128, 128, 64, 8, 1, **_PTR),
            tile(128, 128, 32, 8, 2, **_PTR),
            tile(128, 128, 64, 8, 2, **_PTR),
            tile(256, 128, 64, 8, 2, **_PTR),
            tile(128, 256, 32, 8, 2, **_PTR),
            tile(64, 128, 64, 4, 2, **_PTR),
            tile(128, 128, 32, 4, 2, **_PTR),
            # 48 KiB of LDS at two stages (RDNA3 spills the 64-deep K step), 146 KiB at three
            # (gfx950 only: tune screens out what overflows a GPU's LDS before timing it).
            tile(128, 256, 64, 8, 2, **_PERSISTENT),
            tile(128, 256, 32, 8, 2, **_PERSISTENT),
            tile(128, 256, 64, 8, 3, **_PERSISTENT),
        ),
    ),
    GridGroup(
        ("hip", "option:waves_per_eu"),
        (
            tile(128, 128, 64, 8, 2, waves_per_eu=2, **_PTR),
            tile(128, 128, 32, 8, 1, waves_per_eu=2, **_PTR),
        ),
    ),
    # The row-padded weight copy was measured on NVIDIA only (7-25% for the pointer kernel):
    # check that it pays on AMD too, on the shipped tile.
    GridGroup(("hip",), ({"pack_weight": False},)),
    # 16x16 vs 32x32 MFMA exists on CDNA (gfx9xx) only; RDNA's WMMA has one shape.
    GridGroup(
        ("hip", "option:matrix_instr_nonkdim", "arch:gfx9"),
        (
            tile(128, 128, 64, 8, 2, matrix_instr_nonkdim=16, **_PTR),
            tile(128, 128, 64, 8, 2, matrix_instr_nonkdim=32, **_PTR),
            tile(256, 128, 64, 8, 2, matrix_instr_nonkdim=16, **_PTR),
        ),
    ),
    GridGroup(
        ("cuda", "!host-tma"),
        (
            tile(128, 256, 64, 8, 3, **_PERSISTENT),
            tile(128, 256, 64, 8, 3, **_PTR),
            tile(256, 128, 64, 8, 3, **_PTR),
            tile(128, 128, 64, 8, 3, **_PTR),
            tile(128, 128, 32, 8, 4, **_PTR),
            tile(128, 128, 32, 4, 4, **_PTR),
        ),
    ),
    GridGroup(
        ("cuda", "host-tma"),
        (
            tile(128, 256, 64, 8, 3, **_TMA),
            tile(128, 256, 64, 8, 4, **{**_TMA, "epilogue_subtile": True}),
            tile(128, 256, 64, 8, 3, **{**_TMA, "flatten": False}),
            tile(128, 256, 64, 8, 3, **{**_TMA, "persistent": False, "flatten": False}),
            tile(256, 128, 64, 8, 3, **_TMA),
            tile(128, 256, 64, 8, 3, GROUP_M=16, **_TMA),
            tile(128, 128, 64, 8, 3, **{**_TMA, "persistent": False, "epilogue_subtile": True}),
            tile(128, 256, 64, 8, 3, **_PERSISTENT),
        ),
    ),
)


def label(s: TensorShape) -> str:
    k = s["c"] * s["t"] * s["p"] * s["p"]
    return f"{s['m']}x{k}→{s['n']} {DTYPES.get(s['dtype'], s['dtype'])}"


def matches(conv: Mapping[str, Any], x: Sequence[int], w: Sequence[int]) -> bool:
    """A recorded conv call of this op: any 3-D conv (the patch embed's is the one MinerU's
    models run; the replay's forms decline the others)."""
    return len(x) == 5 and not conv["transposed"]


OP = Op(
    name="patch-embed",
    title="patch embed",
    native="F.conv3d",
    schemes=(
        Scheme(
            "gemm",
            "Triton GEMM over the flattened patches",
            "Triton",
            "patch_embed_gemm.py",
            ("patch_embed_kernels.py", *TRITON_SUPPORT),
            needs_triton=True,
        ),
        Scheme(
            "linear",
            "F.linear: the vendor BLAS (hipBLASLt/rocBLAS), no Triton",
            "F.linear",
            "patch_embed_linear.py",
        ),
    ),
    cases=(
        Case(
            "patch-embed",
            MINERU_PAGE,
            {"m": 12, "c": 3, "t": 2, "p": 4, "n": 16, "dtype": "bfloat16"},
        ),
    ),
    kernel="patch_embed_gemm",
    kernel_template="patch_embed_gemm.py",
    tune=(
        Case(
            "patch_embed_gemm",
            MINERU_PAGE,
            {"m": 24, "c": 3, "t": 2, "p": 4, "n": 32, "dtype": "bfloat16"},
        ),
    ),
    grid=GRID,
    config_env="ROCMFIX_PATCH_EMBED_CONFIG",
    fallback="linear",
    order=10,
    harness="patch_embed",
    label=label,
    function="triton_conv3d_patchify",
    matches=matches,
    replay="conv3d",
)
