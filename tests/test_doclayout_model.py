"""The phase-split template inside the real DocLayout-YOLO model (CPU).

Builds the released architecture from the installed ``doclayout-yolo`` package (random weights),
routes ``DilatedBlock.dilated_conv`` through templates/dilated_conv_phase.py with the block's
``bn`` and ``act``, as rocmfix's rewrite does, and compares a forward with the stock one.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import releases
from conftest import load_template

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def yolo() -> ModuleType:
    """doclayout-yolo 0.0.4 from PyPI (fetched once, cached), imported for this module."""
    sys.path.insert(0, str(releases.importable("doclayout-yolo", "0.0.4")))
    return importlib.import_module("doclayout_yolo")


def _dilated_block() -> Any:
    return importlib.import_module("doclayout_yolo.nn.modules.g2l_crm").DilatedBlock


class _DilationSpy(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.dilations: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.convolution.default, torch.ops.aten.conv2d.default):
            self.dilations.append(max(args[5]) if len(args) > 5 else 1)
        return func(*args, **(kwargs or {}))


def _head_maps(out: dict) -> torch.Tensor:
    """The one-to-one head's raw maps (before box decoding, whose anchor offsets would swamp
    differences), flattened into one tensor."""
    _decoded, maps = out["one2one"]
    return torch.cat([m.flatten(1) for m in maps], 1)


@pytest.fixture(scope="module")
def model(yolo: ModuleType) -> torch.nn.Module:
    cfg = Path(yolo.__file__).parent / "cfg/models/v10/yolov10m-doclayout.yaml"
    torch.manual_seed(0)
    tasks = importlib.import_module("doclayout_yolo.nn.tasks")
    m = tasks.YOLOv10DetectionModel(str(cfg), nc=10, verbose=False)
    g = torch.Generator().manual_seed(1)
    for mod in m.modules():  # non-trivial BN statistics: the kept BN must matter
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.copy_(torch.randn(mod.num_features, generator=g) * 0.1)
            mod.running_var.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
    return m.eval()


def _run(
    model: torch.nn.Module, x: torch.Tensor
) -> tuple[list[torch.Tensor], torch.Tensor, list[int]]:
    """Each DilatedBlock's fused branch output (before the residual add, where the dilated convs
    are not yet diluted by the identity), the head maps, and the dilation of every conv run."""
    blocks = [m for m in model.modules() if isinstance(m, _dilated_block())]
    taps: list[torch.Tensor] = []
    hooks = [
        b.conv1x1.register_forward_hook(lambda _m, _i, out: taps.append(out.clone()))
        for b in blocks
    ]
    try:
        with torch.inference_mode(), _DilationSpy() as spy:
            head = _head_maps(model(x))
    finally:
        for h in hooks:
            h.remove()
    return taps, head, spy.dilations


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_phase_split_model_forward_matches_stock(
    model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    phase = load_template("dilated_conv_phase", interpret=None)
    DilatedBlock = _dilated_block()
    blocks = [m for m in model.modules() if isinstance(m, DilatedBlock)]
    assert sorted({(b.k, tuple(b.dilation)) for b in blocks}) == [(3, (1, 3, 5)), (5, (1, 2, 3))]
    x = torch.rand(1, 3, 256, 192)
    ref_taps, ref_head, dils = _run(model, x)
    assert len(ref_taps) == 8
    assert sum(d > 1 for d in dils) == 16  # 8 blocks x 2 dilated convs

    def dilated_conv(self: Any, x: torch.Tensor, dilation: int) -> torch.Tensor:
        w = self.dcv.conv.weight
        p = dilation * (self.k // 2)
        return phase.dilated_conv2d(x, w, dilation, p, bn=self.dcv.bn, act=self.dcv.act)

    monkeypatch.setattr(DilatedBlock, "dilated_conv", dilated_conv)
    taps, head, dils = _run(model, x)
    assert dils and max(dils) == 1
    for got, ref in zip(taps, ref_taps, strict=True):
        assert got.shape == ref.shape and torch.isfinite(got).all()
        assert _rel(got, ref) < 1e-5
    assert _rel(head, ref_head) < 1e-5
    torch.testing.assert_close(head, ref_head, rtol=1e-4, atol=1e-4)

    # The probe can fail: running the dilated convs undilated changes every block's output.
    monkeypatch.setattr(
        DilatedBlock,
        "dilated_conv",
        lambda self, x, d: self.dcv.act(
            self.dcv.bn(F.conv2d(x, self.dcv.conv.weight, None, 1, self.k // 2, 1))
        ),
    )
    wrong, _, _ = _run(model, x)
    assert min(_rel(a, b) for a, b in zip(wrong, ref_taps, strict=True)) > 1e-3
