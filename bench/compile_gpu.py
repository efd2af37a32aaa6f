"""Graph mode on a GPU: the patched models under ``torch.compile`` against the compiled stock.

For DocLayout-YOLO (the released yolov10m-doclayout architecture, random weights, the
installed ``doclayout-yolo``) under each dilated-conv scheme (``gemm``: the Triton kernel as
``rocmfix::dilated_conv2d``; ``linear``: the phase split), and for a Qwen2-VL-2B-sized vision
patch embed (the installed transformers' ``PatchEmbed`` rewritten by rocmfix's own transform,
``rocmfix::patch_embed_gemm``):

* graph breaks (``torch._dynamo.explain``) and a ``fullgraph=True`` compile;
* ms per forward, compiled patched vs compiled stock in the same process (CUDA events,
  alternating, median);
* frames compiled over three page sizes (image counts for the patch embed), default and
  ``dynamic=True``: the patched model may not compile more than the stock one;
* CUDA graph replay: the patched eager model captured with ``torch.cuda.graph`` and the
  compiled one under ``mode="reduce-overhead"``, each run on a fresh input and compared with
  the stock eager output on that input.

    python bench/compile_gpu.py [--out compile_gpu.json] [--dtype float32] [--reps 30]

The table comes last on stdout; the JSON holds every figure.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _load  # bench/_load.py: the templates as the targets import them
import doclayout_model as dm  # bench/doclayout_model.py: the model and the monkeypatch
import torch
from torch._dynamo.testing import CompileCounterWithBackend

PAGES = ((1, 1024, 768), (1, 1280, 928), (2, 1024, 1024))
IMAGES = ((1, 36, 52), (2, 36, 52), (3, 52, 36))  # (images, grid h, grid w) of 14-px patches


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _ms(fns: dict[str, Callable[[], Any]], reps: int) -> dict[str, float]:
    """Median ms per call of each, alternating so clocks and neighbours hit all alike."""
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


def _frames(model: Callable[..., Any], inputs: list[Any], dynamic: bool | None) -> int:
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, backend=counter, dynamic=dynamic)
    with torch.inference_mode():
        for x in inputs:
            compiled(x)
    return int(counter.frame_count)


def _graph_replay(model: Callable[..., Any], x: torch.Tensor, fresh: torch.Tensor) -> Any:
    """The model captured once on ``x``, replayed after ``fresh`` was copied in."""
    static = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.inference_mode():
        for _ in range(2):
            model(static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.inference_mode():
        out = model(static)
    static.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    return out


def _maps(out: Any) -> torch.Tensor:
    _decoded, maps = out["one2one"]
    return torch.cat([m.flatten(1) for m in maps], 1)


def _patch_blocks(model: torch.nn.Module, impl: Callable[..., torch.Tensor]) -> None:
    """Route this model's ``DilatedBlock.dilated_conv`` (per instance, so that a stock copy
    stays stock) through ``impl`` as rocmfix's rewrite does for GPU inputs."""

    def dilated_conv(self: Any, x: torch.Tensor, dilation: int) -> torch.Tensor:
        w = self.dcv.conv.weight
        p = dilation * (self.k // 2)
        return impl(x, w, dilation, p, bn=self.dcv.bn, act=self.dcv.act)

    for m in model.modules():
        if type(m).__name__ == "DilatedBlock":
            m.dilated_conv = types.MethodType(dilated_conv, m)


def doclayout(scheme: str, dtype: torch.dtype, reps: int) -> dict[str, Any]:
    name = {"gemm": "dilated_conv_triton", "linear": "dilated_conv_phase"}[scheme]
    stock = dm.build_model("cuda").to(dtype)
    ours = copy.deepcopy(stock)
    _patch_blocks(ours, _load.template(name).dilated_conv2d)
    g = torch.Generator(device="cuda").manual_seed(0)
    pages = [torch.rand(n, 3, h, w, device="cuda", generator=g, dtype=dtype) for n, h, w in PAGES]
    x, fresh = pages[1], torch.rand_like(pages[1])
    row: dict[str, Any] = {"model": f"doclayout-yolo {scheme}", "dtype": str(dtype)}
    with torch.inference_mode():
        ref, ref_fresh = _maps(stock(x)), _maps(stock(fresh))
        torch._dynamo.reset()
        explained = torch._dynamo.explain(ours)(x)
    row["breaks"] = explained.graph_break_count
    row["ops"] = sum(
        str(n.target).startswith("rocmfix.") for gm in explained.graphs for n in gm.graph.nodes
    )
    row["frames"] = {str(d): _frames(ours, pages, d) for d in (None, True)}
    row["frames_stock"] = {str(d): _frames(stock, pages, d) for d in (None, True)}
    row["graph_replay_rel_err"] = _rel(_maps(_graph_replay(ours, x, fresh)), ref_fresh)
    torch._dynamo.reset()
    replayed = torch.compile(ours, mode="reduce-overhead", fullgraph=True)
    with torch.inference_mode():
        for _ in range(3):
            replayed(x)
        row["reduce_overhead_rel_err"] = _rel(_maps(replayed(fresh)), ref_fresh)
    torch._dynamo.reset()
    ours_c = torch.compile(ours, fullgraph=True)
    stock_c = torch.compile(stock)
    with torch.inference_mode():
        row["rel_err"] = _rel(_maps(ours_c(x)), ref)
        times = _ms({"patched": lambda: ours_c(x), "stock": lambda: stock_c(x)}, reps)
    row.update(
        ms=times["patched"], ms_stock=times["stock"], ratio=times["patched"] / times["stock"]
    )
    return row


def qwen_patch_embed(dtype: torch.dtype, reps: int) -> dict[str, Any]:
    """Qwen2-VL-2B's patch embed (3 -> 1280, 2x14x14), the class as rocmfix rewrites it."""
    import libcst as cst
    import transformers.models.qwen2_vl.modeling_qwen2_vl as modeling

    from rocmfix.registry import all_patches
    from rocmfix.rewrite import find_class

    patch = next(p for p in all_patches() if p.id == "transformers-qwen2-vl")
    source = Path(modeling.__file__).read_bytes()
    module = patch.transform(cst.parse_module(source))
    cls = find_class(module, "PatchEmbed")
    assert cls is not None
    kernel = _load.template("patch_embed_gemm")
    scope = dict(vars(modeling), triton_conv3d_patchify=kernel.triton_conv3d_patchify)
    exec(compile(module.code_for_node(cls), "patched PatchEmbed", "exec"), scope)
    stock = modeling.PatchEmbed(14, 2, 3, 1280).to("cuda", dtype).eval()
    ours = scope["PatchEmbed"](14, 2, 3, 1280).to("cuda", dtype).eval()
    ours.load_state_dict(stock.state_dict())
    g = torch.Generator(device="cuda").manual_seed(0)
    k = 3 * 2 * 14 * 14
    inputs = [
        torch.randn(n * h * w, k, device="cuda", generator=g, dtype=dtype) for n, h, w in IMAGES
    ]
    x, fresh = inputs[1], torch.randn_like(inputs[1])
    row: dict[str, Any] = {"model": "qwen2-vl patch embed gemm", "dtype": str(dtype)}
    with torch.inference_mode():
        ref, ref_fresh = stock(x), stock(fresh)
        explained = torch._dynamo.explain(ours)(x)
    row["breaks"] = explained.graph_break_count
    row["ops"] = sum(
        str(n.target).startswith("rocmfix.") for gm in explained.graphs for n in gm.graph.nodes
    )
    row["frames"] = {str(d): _frames(ours, inputs, d) for d in (None, True)}
    row["frames_stock"] = {str(d): _frames(stock, inputs, d) for d in (None, True)}
    row["graph_replay_rel_err"] = _rel(_graph_replay(ours, x, fresh), ref_fresh)
    torch._dynamo.reset()
    ours_c = torch.compile(ours, fullgraph=True)
    stock_c = torch.compile(stock)
    with torch.inference_mode():
        row["rel_err"] = _rel(ours_c(x), ref)
        times = _ms({"patched": lambda: ours_c(x), "stock": lambda: stock_c(x)}, reps)
    row.update(
        ms=times["patched"], ms_stock=times["stock"], ratio=times["patched"] / times["stock"]
    )
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("compile_gpu.json"))
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    rows: list[dict[str, Any]] = []
    jobs: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("doclayout gemm", lambda: doclayout("gemm", dtype, args.reps)),
        ("doclayout linear", lambda: doclayout("linear", dtype, args.reps)),
        ("qwen2-vl", lambda: qwen_patch_embed(torch.bfloat16, args.reps)),
    ]
    for name, job in jobs:
        try:
            rows.append(job())
        except Exception:  # noqa: BLE001 - one failure must not hide the other rows
            rows.append({"model": name, "error": traceback.format_exc()[-2000:]})
            print(rows[-1]["error"], file=sys.stderr)
    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": getattr(sys.modules.get("triton"), "__version__", None),
    }
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(json.dumps(meta))
    head = f"{'model':28} {'brk':>3} {'ops':>3} {'ms':>8} {'stock':>8} {'ratio':>6} "
    print(head + f"{'frames':>9} {'stock':>9} {'err':>8} {'replay':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:28} ERROR (see stderr)")
            continue
        frames = "/".join(str(v) for v in r["frames"].values())
        stock = "/".join(str(v) for v in r["frames_stock"].values())
        print(
            f"{r['model']:28} {r['breaks']:>3} {r['ops']:>3} {r['ms']:>8.3f} "
            f"{r['ms_stock']:>8.3f} {r['ratio']:>6.3f} {frames:>9} {stock:>9} "
            f"{r['rel_err']:>8.1e} {r['graph_replay_rel_err']:>8.1e}"
        )
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
