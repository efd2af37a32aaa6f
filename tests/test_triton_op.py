"""Graph mode's triton ops (issue 33): where torch has ``torch.library.triton_op``, the dilated
and depthwise convs' ops and the patch embed's are triton ops, whose graph bodies launch the
kernels through ``wrap_triton``, so Inductor launches them from its own code (no rocmfix Python
per node).

The bodies are traced here as AOTAutograd traces them (functionalized, on fake CUDA tensors:
no GPU needed to trace, and the interpreter's kernels are no JITFunctions ``wrap_triton`` can
trace), and the graph must hold each kernel with the launch the eager plan would make. The
torch < 2.6 path (no ``triton_op``) and ``ROCMFIX_TRITON_OP=0`` must define the opaque op,
in a fresh process, since an op is defined once per process. On CPU tensors the bodies are
torch ops: compiled with Inductor they equal the stock modules.
"""

from __future__ import annotations

import contextlib
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

# Imported here, at collection, under conftest's TRITON_INTERPRET=1: first imported inside the
# compiled_templates fixture (TRITON_INTERPRET=0 there), triton would make its language
# helpers compiled for every later test of the process, whose interpreted kernels then fail.
with contextlib.suppress(ImportError):
    import triton  # noqa: F401

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
    fn: Callable[..., Any],
    *shapes: tuple[Any, ...],
    env: ShapeEnv | None = None,
    dtype: torch.dtype = torch.float32,
    device: str = "cuda",
) -> list[tuple[Any, dict[str, Any], Any]]:
    """``fn`` on fake tensors of ``shapes`` (CUDA ones by default), traced as AOTAutograd
    traces a triton op's body: each kernel launch as (kernel, its scalar arguments, grid)."""
    mode = FakeTensorMode(shape_env=env) if env is not None else FakeTensorMode()
    with mode:
        args = [torch.empty(s, device=device, dtype=dtype) for s in shapes]
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
    assert scalars["KIND"] == kwargs["KIND"] == "dot"
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
    assert kernel is tri.dk.KERNEL and scalars["KIND"] == "dot"
    assert scalars["NHWC"] is True and scalars["W_KMAJOR"] is True


