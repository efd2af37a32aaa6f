"""Graph mode: every dropped-in kernel is one registered op under ``torch.compile``.

The released DocLayout-YOLO architecture (doclayout-yolo from PyPI, random weights) with
``DilatedBlock.dilated_conv`` routed through each scheme's template as rocmfix's rewrite routes
GPU inputs (here CPU inputs: the Triton kernel runs in the interpreter, TRITON_INTERPRET=1),
compiled with ``fullgraph=True``: zero graph breaks, the gemm scheme's 16 dilated convs as 16
``rocmfix::dilated_conv2d`` nodes, no more recompiles than the stock model across page sizes
and batch sizes, and the stock output. Compiles are slow on a small CPU: one Inductor compile
per scheme, the recompile counts through ``aot_eager``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import releases
from conftest import load_template

pytestmark = pytest.mark.network

# Page sizes (multiples of the model's stride 32) and batch sizes a compiled model meets.
PAGES = ((1, 64, 64), (1, 96, 64), (2, 64, 96))


@pytest.fixture(scope="module")
def yolo() -> ModuleType:
    sys.path.insert(0, str(releases.importable("doclayout-yolo", "0.0.4")))
    return importlib.import_module("doclayout_yolo")


@pytest.fixture(scope="module")
def model(yolo: ModuleType) -> torch.nn.Module:
    cfg = Path(yolo.__file__).parent / "cfg/models/v10/yolov10m-doclayout.yaml"
    torch.manual_seed(0)
    tasks = importlib.import_module("doclayout_yolo.nn.tasks")
    m = tasks.YOLOv10DetectionModel(str(cfg), nc=10, verbose=False)
    g = torch.Generator().manual_seed(1)
    for mod in m.modules():  # non-trivial BN statistics: the fold must matter
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.copy_(torch.randn(mod.num_features, generator=g) * 0.1)
            mod.running_var.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
    return m.eval()


def _dilated_block() -> Any:
    return importlib.import_module("doclayout_yolo.nn.modules.g2l_crm").DilatedBlock


@pytest.fixture(params=["gemm", "linear"])
def scheme(request: pytest.FixtureRequest, model: torch.nn.Module) -> Iterator[str]:
    """``DilatedBlock.dilated_conv`` calling the scheme's template as the rewritten method
    calls it (with the block's ``bn`` and ``act``), for CPU inputs too."""
    name = {"gemm": "dilated_conv_triton", "linear": "dilated_conv_phase"}[request.param]
    template = load_template(name)
    block = _dilated_block()
    stock = block.dilated_conv

    def dilated_conv(self: Any, x: torch.Tensor, dilation: int) -> torch.Tensor:
        w = self.dcv.conv.weight
        p = dilation * (self.k // 2)
        out: torch.Tensor = template.dilated_conv2d(
            x, w, dilation, p, bn=self.dcv.bn, act=self.dcv.act
        )
        return out

    block.dilated_conv = dilated_conv
    _STOCK[block] = stock
    try:
        yield request.param
    finally:
        block.dilated_conv = stock


_STOCK: dict[type, Callable[..., Any]] = {}


def _maps(out: Any) -> torch.Tensor:
    _decoded, maps = out["one2one"]
    return torch.cat([m.flatten(1) for m in maps], 1)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _pages() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return [torch.rand(n, 3, h, w, generator=g) for n, h, w in PAGES]


def _frames(model: torch.nn.Module, dynamic: bool | None) -> int:
    """How many frames dynamo compiles for the model over every page (the first compile
    included): with ``fullgraph=True`` each is a whole-model graph."""
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled: Callable[..., Any] = torch.compile(
        model, backend=counter, fullgraph=True, dynamic=dynamic
    )
    with torch.inference_mode():
        for x in _pages():
            compiled(x)
    return int(counter.frame_count)


def _op_nodes(gm: torch.fx.GraphModule) -> int:
    op = torch.ops.rocmfix.dilated_conv2d
    return sum(n.op == "call_function" and n.target in (op, op.default) for n in gm.graph.nodes)


def test_the_patched_model_compiles_whole_and_matches_stock(
    model: torch.nn.Module, scheme: str
) -> None:
    x = _pages()[0]
    torch._dynamo.reset()
    with torch.inference_mode():
        explained = torch._dynamo.explain(model)(x)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    ops = sum(_op_nodes(gm) for gm in explained.graphs)
    # 8 blocks x 2 dilated convs (d > 1); the d = 1 convs stay aten convolutions.
    assert ops == (16 if scheme == "gemm" else 0), ops

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)  # Inductor, on CPU
    with torch.inference_mode():
        for page in (x, _pages()[1]):
            got, ref = _maps(compiled(page)), _maps(model(page))
            assert got.shape == ref.shape
            assert _rel(got, ref) < 1e-5, (scheme, page.shape, _rel(got, ref))


@pytest.mark.parametrize("dynamic", [None, True], ids=["default", "dynamic"])
def test_page_sizes_recompile_no_more_than_stock(
    model: torch.nn.Module, scheme: str, dynamic: bool | None
) -> None:
    patched = _frames(model, dynamic)
    block = _dilated_block()
    ours = block.dilated_conv
    block.dilated_conv = _STOCK[block]
    try:
        stock = _frames(model, dynamic)
    finally:
        block.dilated_conv = ours
    assert patched <= stock, (scheme, dynamic, patched, stock)
