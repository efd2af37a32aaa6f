"""Graph mode's triton ops (issue 33): where torch has ``torch.library.triton_op``, the dilated
and depthwise convs' ops are triton ops, whose graph bodies launch the kernels through
``wrap_triton``, so Inductor launches them from its own code (no rocmfix Python per node).

The bodies are traced here as AOTAutograd traces them (functionalized, on fake CUDA tensors:
no GPU needed to trace, and the interpreter's kernels are no JITFunctions ``wrap_triton`` can
trace), and the graph must hold each kernel with the launch the eager plan would make. The
torch < 2.6 path (no ``triton_op``) and ``ROCMFIX_TRITON_OP=0`` must define the opaque op,
in a fresh process, since an op is defined once per process. On CPU tensors the bodies are
torch ops: compiled with Inductor they equal the stock modules.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
import torch
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
from torch._subclasses.fake_tensor import FakeTensorMode
from torch._subclasses.functional_tensor import dispatch_functionalize
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

from conftest import PYTHONPATH, ROOT, load_template

pytestmark = pytest.mark.skipif(
    not hasattr(torch.library, "triton_op"), reason="torch < 2.6 has no triton_op"
)


@pytest.fixture(scope="module")
def compiled_templates() -> Iterator[tuple[ModuleType, ModuleType]]:
    """The templates with Triton compiling, not interpreting (JITFunction kernels). Without a
    GPU, torch's mutation analysis of a kernel cannot reach a driver and logs a warning (it
    then assumes every argument written): quieted."""
    log = logging.getLogger("torch._dynamo")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield (
            load_template("dilated_conv_triton", interpret=False),
            load_template("depthwise_conv_triton", interpret=False),
        )
    finally:
        log.setLevel(level)


def _trace(
    fn: Callable[..., Any], *shapes: tuple[Any, ...], env: ShapeEnv | None = None
) -> list[tuple[Any, dict[str, Any], Any]]:
    """``fn`` on fake CUDA tensors of ``shapes``, traced as AOTAutograd traces a triton op's
    body: each kernel launch as (kernel, its scalar arguments, grid)."""
    mode = FakeTensorMode(shape_env=env) if env is not None else FakeTensorMode()
    with mode:
        args = [torch.empty(s, device="cuda") for s in shapes]
        gm = make_fx(dispatch_functionalize(fn))(*args)
    launches = []
    for n in gm.graph.nodes:
        if n.target is torch.ops.higher_order.triton_kernel_wrapper_functional:
            kernel = kernel_side_table.get_kernel(n.kwargs["kernel_idx"])
            scalars = {k: v for k, v in n.kwargs["kwargs"].items() if not hasattr(v, "meta")}
            # Warps and stages are a one-config Autotuner around the kernel.
            for config in getattr(kernel, "configs", ()):
                scalars.update(num_warps=config.num_warps, num_stages=config.num_stages)
            launches.append((getattr(kernel, "fn", kernel), scalars, n.kwargs["grid"][0]))
    return launches


def test_the_dilated_body_launches_the_eager_plans_kernel(
    compiled_templates: tuple[ModuleType, ModuleType],
) -> None:
    tri, _dw = compiled_templates
    x_shape, w_shape = (2, 16, 20, 24), (16, 16, 3, 3)
    [(kernel, scalars, grid)] = _trace(
        lambda x, w, s: tri._graph(x, w, 3, [3, 3], s, s, 2), x_shape, w_shape, (16,)
    )
    # The eager plan for the same call (no launch; prepare packs on the CPU).
    x, w = torch.randn(x_shape), torch.randn(w_shape)
    cfg = tri.resolve_config("cuda", 16, 16, 3, torch.float32)
    scale = torch.ones(16)
    want_kernel, want_grid, args, kwargs, _ = tri.dk.prepare_launch(
        x, w, 3, (3, 3), cfg, epilogue=(scale, scale, 2)
    )
    assert kernel is want_kernel  # the same @triton.jit function, the dot kernel
    assert tuple(grid) == (*want_grid, 1, 1)  # torch pads a grid to three dimensions
    for key, value in kwargs.items():
        assert scalars[key] == value, key
    assert scalars["EPILOGUE"] == 2 and scalars["NHWC"] is True
    # The channels-last strides, sizes, padding and dilation, as the eager launch passes them.
    names = ("N", "H", "W", "OH", "OW", "M", "sxn", "sxc", "sxh", "sxw", "pad_h", "pad_w", "dil")
    assert [scalars[k] for k in names] == list(args[5:])


def test_a_tma_config_runs_the_dot_kernel_in_the_graph(
    compiled_templates: tuple[ModuleType, ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tensor descriptors need Triton's allocator at run time and per-call address checks:
    the graph launches the dot kernel over the same channels-last copy instead."""
    tri, _dw = compiled_templates
    resolve = tri.resolve_config
    monkeypatch.setattr(tri, "resolve_config", lambda *a: dict(resolve(*a), tma=True))
    [(kernel, scalars, _grid)] = _trace(
        lambda x, w: tri._graph(x, w, 2, [2, 2], None, None, 0), (1, 16, 12, 12), (16, 16, 3, 3)
    )
    assert kernel is tri.dk.KERNELS["dot"]
    assert scalars["NHWC"] is True and scalars["W_KMAJOR"] is True


