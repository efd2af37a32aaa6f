"""Graph mode on a GPU: the patched models under ``torch.compile`` against the compiled stock.

Parts, each independent (``--parts``, comma-separated, default all, in this order), each
printing its row as soon as it is done and rewriting the JSON:

* ``doclayout-stock``, ``doclayout-gemm``, ``doclayout-linear``: DocLayout-YOLO (the released
  yolov10m-doclayout architecture, random weights, the installed ``doclayout-yolo``), stock or
  with ``DilatedBlock.dilated_conv`` routed through a scheme's template (``gemm``: the Triton
  kernel as ``rocmfix::dilated_conv2d``; ``linear``: the phase split, aten ops);
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

Compiled code persists in ``--cache`` (TORCHINDUCTOR_CACHE_DIR, default a folder beside the
checkout), so a second call on the same machine skips Inductor's code generation.

    python bench/compile_gpu.py [--parts doclayout-stock,doclayout-gemm] [--out F.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
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
PARTS = ("doclayout-stock", "doclayout-gemm", "qwen", "doclayout-linear")
# --smoke: the same code on the CPU with tiny inputs and the aot_eager backend (no timing, no
# graph capture), to catch a typo before a GPU call.
SMOKE = {"on": False}
SMALL_PAGES = ((1, 96, 64), (1, 64, 64), (2, 64, 96))
SMALL_IMAGES = ((2, 4, 6), (1, 4, 6), (3, 6, 4))


def _dev() -> str:
    return "cpu" if SMOKE["on"] else "cuda"


def _rel(a: Any, b: Any) -> float:
    return float(((a.double() - b.double()).norm() / b.double().norm()).item())


def _ms(fns: dict[str, Callable[[], Any]], reps: int) -> dict[str, float]:
    """Median ms per call of each, alternating so clocks and neighbours hit all alike."""
    import torch

    if SMOKE["on"]:
        return {k: 1.0 for k in fns}
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        for _ in range(3):
            fn()
    for _ in range(reps):
        for key, fn in fns.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times[key].append(start.elapsed_time(end))
    return {k: statistics.median(v) for k, v in times.items()}


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
) -> None:
    """Compile ``ours`` with fullgraph=True and ``stock`` (if given) in this process, check,
    replay a graph of the compiled one on a fresh input, time both."""
    import torch

    torch._dynamo.reset()
    t0 = time.perf_counter()
    backend = "aot_eager" if SMOKE["on"] else "inductor"
    ours_c = torch.compile(ours, fullgraph=True, backend=backend)
    with torch.inference_mode():
        row["rel_err"] = _rel(out(ours_c(*args)), ref)
    row["compile_s"] = round(time.perf_counter() - t0, 1)
    fns = {"patched": lambda: ours_c(*args)}
    if stock is not None:
        t0 = time.perf_counter()
        stock_c = torch.compile(stock, backend=backend)
        with torch.inference_mode():
            row["stock_compiled_rel_err"] = _rel(out(stock_c(*args)), ref)
        row["compile_s_stock"] = round(time.perf_counter() - t0, 1)
        fns["stock"] = lambda: stock_c(*args)
    try:
        row["replay_compiled_rel_err"] = _rel(out(_replay(ours_c, args, fresh)), ref_fresh)
    except Exception as exc:  # noqa: BLE001 - recorded, the timing still runs
        row["replay_compiled_rel_err"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    with torch.inference_mode():
        times = _ms(fns, reps)
    row["ms"] = times["patched"]
    if "stock" in times:
        row["ms_stock"] = times["stock"]
        row["ratio"] = times["patched"] / times["stock"]


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
        _patch_blocks(ours, _load.template(name).dilated_conv2d)
    g = torch.Generator(device=_dev()).manual_seed(0)
    sizes = SMALL_PAGES if SMOKE["on"] else PAGES
    pages = [torch.rand(n, 3, h, w, device=_dev(), generator=g, dtype=dtype) for n, h, w in sizes]
    # The fresh input from the same seeded generator: the models seed torch's default one
    # with 0, so a *_like draw on the GPU repeated x exactly (run of 2026-11-24).
    x, fresh = pages[0], torch.rand(pages[0].shape, device=_dev(), generator=g, dtype=dtype)
    row: dict[str, Any] = {"part": f"doclayout-{scheme}", "dtype": str(dtype), "page": sizes[0]}
    with torch.inference_mode():
        ref, ref_fresh = _maps(stock(x)), _maps(stock(fresh))
        row["fresh_vs_x"] = _rel(ref_fresh, ref)  # what a stale replay would score
        if row["fresh_vs_x"] < 1e-2:
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
    _timed(row, ours, stock, (x,), fresh, ref, ref_fresh, _maps, reps)
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


def _print_row(r: dict[str, Any], partial: bool = False) -> None:
    if "error" in r:
        print(f"{r['part']:18} ERROR: {r['error'].splitlines()[-1][:60]}", flush=True)
        return
    frames = "/".join(str(v) for v in r.get("frames", {}).values())
    line = f"{r['part']:18} brk {r.get('breaks')} ops {r.get('ops')} frames {frames}"
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
    replay = r.get("replay_compiled_rel_err")
    replay = f"{replay:.1e}" if isinstance(replay, float) else replay
    print(f"{line} {ms} err {r['rel_err']:.1e} replay {replay}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--out", type=Path, default=Path("compile_gpu.json"))
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--depth", type=int, default=4, help="vision tower blocks")
    parser.add_argument("--cache", type=Path, default=ROOT.parent / "compile_gpu-inductor-cache")
    parser.add_argument("--no-frames-for", default="", help="parts not to count frames of")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny inputs, aot_eager")
    args = parser.parse_args()
    SMOKE["on"] = args.smoke
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}; known: {', '.join(PARTS)}")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(args.cache))
    sys.path.insert(0, str(ROOT / "bench"))
    sys.path.insert(0, str(ROOT))
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
