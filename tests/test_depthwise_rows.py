"""CPU tests of the depthwise kernel's two-rows path (``ROWS`` 2: two output rows a position,
each input row loaded once for both; templates/depthwise_conv_kernels.py), in Triton's CPU
interpreter, against F.conv2d and the one-row path on fresh random inputs."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import json
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

from conftest import load_template

triton = pytest.importorskip("triton")

TOL = {torch.float32: 1e-5, torch.float16: 2e-3}
TILES = (
    {"BLOCK_P": 16, "BLOCK_C": 4, "num_warps": 1},
    {"BLOCK_P": 64, "BLOCK_C": 1, "num_warps": 2},
)


pytestmark = pytest.mark.usefixtures("no_kernel_config")


@pytest.fixture(scope="module")
def tri() -> ModuleType:
    return load_template("depthwise_conv_triton")


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    assert got.dtype == dtype and got.shape == want.shape
    # Floored as in test_depthwise_templates: a ReLU may leave a near-zero output.
    err = float((got.float() - want).norm() / want.norm().clamp_min(0.1 * want.numel() ** 0.5))
    assert err < TOL[dtype], err


def _rows(tri: ModuleType, x: torch.Tensor, w: torch.Tensor, s: int, pad: tuple[int, int],
          cfg: dict[str, int]) -> int:  # fmt: skip
    kwargs = tri.prepare_launch(x, w, (s, s), pad, dict(cfg, num_stages=1))[3]
    return int(kwargs["ROWS"])


@pytest.mark.parametrize(
    "k, pad",
    [((3, 3), (1, 1)), ((5, 5), (2, 2)), ((1, 7), (0, 3)), ((2, 3), (1, 0)), ((3, 3), (0, 0))],
)  # fmt: skip
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_two_rows_compute_the_conv_one_row_does(
    tri: ModuleType, k: tuple[int, int], pad: tuple[int, int], stride: int, dtype: torch.dtype
) -> None:
    """Odd and even heights (the last position's second row masked), widths 1 to 3 (one
    element per tap) and even ones (pairs), both strides, each tile: ROWS 2 equals F.conv2d
    and ROWS 1."""
    c, kh, kw = 3, *k
    weight = torch.randn(c, 1, kh, kw).to(dtype)
    for h, w in ((7, 8), (5, 1), (4, 2), (9, 3), (2, 12)):
        if h + 2 * pad[0] < kh or w + 2 * pad[1] < kw:
            continue
        x = torch.randn(2, c, h, w).to(dtype)
        want = F.conv2d(x.float(), weight.float(), None, stride, pad, 1, c)
        for tile in TILES:
            for vec in (1, 2):
                one = tri.conv(x, weight, stride, pad, config=dict(tile, VEC=vec, ROWS=1))
                two = tri.conv(x, weight, stride, pad, config=dict(tile, VEC=vec, ROWS=2))
                _close(two, want, dtype)
                torch.testing.assert_close(two, one, rtol=1e-3, atol=1e-3)
                oh = want.shape[2]
                assert _rows(tri, x, weight, stride, pad, dict(tile, VEC=vec, ROWS=2)) == (
                    2 if oh > 1 else 1
                )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_two_rows_read_channels_last_and_offset_inputs(tri: ModuleType, dtype: torch.dtype) -> None:
    """Any strides: channels-last, a sliced batch at an odd address, with the BatchNorm fold
    and Hardswish in the store of both rows."""
    c = 6
    weight = torch.randn(c, 1, 5, 5).to(dtype)
    scale, shift = torch.rand(c) + 0.5, torch.rand(c) - 0.5
    x = torch.randn(2, c, 9, 12).to(dtype)
    want = F.hardswish(
        F.conv2d(x.float(), weight.float(), None, 1, 2, 1, c) * scale[:, None, None]
        + shift[:, None, None]
    )
    big = torch.randn(2 * c * 9 * 12 + 1).to(dtype)
    odd = big[1:].view(2, c, 9, 12)
    odd.copy_(x)
    for layout in (x.contiguous(memory_format=torch.channels_last), odd):
        for tile in TILES:
            got = tri.conv(layout, weight, 1, 2, scale=scale, shift=shift, act=4,
                           config=dict(tile, ROWS=2))  # fmt: skip
            _close(got, want, dtype)


def test_the_launch_counts_positions_of_two_rows(tri: ModuleType) -> None:
    """The grid covers ceil(OH / 2) x OW positions with ROWS 2; a one-row plane runs one row;
    a config without ROWS runs one (stride 2 and every arch without an entry untouched)."""
    x = torch.randn(1, 4, 7, 6)
    w = torch.randn(4, 1, 3, 3)
    cfg = {"BLOCK_P": 16, "BLOCK_C": 4, "num_warps": 1, "num_stages": 1, "VEC": 1}
    _, grid, _, kwargs, _ = tri.prepare_launch(x, w, (1, 1), (1, 1), dict(cfg, ROWS=2))
    assert kwargs["ROWS"] == 2 and grid == (2, 1, 1)  # 4 rows of positions x 6 columns / 16
    _, grid, _, kwargs, _ = tri.prepare_launch(x, w, (1, 1), (1, 1), cfg)
    assert kwargs["ROWS"] == 1 and grid == (3, 1, 1)  # 42 outputs / 16
    _, grid, _, kwargs, _ = tri.prepare_launch(x, w, (2, 2), (1, 1), cfg)
    assert kwargs["ROWS"] == 1
    flat = torch.randn(1, 4, 1, 40)
    w17 = torch.randn(4, 1, 1, 7)
    assert tri.prepare_launch(flat, w17, (1, 1), (0, 3), dict(cfg, ROWS=2))[3]["ROWS"] == 1


def test_shipped_tiles_ask_two_rows_where_measured(tri: ModuleType) -> None:
    """sm_90's NCHW tiles ask two rows but recognition's and the formula's fp16 stride-1 ones;
    channels-last and the unmeasured archs ask none."""
    f32, f16 = torch.float32, torch.float16
    want = {
        (5, 5, 1, f32, "nchw"): 2,
        (3, 3, 1, f32, "nchw"): 2,
        (3, 3, 2, f32, "nchw"): 2,
        (3, 3, 2, f16, "nchw"): 2,
        (3, 3, 1, f16, "nchw"): 1,
        (5, 5, 1, f16, "nchw"): 1,
        (5, 5, 1, f32, "nhwc"): 1,
    }
    for (kh, kw, s, dtype, layout), rows in want.items():
        cfg = tri.resolve_config(None, kh, kw, s, dtype, layout, arch="sm_90")
        assert cfg.get("ROWS", 1) == rows, (kh, s, dtype, layout)
    for arch in ("default", "gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1201"):
        cfg = tri.resolve_config(None, 5, 5, 1, f32, arch=arch)
        assert cfg.get("ROWS", 1) == 1


def test_the_entry_point_runs_two_rows_from_the_env_config(
    tri: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's config with ROWS 2 goes through the layer's entry point (odd height, the
    folded BatchNorm, ReLU) and gives the stock layer's output."""
    monkeypatch.setenv(
        "ROCMFIX_DEPTHWISE_CONV_CONFIG",
        json.dumps({"BLOCK_P": 32, "BLOCK_C": 2, "num_warps": 1, "ROWS": 2}),
    )
    tri.clear_config_cache()
    launched: list[int] = []
    real = tri.prepare_launch

    def spy(*args: object, **kwargs: object) -> object:
        plan = real(*args, **kwargs)
        launched.append(plan[3]["ROWS"])
        return plan

    monkeypatch.setattr(tri, "prepare_launch", spy)
    try:
        c = 4
        conv = torch.nn.Conv2d(c, c, 5, 1, 2, groups=c, bias=True).eval()
        bn = torch.nn.BatchNorm2d(c).eval()
        with torch.no_grad():
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 1.5)
        act = torch.nn.ReLU()
        x = torch.randn(2, c, 11, 10)
        with torch.no_grad():
            got = tri.depthwise_conv2d(x, conv, bn, act)
            want = act(bn(conv(x)))
        assert tri.resolve_config(None, 5, 5, 1, torch.float32)["ROWS"] == 2
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert launched == [2]
    finally:
        tri.clear_config_cache()
