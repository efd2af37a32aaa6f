"""Graph mode: every dropped-in kernel is one registered op under ``torch.compile``.

The released DocLayout-YOLO architecture (doclayout-yolo from PyPI, random weights) with
``DilatedBlock.dilated_conv`` routed through each scheme's template as rocmfix's rewrite routes
GPU inputs (here CPU inputs: the Triton kernel runs in the interpreter, TRITON_INTERPRET=1),
compiled with ``fullgraph=True``: zero graph breaks, the gemm scheme's 16 dilated convs as 16
``rocmfix::dilated_conv2d`` nodes, no more recompiles than the stock model across page sizes
and batch sizes, and the stock output. Compiles are slow on a small CPU: one Inductor compile
per scheme, the recompile counts through dynamo alone (the ``eager`` backend). Where the op is
a triton op (torch >= 2.6), AOTAutograd replaces each node by the op's graph body, which on
CPU tensors is the torch reference (the interpreter's kernels cannot be traced): the compiled
CPU model checks the trace and the op's arguments; tests/test_triton_op.py checks the GPU
body's kernel launches on fake CUDA tensors.

A transformers Qwen2-VL whole model (a real release in a venv, patched by the real CLI): no
graph break of rocmfix's, the patch embed one ``rocmfix::patch_embed_gemm`` node, and the
patch embed compiled with ``fullgraph=True`` over image sizes and counts.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import releases
from conftest import load_template, run_cli

pytestmark = pytest.mark.network

# Each whole-model Inductor compile of DocLayout-YOLO takes 5-13 minutes on CI's two cores, more
# than the suite's budget for all of them; bench/compile_gpu.py checks the same on a GPU.
slow = pytest.mark.skipif(
    not os.environ.get("ROCMFIX_SLOW_TESTS"),
    reason="a whole-model compile takes minutes on 2 cores: set ROCMFIX_SLOW_TESTS=1",
)

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
        # With the default draw the output hardly depends on the page (two random pages
        # differ by 3e-8 relative): a wrong conv could pass. Kaiming's fan-in draw: 0.4.
        if isinstance(mod, torch.nn.Conv2d):
            with torch.no_grad():
                mod.weight.copy_(
                    torch.nn.init.kaiming_normal_(torch.empty_like(mod.weight), generator=g)
                )
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
    counter = CompileCounterWithBackend("eager")  # recompiles are dynamo's: no AOT needed
    compiled: Callable[..., Any] = torch.compile(
        model, backend=counter, fullgraph=True, dynamic=dynamic
    )
    with torch.inference_mode():
        for x in _pages():
            compiled(x)
    return int(counter.frame_count)


def _op_nodes(gm: torch.fx.GraphModule) -> int:
    # By name: the op is registered only once the gemm template was loaded in this process.
    return sum(
        n.op == "call_function" and str(n.target).startswith("rocmfix.dilated_conv2d")
        for n in gm.graph.nodes
    )


@slow
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
        other = torch.rand(x.shape, generator=torch.Generator().manual_seed(9))
        assert _rel(_maps(model(other)), _maps(model(x))) > 1e-3  # 100x the tolerance below
        for page in (x, _pages()[1]):
            got, ref = _maps(compiled(page)), _maps(model(page))
            assert got.shape == ref.shape
            assert _rel(got, ref) < 1e-5, (scheme, page.shape, _rel(got, ref))


class _Block(torch.nn.Module):
    """A weight-shared dilated block in DocLayout-YOLO's shape, small."""

    def __init__(self, act: torch.nn.Module) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 8, 3, bias=False)
        self.bn = torch.nn.BatchNorm2d(8).eval()
        self.act = act
        g = torch.Generator().manual_seed(3)
        self.bn.running_mean.copy_(torch.randn(8, generator=g))
        self.bn.running_var.copy_(torch.rand(8, generator=g) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tri = _TEMPLATE[0]
        return sum(  # type: ignore[return-value]
            tri.dilated_conv2d(x, self.conv.weight, d, d, bn=self.bn, act=self.act)
            for d in (1, 2, 3)
        )


_TEMPLATE: list[ModuleType] = []


@pytest.mark.parametrize(
    ("act", "code"), [(torch.nn.SiLU(), 2), (torch.nn.Identity(), 1), (torch.nn.ReLU(), 0)]
)
def test_the_fold_and_act_travel_as_op_arguments(act: torch.nn.Module, code: int) -> None:
    """BatchNorm + SiLU (or Identity) become the op's scale, shift and act code; any other
    activation is called on the op's output, as the block calls it."""
    if not _TEMPLATE:
        _TEMPLATE.append(load_template("dilated_conv_triton"))
    block = _Block(act).eval()
    x = torch.randn(1, 8, 13, 11)
    with torch.no_grad():
        ref = sum(
            act(block.bn(torch.nn.functional.conv2d(x, block.conv.weight, None, 1, d, d)))
            for d in (1, 2, 3)
        )
        torch._dynamo.reset()
        explained = torch._dynamo.explain(block)(x)
        assert explained.graph_break_count == 0, explained.break_reasons
        calls = [
            n
            for gm in explained.graphs
            for n in gm.graph.nodes
            if str(n.target).startswith("rocmfix.dilated_conv2d")
        ]
        assert [n.args[-1] for n in calls] == [code, code]  # d = 2 and 3; d = 1 is aten
        torch._dynamo.reset()
        got = torch.compile(block, backend="aot_eager", fullgraph=True, dynamic=True)(x)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    # With autograd recording, the op (which has no backward) stays out of the graph.
    torch._dynamo.reset()
    explained = torch._dynamo.explain(block)(x.requires_grad_())
    assert not any(
        str(n.target).startswith("rocmfix.") for gm in explained.graphs for n in gm.graph.nodes
    )


# The dynamic-shape trace takes over 2 minutes on CI's two cores: with ROCMFIX_SLOW_TESTS=1.
@pytest.mark.parametrize(
    "dynamic", [None, pytest.param(True, marks=slow)], ids=["default", "dynamic"]
)
def test_the_phase_split_traces_whole(dynamic: bool | None) -> None:
    """The ``linear`` scheme's phase split is plain torch: under ``fullgraph=True`` it traces
    with no graph break (its eager path's ``as_strided`` does not trace) and gives
    ``F.conv2d``'s answer over odd sizes, crops included."""
    phase = load_template("dilated_conv_phase")
    g = torch.Generator().manual_seed(4)
    weight = torch.randn(6, 4, 3, 3, generator=g)

    for d in (2, 3):  # a module's constant, as the block's dilation is

        def conv(x: torch.Tensor, d: int = d) -> torch.Tensor:
            out: torch.Tensor = phase.dilated_conv2d(x, weight, d, d)
            return out

        x = torch.randn(2, 4, 13, 10, generator=g)
        torch._dynamo.reset()
        explained = torch._dynamo.explain(conv)(x)
        assert explained.graph_break_count == 0, explained.break_reasons
        torch._dynamo.reset()
        compiled = torch.compile(conv, backend="aot_eager", fullgraph=True, dynamic=dynamic)
        for shape in ((2, 4, 13, 10), (1, 4, 16, 9), (3, 4, 7, 12)):
            x = torch.randn(*shape, generator=g)
            ref = torch.nn.functional.conv2d(x, weight, None, 1, d, d)
            torch.testing.assert_close(compiled(x), ref, rtol=1e-4, atol=1e-4)


_STOCK_FRAMES: dict[bool | None, int] = {}


# The phase split is aten ops whose strides could specialise on the page size: dynamic=True
# is its case. The stock count is taken once per setting.
@pytest.mark.parametrize(
    ("scheme", "dynamic"),
    [("gemm", None), ("gemm", True), ("linear", True)],
    ids=["gemm-default", "gemm-dynamic", "linear-dynamic"],
    indirect=["scheme"],
)
@slow
def test_page_sizes_recompile_no_more_than_stock(
    model: torch.nn.Module, scheme: str, dynamic: bool | None
) -> None:
    patched = _frames(model, dynamic)
    if dynamic not in _STOCK_FRAMES:
        block = _dilated_block()
        ours = block.dilated_conv
        block.dilated_conv = _STOCK[block]
        try:
            _STOCK_FRAMES[dynamic] = _frames(model, dynamic)
        finally:
            block.dilated_conv = ours
    assert patched <= _STOCK_FRAMES[dynamic], (scheme, dynamic, patched, _STOCK_FRAMES)


# ---------------------------------------------------------------------------- Qwen2-VL

QWEN_RELEASE = "4.57.6"  # as tests/test_transformers_model.py: this environment's newest fit

QWEN_SCRIPT = r"""
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

vision = dict(depth=1, embed_dim=32, hidden_size=48, num_heads=2, mlp_ratio=2, in_channels=3,
              patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
config = Qwen2VLConfig(vision_config=vision, hidden_size=48, intermediate_size=64,
                       num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                       vocab_size=160, image_token_id=151, video_token_id=152,
                       vision_start_token_id=150, vision_end_token_id=153,
                       rope_scaling={"type": "mrope", "mrope_section": [4, 4, 4]})
torch.manual_seed(0)
model = Qwen2VLForConditionalGeneration(config).eval()
embed = model.model.visual.patch_embed


def inputs(h, w, images):
    g = torch.Generator().manual_seed(h * 100 + w * 10 + images)
    ids = []
    for _ in range(images):
        ids += [150] + [151] * (h * w // 4) + [153]
    ids = torch.tensor([[1, 2, *ids, 3]])
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids),
                pixel_values=torch.randn(images * h * w, 3 * 2 * 14 * 14, generator=g),
                image_grid_thw=torch.tensor([[1, h, w]] * images))


report = {"forward": type(embed).__module__}
with torch.no_grad():
    x = inputs(4, 6, 1)
    explained = torch._dynamo.explain(model)(**x)
    report["breaks"] = explained.graph_break_count
    report["rocmfix_breaks"] = [str(r.reason)[:200] for r in explained.break_reasons
                                if any("rocmfix" in f.filename for f in r.user_stack)]
    report["ops"] = sum(str(n.target) == "rocmfix.patch_embed_gemm.default"
                        for gm in explained.graphs for n in gm.graph.nodes)
    # The part rocmfix rewrites compiles whole, over image counts and sizes, and matches
    # the stock conv with the same weights.
    torch._dynamo.reset()
    compiled = torch.compile(embed, fullgraph=True, dynamic=True)
    worst = 0.0
    for h, w, images in ((4, 6, 1), (6, 8, 2), (8, 4, 3)):
        pix = inputs(h, w, images)["pixel_values"]
        ref = embed.proj(pix.view(-1, 3, 2, 14, 14)).view(-1, 32)
        got = compiled(pix)
        worst = max(worst, ((got.double() - ref.double()).norm() / ref.double().norm()).item())
    report["embed_rel_err"] = worst
print(json.dumps(report))
"""


def _qwen(python: Path) -> dict[str, Any]:
    done = subprocess.run(
        [str(python), "-c", QWEN_SCRIPT], capture_output=True, text=True, timeout=1200, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_qwen2_vl_patched_adds_no_graph_break_and_its_embed_compiles_whole(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """transformers' own Qwen2-VL breaks the graph where it reads ``image_grid_thw`` (data-
    dependent shapes): the patched model must break exactly there and nowhere of rocmfix's,
    with the patch embed as one ``rocmfix::patch_embed_gemm`` node."""
    root = tmp_path_factory.mktemp("qwen-compile")
    python = releases.make_venv(root / "venv")
    releases.pip_install(python, releases.wheel("transformers", QWEN_RELEASE))
    site = releases.site_packages(python)
    (site / "zz_test_runner.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    stock = _qwen(python)
    applied = run_cli("apply", "--scheme", "gemm", "--only", "transformers-qwen2-vl", "--force",
                      "--python", str(python), timeout=600)  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    try:
        patched = _qwen(python)
    finally:
        reverted = run_cli("revert", "--python", str(python), timeout=600)
        assert reverted.returncode == 0, reverted.stderr
    assert stock["ops"] == 0 and patched["ops"] == 1, (stock, patched)
    assert patched["breaks"] == stock["breaks"], (stock, patched)
    assert patched["rocmfix_breaks"] == []
    assert patched["embed_rel_err"] < 1e-5 and stock["embed_rel_err"] < 1e-6
