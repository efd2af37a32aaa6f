"""Graph mode on a GPU: the patched models under ``torch.compile`` against the compiled stock.

Parts, each independent (``--parts``, comma-separated, default all but ``dw-*``, which need
``rocmfix apply``: bench/compile_gpu.sh), in this order, each
printing its row as soon as it is done and rewriting the JSON:

* ``doclayout-stock``, ``doclayout-gemm``, ``doclayout-linear``: DocLayout-YOLO (the released
  yolov10m-doclayout architecture, random weights, the installed ``doclayout-yolo``), stock or
  with ``DilatedBlock.dilated_conv`` routed through a scheme's template (``gemm``: the Triton
  kernel as ``rocmfix::dilated_conv2d``; ``linear``: the phase split, aten ops);
* ``dw-layout``, ``dw-det``, ``dw-rec``, ``dw-formula``: the depthwise work's models as
  bench/models_gpu.py builds and feeds them (PP-DocLayoutV2, PP-OCRv6 det tiny and rec small,
  the PP-FormulaNet_plus-M encoder), through the files ``rocmfix apply`` rewrote (run
  bench/compile_gpu.sh, which applies and reverts): stock and patched from one model by
  setting the rewritten files' entries; ``fullgraph`` where neither trace breaks;
* ``qwen``: a Qwen2-VL vision tower (Qwen2-VL-2B's patch embed, 3 -> 1280, 2x14x14; ``--depth``
  blocks) in the installed transformers, its ``PatchEmbed`` rewritten by rocmfix's own
  transform (``rocmfix::patch_embed_gemm``).

Per row: graph breaks and rocmfix ops (``torch._dynamo.explain``); frames compiled over three
page sizes (image counts), default and ``dynamic=True``, counted by dynamo (the ``eager``
backend: recompiles are dynamo's guards; patched and stock alike); ms per forward of the
patched model compiled ``fullgraph=True`` (Inductor, default mode) against the stock model
compiled in the same process (CUDA events, alternating, median) and their ratio; the relative
error against stock eager; a CUDA graph captured (``torch.cuda.graph``) from the compiled model
and from the eager patched model, replayed on a fresh input, against stock eager on it.

DocLayout-YOLO ``gemm`` and the ``dw-*`` parts go deeper, to tell host time from kernel
time: the eager models timed too, each compiled model captured as a CUDA graph and its replay
timed (GPU time alone, no host launches: ``graph_ms``), and torch.profiler's GPU kernel time
per forward by group (rocmfix's kernels, the vendor's convolutions, Inductor's, the rest).

Compiled code persists in ``--cache`` (TORCHINDUCTOR_CACHE_DIR, default a folder beside the
checkout), so a second call on the same machine skips Inductor's code generation.

    python bench/compile_gpu.py [--parts doclayout-stock,doclayout-gemm] [--out F.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGES = ((1, 1280, 928), (1, 1024, 768), (2, 1024, 1024))  # the timed page first
IMAGES = ((2, 36, 52), (1, 36, 52), (3, 52, 36))  # (images, grid h, grid w) of 14-px patches
PARTS = (
    "doclayout-stock",
    "doclayout-gemm",
    "qwen",
    "doclayout-linear",
    "dw-layout",
    "dw-det",
    "dw-rec",
    "dw-formula",
)
# --smoke: the same code on the CPU with tiny inputs and the aot_eager backend (no timing, no
# graph capture), to catch a typo before a GPU call.
SMOKE = {"on": False}
# --host-profile: cProfile over compiled forwards, patched and stock (compile_timing.host_profile)
HOST_PROFILE = {"on": False}
OUT_PATH = [Path("compile_gpu.json")]  # --out: the whole profiles land beside it
SMALL_PAGES = ((1, 96, 64), (1, 64, 64), (2, 64, 96))
SMALL_IMAGES = ((2, 4, 6), (1, 4, 6), (3, 6, 4))


def _dev() -> str:
    return "cpu" if SMOKE["on"] else "cuda"


def _rel(a: Any, b: Any) -> float:
    return float(((a.double() - b.double()).norm() / b.double().norm()).item())


def _frames(model: Callable[..., Any], calls: list[tuple[Any, ...]], dynamic: bool | None) -> int:
    """Frames dynamo compiles for ``model`` over ``calls`` (the first included), whole-graph."""
    import torch
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=dynamic)
    with torch.inference_mode():
        for args in calls:
            compiled(*args)
    return int(counter.frame_count)


def _replay(fn: Callable[..., Any], args: tuple[Any, ...], fresh: Any) -> Any:
    """``fn`` captured once on ``args`` (the first a tensor), replayed after ``fresh`` was
    copied into that tensor."""
    import torch

    if SMOKE["on"]:
        with torch.inference_mode():
            return fn(fresh, *args[1:])
    static = args[0].clone()
    rest = args[1:]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.inference_mode():
        for _ in range(3):
            fn(static, *rest)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.inference_mode():
        out = fn(static, *rest)
    static.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    return out


def _explain(model: Callable[..., Any], *args: Any) -> dict[str, Any]:
    import torch

    torch._dynamo.reset()
    with torch.inference_mode():
        e = torch._dynamo.explain(model)(*args)
    reasons = []
    for r in e.break_reasons:
        where = r.user_stack[-1] if r.user_stack else None
        at = f"{Path(where.filename).name}:{where.lineno}" if where else "?"
        reasons.append(f"{at} {str(r.reason).splitlines()[0][:100]}")
    ops = sum(str(n.target).startswith("rocmfix.") for gm in e.graphs for n in gm.graph.nodes)
    return {"breaks": e.graph_break_count, "graphs": e.graph_count, "ops": ops, "why": reasons}


def _routed(route: Callable[[bool], None] | None, on: bool, fn: Callable[..., Any]) -> Any:
    """``fn`` with the rewritten files' entries set (``on``) or None before each call: stock
    and patched from one model (dynamo guards on the entry, so each has its own graph)."""
    if route is None:
        return fn

    def call(*args: Any) -> Any:
        route(on)
        return fn(*args)

    return call


def _timed(
    row: dict[str, Any],
    ours: Callable[..., Any],
    stock: Callable[..., Any] | None,
    args: tuple[Any, ...],
    fresh: Any,
    ref: Any,
    ref_fresh: Any,
    out: Callable[[Any], Any],
    reps: int,
    route: Callable[[bool], None] | None = None,
    fullgraph: bool = True,
    deep: bool = False,
    probe: tuple[Any, list[str]] | None = None,
) -> None:
    """Compile ``ours`` (``fullgraph``) and ``stock`` (if given) in this process, check,
    replay a graph of the compiled one on a fresh input, time both. ``deep``: also the
    eager models, each compiled one as a CUDA graph replay (GPU time alone) and
    torch.profiler's kernel time by group, to tell host time from kernel time."""
    import compile_timing as timing  # bench/compile_timing.py
    import torch

    torch._dynamo.reset()
    t0 = time.perf_counter()
    backend = "aot_eager" if SMOKE["on"] else "inductor"
    ours_c = _routed(route, True, torch.compile(ours, fullgraph=fullgraph, backend=backend))
    with torch.inference_mode():
        row["rel_err"] = _rel(out(ours_c(*args)), ref)
    row["compile_s"] = round(time.perf_counter() - t0, 1)
    fns = {"patched": lambda: ours_c(*args)}
    if stock is not None:
        t0 = time.perf_counter()
        stock_c = _routed(route, False, torch.compile(stock, fullgraph=fullgraph,
                                                      backend=backend))  # fmt: skip
        with torch.inference_mode():
            row["stock_compiled_rel_err"] = _rel(out(stock_c(*args)), ref)
        row["compile_s_stock"] = round(time.perf_counter() - t0, 1)
        fns["stock"] = lambda: stock_c(*args)
    try:
        row["replay_compiled_rel_err"] = _rel(out(_replay(ours_c, args, fresh)), ref_fresh)
    except Exception as exc:  # noqa: BLE001 - recorded, the timing still runs
        row["replay_compiled_rel_err"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    timed = dict(fns)
    if deep and stock is not None:
        eager_ours, eager_stock = _routed(route, True, ours), _routed(route, False, stock)
        timed["eager_patched"] = lambda: eager_ours(*args)
        timed["eager_stock"] = lambda: eager_stock(*args)
    with torch.inference_mode():
        raw: dict[str, list[float]] = {}
        times = timing.ms(timed, reps, SMOKE["on"], raw)
    row["ms"] = times["patched"]
    if "stock" in times:
        row["ms_stock"] = times["stock"]
        row["ratio"] = times["patched"] / times["stock"]
        if raw:
            row["ratio_paired_quartiles"] = timing.paired(raw, "patched", "stock")
    if "eager_stock" in times:
        row["eager_ms"], row["eager_ms_stock"] = times["eager_patched"], times["eager_stock"]
        row["eager_ratio"] = times["eager_patched"] / times["eager_stock"]
    if not deep or stock is None:
        return
    try:
        graphed = timing.graph_ms(fns, reps, SMOKE["on"])
        row["graph_ms"], row["graph_ms_stock"] = graphed["patched"], graphed["stock"]
        row["graph_ratio"] = graphed["patched"] / graphed["stock"]
    except Exception as exc:  # noqa: BLE001 - recorded, the row stands
        row["graph_ratio"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    if probe is not None:
        try:
            row["op_calls"] = timing.count_calls(probe[0], probe[1], fns["patched"])
        except Exception as exc:  # noqa: BLE001
            row["op_calls"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    if HOST_PROFILE["on"] and not SMOKE["on"]:
        try:
            dump = f"{OUT_PATH[0].with_suffix('')}-{row['part']}-{{}}.pstats"
            row["host_profile"] = {
                k: timing.host_profile(fns[k], dump=dump.format(k)) for k in ("patched", "stock")
            }
        except Exception as exc:  # noqa: BLE001
            row["host_profile"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    try:
        row["kernels"] = {
            k: timing.kernels(fns[k], smoke=SMOKE["on"]) for k in ("patched", "stock")
        }
    except Exception as exc:  # noqa: BLE001
        row["kernels"] = f"{type(exc).__name__}: {str(exc)[:200]}"


def _maps(out: Any) -> Any:
    import torch

    _decoded, maps = out["one2one"]
    return torch.cat([m.flatten(1) for m in maps], 1)


def _patch_blocks(model: Any, impl: Callable[..., Any]) -> None:
    """Route this model's ``DilatedBlock.dilated_conv`` (per instance, so that a stock copy
    stays stock) through ``impl`` as rocmfix's rewrite does for GPU inputs."""

    def dilated_conv(self: Any, x: Any, dilation: int) -> Any:
        w = self.dcv.conv.weight
        p = dilation * (self.k // 2)
        return impl(x, w, dilation, p, bn=self.dcv.bn, act=self.dcv.act)

    for m in model.modules():
        if type(m).__name__ == "DilatedBlock":
            m.dilated_conv = types.MethodType(dilated_conv, m)


def _spread(model: Any) -> None:
    """Convs re-drawn with Kaiming's fan-in normal: with the default draw the random network's
    output hardly depends on the page (two random pages differ by 3e-8 relative), so neither a
    wrong conv nor a stale graph replay would show; with this one they differ by ~0.4."""
    import torch

    g = torch.Generator().manual_seed(5)
    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):
            w = torch.empty(m.weight.shape)
            torch.nn.init.kaiming_normal_(w, generator=g)
            with torch.no_grad():
                m.weight.copy_(w)


def doclayout(scheme: str, dtype: Any, reps: int, frames: bool) -> dict[str, Any]:
    import _load  # bench/_load.py: the templates as the targets import them
    import doclayout_model as dm  # bench/doclayout_model.py: the released architecture
    import torch

    stock = dm.build_model(_dev()).to(dtype)
    _spread(stock)
    ours = stock
    if scheme != "stock":
        ours = copy.deepcopy(stock)
        name = {"gemm": "dilated_conv_triton", "linear": "dilated_conv_phase"}[scheme]
        template = _load.template(name)
        _patch_blocks(ours, template.dilated_conv2d)
    g = torch.Generator(device=_dev()).manual_seed(0)
    sizes = SMALL_PAGES if SMOKE["on"] else PAGES
    pages = [torch.rand(n, 3, h, w, device=_dev(), generator=g, dtype=dtype) for n, h, w in sizes]
    # The fresh input from the same seeded generator: the models seed torch's default one
    # with 0, so a *_like draw on the GPU repeated x exactly (run of 2026-11-24).
    x, fresh = pages[0], torch.rand(pages[0].shape, device=_dev(), generator=g, dtype=dtype)
    row: dict[str, Any] = {"part": f"doclayout-{scheme}", "dtype": str(dtype), "page": sizes[0]}
    if scheme == "gemm":
        row["triton_op"] = _triton_op(template)
    with torch.inference_mode():
        ref, ref_fresh = _maps(stock(x)), _maps(stock(fresh))
        row["fresh_vs_x"] = _rel(ref_fresh, ref)  # what a stale replay would score
        if row["fresh_vs_x"] < 1e-2 and not SMOKE["on"]:  # tiny smoke pages: 4e-3
            raise RuntimeError(f"fresh input too close to x: {row['fresh_vs_x']:.1e}")
        if scheme != "stock":
            row["replay_eager_rel_err"] = _rel(_maps(_replay(ours, (x,), fresh)), ref_fresh)
    t0 = time.perf_counter()
    row.update(_explain(ours, x))
    if frames:
        row["frames"] = {str(d): _frames(ours, [(p,) for p in pages], d) for d in (None, True)}
    row["trace_s"] = round(time.perf_counter() - t0, 1)
    if scheme == "stock":  # its compiled time is each patched row's ms_stock, same process
        return row
    _print_row(row, partial=True)
    probe = (template, ["_conv", "_replay", "_plan_key"]) if scheme == "gemm" else None
    _timed(row, ours, stock, (x,), fresh, ref, ref_fresh, _maps, reps, deep=scheme == "gemm",
           probe=probe)  # fmt: skip
    return row


def _patched_embed_class() -> Any:
    """transformers' ``PatchEmbed`` as ``rocmfix apply`` rewrites it (the real transform)."""
    import _load
    import libcst as cst
    import transformers.models.qwen2_vl.modeling_qwen2_vl as modeling

    from rocmfix.registry import all_patches
    from rocmfix.rewrite import find_class

    patch = next(p for p in all_patches() if p.id == "transformers-qwen2-vl")
    module = patch.transform(cst.parse_module(Path(modeling.__file__).read_bytes()))
    cls = find_class(module, "PatchEmbed")
    assert cls is not None
    kernel = _load.template("patch_embed_gemm")
    scope = dict(vars(modeling), triton_conv3d_patchify=kernel.triton_conv3d_patchify)
    exec(compile(module.code_for_node(cls), "rocmfix patched PatchEmbed", "exec"), scope)
    return scope["PatchEmbed"]


def qwen(depth: int, reps: int) -> dict[str, Any]:
    """A Qwen2-VL vision tower, bf16: breaks of the whole tower stock vs patched (transformers'
    own: its ``grid_thw`` reads), then the patch embed alone through the full protocol."""
    import torch
    import transformers
    from transformers.models.qwen2_vl import modeling_qwen2_vl as m
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig

    dims = dict(embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4, in_channels=3)
    config = Qwen2VLVisionConfig(
        depth=depth, patch_size=14, spatial_merge_size=2, temporal_patch_size=2, **dims
    )
    torch.manual_seed(0)
    tower = m.Qwen2VisionTransformerPretrainedModel._from_config(config).to(torch.bfloat16)
    tower = tower.to(_dev()).eval()
    ours_tower = copy.deepcopy(tower)
    embed = ours_tower.patch_embed
    patched = _patched_embed_class()(14, 2, 3, 1280).to(_dev(), torch.bfloat16).eval()
    patched.load_state_dict(embed.state_dict())
    ours_tower.patch_embed = patched
    g = torch.Generator(device=_dev()).manual_seed(0)
    k = 3 * 2 * 14 * 14
    sizes = SMALL_IMAGES if SMOKE["on"] else IMAGES
    pix = [
        torch.randn(n * h * w, k, device=_dev(), generator=g, dtype=torch.bfloat16)
        for n, h, w in sizes
    ]
    grids = [torch.tensor([[1, h, w]] * n, device=_dev()) for n, h, w in sizes]
    x, fresh = pix[0], torch.randn(pix[0].shape, device=_dev(), generator=g, dtype=torch.bfloat16)
    row: dict[str, Any] = {
        "part": "qwen",
        "transformers": transformers.__version__,
        "depth": depth,
        "attn": getattr(tower.config, "_attn_implementation", None),
    }
    t0 = time.perf_counter()
    row["tower_stock"] = _explain(tower, x, grids[0])
    row["tower_patched"] = _explain(ours_tower, x, grids[0])
    stock_embed = tower.patch_embed
    with torch.inference_mode():
        ref, ref_fresh = stock_embed(x), stock_embed(fresh)
        row["fresh_vs_x"] = _rel(ref_fresh, ref)
        if row["fresh_vs_x"] < 1e-2:
            raise RuntimeError(f"fresh input too close to x: {row['fresh_vs_x']:.1e}")
        row["replay_eager_rel_err"] = _rel(_replay(patched, (x,), fresh), ref_fresh)
    row.update(_explain(patched, x))
    row["frames"] = {str(d): _frames(patched, [(p,) for p in pix], d) for d in (None, True)}
    row["frames_stock"] = {
        str(d): _frames(stock_embed, [(p,) for p in pix], d) for d in (None, True)
    }
    row["trace_s"] = round(time.perf_counter() - t0, 1)
    _print_row(row, partial=True)
    _timed(row, patched, stock_embed, (x,), fresh, ref, ref_fresh, lambda o: o, reps)
    return row


def _floats(out: Any) -> Any:
    """A model's floating outputs, flat, as one fp32 vector (models_gpu.flat's order), its
    non-finite values as 0: random fp16 weights overflow in places and RT-DETR's logits are
    -inf where masked; where stock and patched disagree on one, the error shows."""
    import models_gpu as mg
    import torch

    flat = [t.float().flatten() for t in mg.flat(out) if t.is_floating_point()]
    return torch.nan_to_num(torch.cat(flat), nan=0.0, posinf=0.0, neginf=0.0)


def _smoke_routes(name: str) -> None:
    """On the CPU (smoke) the transposed-conv entry keeps the stock op: the GEMM runs here,
    the traced one while compiling, as the entry does for GPU tensors."""
    import importlib

    import models_gpu as mg
    import torch

    # The interpreted kernel takes minutes a forward: the op's reference runs instead.
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").endswith(".rocmfix_depthwise_conv"):
            mod.dk.KERNEL = None
    if name != "det":
        return
    head = importlib.import_module(mg.OCR + ".modeling.heads.det_db_head")
    if getattr(head, "_rocmfix_conv_transpose2d", None) is None:
        return
    ct = importlib.import_module(mg.OCR + ".modeling.rocmfix_conv_transpose")

    def entry(x: Any, d: Any) -> Any:
        if not ct.handled(x, d):
            return d(x)
        gemm = ct.gemm_traced if torch.compiler.is_compiling() else ct.gemm
        return gemm(x, d.weight, d.bias)

    head._rocmfix_conv_transpose2d = entry


_ROUTES: dict[Any, Any] = {}


def depthwise(name: str, reps: int) -> dict[str, Any]:
    """One of the depthwise work's models (bench/models_gpu.py's builders and inputs, the
    files ``rocmfix apply`` rewrote): stock and patched from one model by setting the
    rewritten files' entries, traced, compiled (``fullgraph`` where the patched trace has no
    break), timed against stock compiled, replayed on a fresh input."""
    import models_gpu as mg
    import torch

    mg.DEVICE, mg.SMALL = _dev(), SMOKE["on"]
    dtype, full, small = mg.MODELS[name]
    if SMOKE["on"]:
        dtype = torch.float32
    model = mg.build(name).to(_dev(), dtype)
    if SMOKE["on"]:
        mg.use(_ROUTES, True)
        _smoke_routes(name)
    # An earlier part left the entries it shares with this one None (its stock timing last):
    # every entry seen in this process, those of this model's package.
    _ROUTES.update(mg.entries(name))
    prefix = "transformers.models." if name == "layout" else "mineru."
    routes = {k: v for k, v in _ROUTES.items() if k[0].__name__.startswith(prefix)}
    if not routes:
        raise RuntimeError("no rewritten file with a _rocmfix_ entry: run rocmfix apply first")

    def route(on: bool) -> None:
        mg.use(routes, on)

    key = "pixel_values" if name == "layout" else "input_data" if name == "formula" else "x"

    def forward(x: Any) -> Any:
        return model(**{key: x})

    g = torch.Generator(device=_dev()).manual_seed(0)
    shape = small if SMOKE["on"] else full
    x = torch.randn(shape, device=_dev(), generator=g, dtype=dtype)
    fresh = torch.randn(shape, device=_dev(), generator=g, dtype=dtype)
    row: dict[str, Any] = {"part": f"dw-{name}", "dtype": str(dtype), "input": list(shape)}
    row["routes"] = sorted(f"{m.__name__.rsplit('.', 1)[1]}.{a}" for m, a in routes)
    with torch.inference_mode():
        route(False)
        ref, ref_fresh = _floats(forward(x)), _floats(forward(fresh))
        row["fresh_vs_x"] = _rel(ref_fresh, ref)  # what a stale replay would score
        try:
            eager = _routed(route, True, forward)
            row["replay_eager_rel_err"] = _rel(_floats(_replay(eager, (x,), fresh)), ref_fresh)
        except Exception as exc:  # noqa: BLE001 - recorded, the compiled rows still run
            row["replay_eager_rel_err"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    t0 = time.perf_counter()
    route(False)
    row["stock_trace"] = _explain(forward, x)
    route(True)
    row.update(_explain(forward, x))
    row["trace_s"] = round(time.perf_counter() - t0, 1)
    _print_row(row, partial=True)
    dropped = next(m for n, m in sys.modules.items() if n.endswith(".rocmfix_depthwise_conv"))
    row["triton_op"] = _triton_op(dropped)
    _timed(row, forward, forward, (x,), fresh, ref, ref_fresh, _floats, reps, route=route,
           fullgraph=row["breaks"] == 0 and row["stock_trace"]["breaks"] == 0, deep=True,
           probe=(dropped, ["_op_conv", "prepare_launch", "conv"]))  # fmt: skip
    return row


def _triton_op(template: Any) -> bool | None:
    import _load

    return _load.triton_op(template)


def _print_row(r: dict[str, Any], partial: bool = False) -> None:
    if "error" in r:
        print(f"{r['part']:18} ERROR: {r['error'].splitlines()[-1][:60]}", flush=True)
        return
    frames = "/".join(str(v) for v in r.get("frames", {}).values())
    line = f"{r['part']:18} brk {r.get('breaks')} ops {r.get('ops')} frames {frames}"
    if "triton_op" in r:
        line += f" triton_op {r['triton_op']}"
    if "frames_stock" in r:
        line += " (stock " + "/".join(str(v) for v in r["frames_stock"].values()) + ")"
    if "tower_stock" in r:
        line += f" tower brk {r['tower_stock']['breaks']}/{r['tower_patched']['breaks']}"
    if partial or "ms" not in r:
        print(f"{line} (traced in {r.get('trace_s')} s; compiling)", flush=True)
        return
    ms = f"{r['ms']:.3f} ms"
    if "ratio" in r:
        ms += f" vs {r['ms_stock']:.3f} = {r['ratio']:.3f}x"
        if "ratio_paired_quartiles" in r:
            ms += " (paired {:.3f} {:.3f} {:.3f})".format(*r["ratio_paired_quartiles"])
    replay = r.get("replay_compiled_rel_err")
    replay = f"{replay:.1e}" if isinstance(replay, float) else replay
    print(f"{line} {ms} err {r['rel_err']:.1e} replay {replay}", flush=True)
    if "eager_ratio" in r:
        print(f"{'':18} eager {r['eager_ms']:.3f} vs {r['eager_ms_stock']:.3f} = "
              f"{r['eager_ratio']:.3f}x", flush=True)  # fmt: skip
    if isinstance(r.get("graph_ratio"), float):
        print(f"{'':18} graph replay {r['graph_ms']:.3f} vs {r['graph_ms_stock']:.3f} = "
              f"{r['graph_ratio']:.3f}x (GPU time alone)", flush=True)  # fmt: skip
    elif "graph_ratio" in r:
        print(f"{'':18} graph replay: {r['graph_ratio']}", flush=True)
    if "op_calls" in r:
        print(f"{'':18} op calls/fwd: {r['op_calls']}", flush=True)
    for label, k in (r.get("kernels") or {}).items() if isinstance(r.get("kernels"), dict) else ():
        if k:
            groups = " ".join(f"{g} {us:.0f}" for g, us in k["us_per_forward"].items())
            print(f"{'':18} {label} kernels us/fwd: {groups} (total {k['total_us']:.0f}, "
                  f"{k['kernels_per_forward']:.0f} kernels)", flush=True)  # fmt: skip
            print(f"{'':18} {label} host ops [calls, cpu us]/fwd: {k['host_ops']}", flush=True)
    profiles = r.get("host_profile")
    for label, h in profiles.items() if isinstance(profiles, dict) else ():
        print(f"{'':18} {label} cProfile us/fwd {h['total_us']:.0f}; [fn, calls, own, cum]:")
        for item in h["top"][:14]:
            print(f"{'':20} {item}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--parts", default=",".join(p for p in PARTS if not p.startswith("dw-")))
    parser.add_argument("--out", type=Path, default=Path("compile_gpu.json"))
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--depth", type=int, default=4, help="vision tower blocks")
    parser.add_argument("--cache", type=Path, default=ROOT.parent / "compile_gpu-inductor-cache")
    parser.add_argument("--no-frames-for", default="", help="parts not to count frames of")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny inputs, aot_eager")
    parser.add_argument("--site", type=Path, help="smoke: a patched site-packages, searched last")
    parser.add_argument("--host-profile", action="store_true", help="cProfile compiled forwards")
    args = parser.parse_args()
    SMOKE["on"] = args.smoke
    HOST_PROFILE["on"] = args.host_profile
    OUT_PATH[0] = args.out
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        if args.site:  # last: a test env's site holds a fake torch's metadata
            sys.path.append(str(args.site))
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}; known: {', '.join(PARTS)}")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(args.cache))
    sys.path.insert(0, str(ROOT / "bench"))
    sys.path.insert(0, str(ROOT))
    if args.smoke and any(p.startswith("dw-") for p in parts):
        import models_gpu as mg

        sys.meta_path.insert(0, mg.Finder())  # the rewritten files' GPU guard read as true
    import torch

    cfg = torch._dynamo.config
    cfg.recompile_limit = 64  # stock and patched share forward code objects
    cfg.accumulated_recompile_limit = 4096
    if hasattr(cfg, "automatic_dynamic_local_pgo"):
        cfg.automatic_dynamic_local_pgo = False  # counts must not depend on an earlier call
    dtype = getattr(torch, args.dtype)
    doc: dict[str, Any] = {"rows": {}}
    if args.out.exists():
        doc = json.loads(args.out.read_text())
    doc["meta"] = {
        "device": "cpu (smoke)" if args.smoke else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": getattr(sys.modules.get("triton"), "__version__", None),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "inductor_cache": os.environ["TORCHINDUCTOR_CACHE_DIR"],
    }
    print(json.dumps(doc["meta"]), flush=True)
    failed = False
    for part in parts:
        t0 = time.perf_counter()
        try:
            if part == "qwen":
                row = qwen(args.depth, args.reps)
            elif part.startswith("dw-"):
                row = depthwise(part.removeprefix("dw-"), args.reps)
            else:
                frames = part not in args.no_frames_for.split(",")
                row = doclayout(part.removeprefix("doclayout-"), dtype, args.reps, frames)
        except Exception:  # noqa: BLE001 - one failure must not hide the other rows
            failed = True
            row = {"part": part, "error": traceback.format_exc()[-3000:]}
            print(row["error"], file=sys.stderr, flush=True)
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        from torch._dynamo.utils import counters

        row["fxgraph_cache"] = {k: v for k, v in counters["inductor"].items() if "fxgraph" in k}
        counters.clear()
        doc["rows"][part] = row
        args.out.write_text(json.dumps(doc, indent=1, default=str))
        _print_row(row)
        print(f"  ({part}: {row['wall_s']} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