def test_the_depthwise_body_reads_pairs_only_where_the_fake_promises_them(
    compiled_templates: tuple[ModuleType, ModuleType],
) -> None:
    """VEC 2 reads aligned input pairs: chosen from the shapes and strides, and from the
    storage offset for the address (a fake has none); an odd offset reads single elements."""
    _tri, dw = compiled_templates

    def aligned(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = dw.graph(x, w, s, s, [1, 1], [1, 1], 1)
        return out

    def odd(flat: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        # The same layout one element into a buffer: its address is only 4 bytes aligned.
        x = flat[1:].view(2, 16, 32, 48)
        out: torch.Tensor = dw.graph(x, w, s, s, [1, 1], [1, 1], 1)
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
        a = dw.graph(x, wt, s, s, [1, 1], [1, 1], 1)
        b = tri._graph(x, wt.expand(16, 16, 3, 3), 2, [2, 2], None, None, 0)
        return a, b

    launches = _trace(both, (2, 16, h, w), (16, 1, 3, 3), (16,), env=env)
    assert [k for k, _s, _g in launches] == [dw.dk.KERNEL, tri.dk.KERNEL]
    assert isinstance(launches[0][2][0], torch.fx.Node)  # the grid: computed from the size
    assert launches[0][1]["VEC"] == 2  # under a guard on the width's parity
    guards = " ".join(str(g.expr) for g in env.guards)
    assert "Mod" in guards, guards


@pytest.fixture(scope="module")
def patch_embed() -> Iterator[ModuleType]:
    """The patch embed's template with Triton compiling (JITFunction kernels), quieted as
    :func:`compiled_templates`."""
    log = logging.getLogger("torch._dynamo")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield load_template("patch_embed_gemm", interpret=False)
    finally:
        log.setLevel(level)


# MinerU2.5's page: 5476 patches of 3x2x14x14 into 1280 channels.
_PAGE = (5476, 1176, 1280)


def _pe_eager(pe: ModuleType, plan: Any, bias: bool) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """The eager plan's pointer launch at MinerU's page (no descriptors; nothing launched):
    prepare_launch on CPU tensors, the weight packed as the eager path packs it."""
    m, k, n = _PAGE
    a = torch.randn(m, k, dtype=torch.bfloat16)
    w = torch.randn(n, k, dtype=torch.bfloat16)
    w = pe._packed_weight(w) if plan.pack else w
    b = torch.randn(n, dtype=torch.bfloat16) if bias else None
    out = torch.empty(m, n, dtype=torch.bfloat16)
    kernel, grid, args, kwargs = pe.prepare_launch(a, w, b, out, plan)
    return kernel, grid, dict(zip(pe.pk.PTR_KERNEL.arg_names, args, strict=False)) | kwargs


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(
    "arch", [("sm_90", False, 9, 132), ("gfx942", True, 0, 304), ("gfx1100", True, 0, 48)]
)
def test_the_patch_embed_body_launches_the_eager_plans_pointer_kernel(
    patch_embed: ModuleType, arch: tuple[str, bool, int, int], bias: bool
) -> None:
    """The graph runs the eager plan's tile on the pointer kernel (on sm_90, where eager mode
    takes the descriptor kernel at this size, the same tile and persistent grid on pointers),
    the weight padded to whole 128-byte rows as eager mode packs it, the HIP-only launch
    options dropped (Inductor takes warps and stages only)."""
    pe = patch_embed
    m, k, n = _PAGE
    shapes = [(m, k), (n, k)] + ([(n,)] if bias else [])
    with pe.kc.emulating(pe.kc.Emulation(*arch)):
        launches = _trace(
            lambda a, w, *b: pe._graph(a, w, b[0] if b else None), *shapes, dtype=torch.bfloat16
        )
        plan = pe._Plan(pe.resolve_config("cuda", torch.bfloat16), torch.device("cuda"))
    [(kernel, scalars, grid)] = launches
    assert kernel is pe.pk.PTR_KERNEL
    if arch[0] == "sm_90":
        assert plan.tma and plan.persistent  # eager mode's descriptor kernel at this size
    plan.tma = False
    want_kernel, want_grid, want = _pe_eager(pe, plan, bias)
    assert want_kernel is kernel and tuple(grid) == (*want_grid, 1, 1)
    hip_only = set(pe.kc.HIP_LAUNCH_KEYS)
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            continue
        if key in hip_only:
            assert key not in scalars, key
            continue
        assert scalars[key] == value, key
    assert scalars["PERSISTENT"] is plan.persistent and scalars["HAS_BIAS"] is bias
    assert scalars["W_ALIGN"] == 8 and scalars["stride_wn_q"] * 8 == 1216  # 2432-byte rows


def test_the_patch_embed_body_reads_rows_only_as_aligned_as_the_fake_promises(
    patch_embed: ModuleType,
) -> None:
    """x's rows are read as wide as their stride and address allow: a fake has no address,
    so an offset Inductor cannot prove 16-byte aligned reads single elements; symbolic row
    counts (``dynamic=True``) make a symbolic grid, without forcing the size concrete."""
    pe = patch_embed
    m, k, n = 64, 1176, 96

    def offset(flat: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = pe._graph(flat[3 : 3 + m * k].view(m, k), w, None)
        return out

    with pe.kc.emulating(pe.kc.Emulation("gfx1100", True, 0, 48)):
        [(_k, aligned, _g)] = _trace(lambda a, w: pe._graph(a, w, None), (m, k), (n, k),
                                     dtype=torch.float16)  # fmt: skip
        [(_k, odd, _g)] = _trace(offset, (m * k + 3,), (n, k), dtype=torch.float16)
        env = ShapeEnv()
        from torch._dynamo.source import ConstantSource

        symbol = env.create_symbol(m, ConstantSource("m"), dynamic_dim=DimDynamic.DYNAMIC)
        rows = env.create_symintnode(symbol, hint=m)
        [(_k, _s, grid)] = _trace(lambda a, w: pe._graph(a, w, None), (rows, k), (n, k),
                                  env=env, dtype=torch.float16)  # fmt: skip
    assert aligned["A_ALIGN"] == 8 and odd["A_ALIGN"] == 1
    assert isinstance(grid[0], torch.fx.Node)


def test_the_patch_embed_body_is_f_linear_where_no_kernel_runs(patch_embed: ModuleType) -> None:
    """CPU tensors and mixed dtypes: F.linear in the graph, as the eager path."""
    pe = patch_embed
    assert _trace(lambda a, w: pe._graph(a, w, None), (8, 24), (4, 24), device="cpu") == []

    def mixed(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = pe._graph(a, w.half(), None)
        return out

    assert _trace(mixed, (8, 24), (4, 24)) == []


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
    for name in ("dilated_conv_triton", "depthwise_conv_triton", "patch_embed_gemm"):
        t = load_template(name)
        holder = t.rop.rt.process_holder()
        defined = getattr(holder, t.OP_NAME)
        print(name, type(defined).__name__)
    tri = load_template("dilated_conv_triton")
    x, w = torch.randn(1, 4, 9, 9), torch.randn(4, 4, 3, 3)
    got = tri._OP(x, w, 2, [2, 2], None, None, 0)
    ref = torch.nn.functional.conv2d(x, w, None, 1, 2, 2)
    print("max_err", float((got - ref).abs().max()))
    pe = load_template("patch_embed_gemm")
    a, w = torch.randn(6, 24), torch.randn(8, 24)
    got = pe._OP(a, w, None)
    print("pe_err", float((got - a @ w.T).abs().max()))
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
    for name in ("dilated_conv_triton", "depthwise_conv_triton", "patch_embed_gemm"):
        want = {"default": "CustomOpDef", "partial": "str"}.get(how, "Library")
        assert lines[name] == want, lines
    assert float(lines["max_err"]) < 1e-4, lines
    assert float(lines["pe_err"]) < 1e-4, lines


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