def test_the_depthwise_body_reads_pairs_only_where_the_fake_promises_them(
    compiled_templates: tuple[ModuleType, ModuleType],
) -> None:
    """VEC 2 reads aligned input pairs: chosen from the shapes and strides, and from the
    storage offset for the address (a fake has none); an odd offset reads single elements."""
    _tri, dw = compiled_templates

    def aligned(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = dw.dop.graph(x, w, s, s, [1, 1], [1, 1], 1)
        return out

    def odd(flat: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        # The same layout one element into a buffer: its address is only 4 bytes aligned.
        x = flat[1:].view(2, 16, 32, 48)
        out: torch.Tensor = dw.dop.graph(x, w, s, s, [1, 1], [1, 1], 1)
        return out

    shapes = ((2, 16, 32, 48), (16, 1, 3, 3), (16,))
    [(kernel, pairs, grid)] = _trace(aligned, *shapes)
    [(_k, singles, grid1)] = _trace(odd, (2 * 16 * 32 * 48 + 1,), *shapes[1:])
    assert kernel is dw.dk.KERNEL
    assert pairs["VEC"] == 2 and singles["VEC"] == 1
    assert pairs["BLOCK_P"] >= 2 * 32 * 4 or pairs["BLOCK_P"] >= singles["BLOCK_P"]
    # Each grid covers the plane with its own tile.
    for scalars, g in ((pairs, grid), (singles, grid1)):
        assert g[0] * scalars["BLOCK_P"] >= 32 * 48 and g[1:] == (16, 2)


def test_symbolic_sizes_guard_instead_of_breaking(
    compiled_templates: tuple[ModuleType, ModuleType],
) -> None:
    """``dynamic=True``: sizes reach the config choice as SymInts. The choice guards (the
    width's parity for the depthwise pairs, the 32-bit span) and the launch takes symbolic
    sizes and grid; nothing is forced concrete."""
    tri, dw = compiled_templates
    env = ShapeEnv()
    from torch._dynamo.source import ConstantSource

    def sym(name: str, hint: int) -> Any:
        symbol = env.create_symbol(hint, ConstantSource(name), dynamic_dim=DimDynamic.DYNAMIC)
        return env.create_symintnode(symbol, hint=hint)

    h, w = sym("h", 32), sym("w", 48)

    def both(x: torch.Tensor, wt: torch.Tensor, s: torch.Tensor) -> Any:
        a = dw.dop.graph(x, wt, s, s, [1, 1], [1, 1], 1)
        b = tri._graph(x, wt.expand(16, 16, 3, 3), 2, [2, 2], None, None, 0)
        return a, b

    launches = _trace(both, (2, 16, h, w), (16, 1, 3, 3), (16,), env=env)
    assert [k for k, _s, _g in launches] == [dw.dk.KERNEL, tri.dk.KERNELS["dot"]]
    assert isinstance(launches[0][2][0], torch.fx.Node)  # the grid: computed from the size
    assert launches[0][1]["VEC"] == 2  # under a guard on the width's parity
    guards = " ".join(str(g.expr) for g in env.guards)
    assert "Mod" in guards, guards


_FALLBACK = textwrap.dedent(
    """
    import os, sys, torch
    sys.path.insert(0, {tests!r})
    if sys.argv[1] == "hide":
        del torch.library.triton_op  # torch < 2.6
    if sys.argv[1] == "2.6":  # triton_op there, but Inductor may pad a kernel's input
        torch.__version__ = torch.torch_version.TorchVersion("2.6.0+rocm6.2.4")
    if sys.argv[1] == "partial":  # an API change that fails after defining the op
        real = torch.library.triton_op

        def failing(*args, **kwargs):
            real(*args, **kwargs)
            raise TypeError("changed")

        torch.library.triton_op = failing
    from conftest import load_template
    for name in ("dilated_conv_triton", "depthwise_conv_triton"):
        t = load_template(name)
        holder = t.rop.rt.process_holder()
        defined = getattr(holder, t.OP_NAME)
        print(name, type(defined).__name__, t.rop.is_triton_op(t._OP))
    tri = load_template("dilated_conv_triton")
    x, w = torch.randn(1, 4, 9, 9), torch.randn(4, 4, 3, 3)
    got = tri._OP(x, w, 2, [2, 2], None, None, 0)
    ref = torch.nn.functional.conv2d(x, w, None, 1, 2, 2)
    print("max_err", float((got - ref).abs().max()))
    """
)


@pytest.mark.parametrize("how", ["hide", "2.6", "env", "partial", "default"])
def test_without_triton_op_the_opaque_op_is_defined(how: str) -> None:
    """torch < 2.6 (``triton_op`` hidden), torch 2.6 and ``ROCMFIX_TRITON_OP=0`` define the
    ``torch.library.Library`` op, which computes the same; by default the triton op. A
    ``triton_op`` that fails after defining the op leaves that op (its body computes it), and
    the template imports."""
    env = {"PYTHONPATH": PYTHONPATH, "TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"}
    if how == "env":
        env["ROCMFIX_TRITON_OP"] = "0"
    done = subprocess.run(
        [sys.executable, "-c", _FALLBACK.format(tests=str(ROOT / "tests")), how],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    opaque = how != "default"
    for name in ("dilated_conv_triton", "depthwise_conv_triton"):
        kind, triton_op = lines[name].split()
        want = {"default": "CustomOpDef", "partial": "str"}.get(how, "Library")
        assert kind == want, lines
        assert triton_op == str(not opaque), lines
    assert float(lines["max_err"]) < 1e-4, lines


class _Small(torch.nn.Module):
    """A weight-shared dilated block with its BatchNorm and SiLU, then a depthwise
    conv-BN-ReLU, through the templates' entries (or the stock modules)."""

    def __init__(self, tri: ModuleType | None, dw: ModuleType | None) -> None:
        super().__init__()
        self.tri, self.dw = tri, dw
        self.conv = torch.nn.Conv2d(8, 8, 3, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)
        self.dconv = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
        self.dbn = torch.nn.BatchNorm2d(8)
        self.act, self.relu = torch.nn.SiLU(), torch.nn.ReLU()
        g = torch.Generator().manual_seed(3)
        for bn in (self.bn, self.dbn):
            bn.running_mean.copy_(torch.randn(8, generator=g))
            bn.running_var.copy_(torch.rand(8, generator=g) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tri is None or self.dw is None:
            f = torch.nn.functional.conv2d
            y = sum(self.act(self.bn(f(x, self.conv.weight, None, 1, d, d))) for d in (2, 3))
            return self.relu(self.dbn(self.dconv(y)))  # type: ignore[arg-type]
        y = sum(
            self.tri.dilated_conv2d(x, self.conv.weight, d, d, bn=self.bn, act=self.act)
            for d in (2, 3)
        )
        out: torch.Tensor = self.dw.depthwise_conv2d(y, self.dconv, self.dbn, self.relu)
        return out


def test_inductor_on_cpu_compiles_the_ops_whole_and_matches_stock() -> None:
    """On CPU tensors the bodies are torch ops: Inductor compiles the model in one graph,
    static and dynamic, with the output of the stock modules."""
    tri, dw = load_template("dilated_conv_triton"), load_template("depthwise_conv_triton")
    ours, stock = _Small(tri, dw).eval(), _Small(None, None).eval()
    stock.load_state_dict(ours.state_dict())
    g = torch.Generator().manual_seed(4)
    pages = [torch.randn(n, 8, h, w, generator=g) for n, h, w in ((1, 12, 10), (2, 14, 16))]
    with torch.no_grad():
        explained = torch._dynamo.explain(ours)(pages[0])
        assert explained.graph_break_count == 0, explained.break_reasons
        nodes = [str(n.target) for gm in explained.graphs for n in gm.graph.nodes]
        assert sum(t.startswith("rocmfix.dilated_conv2d") for t in nodes) == 2
        assert sum(t.startswith("rocmfix.depthwise_conv2d") for t in nodes) == 1
        for dynamic in (None, True):
            torch._dynamo.reset()
            compiled = torch.compile(ours, fullgraph=True, dynamic=dynamic)
            for x in pages:
                torch.testing.assert_close(compiled(x), stock(x), rtol=1e-4, atol=1e-4)
