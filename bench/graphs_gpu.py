"""Graph replay as a user runs it: MinerU's stock predictor files against the files
`rocmfix apply` rewrote for graphs (issue 41), in alternating fresh processes on a GPU.

    python bench/graphs_gpu.py --stock STOCK_SITE --patched PATCHED_SITE --out DIR

STOCK_SITE and PATCHED_SITE each hold an installed ``mineru`` (4.0.x) and ``transformers``
(5.3+); the patched one has ``mineru-ocr-{det,rec,cls}-graphs``, ``mineru-layout-graphs``,
``transformers-pp-doclayout-v2-graphs`` (``transformers-eager-mask-graphs`` too on 5.3.0-5.20.1)
and ``mineru-formula-encoder-graphs`` applied
(bench/graphs_gpu.sh does both). Each process builds one model from that site's own code
(random weights, seed 0, so both sides hold the same model):

- det/rec: PP-OCRv6 det tiny or rec small from the arch config inside that mineru, called the
  way the predictor's rewritten line does: ``self.net(inp)`` in the stock file,
  ``_rocmfix_graph_forward(self.net, inp)`` (the name the patched file imported) in the
  patched one;
- layout: the whole PP-DocLayoutV2 detector (transformers' default config, 25 classes), called
  as MinerU's ``batch_predict`` does, ``self.model(pixel_values=...)`` under
  ``torch.no_grad()``, through the runner the patched ``pp_doclayoutv2.py`` imports (loaded
  by path: that file's own imports pull in torchvision); the patched transformers file keeps
  its host values on the device, which is what lets the whole forward be captured;
- formula: PP-FormulaNet_plus-M's encoder (``PPHGNetV2_B6_Formula``, fp16, from the arch
  config in that mineru), called as ``BaseModel.forward``'s line calls its backbone:
  ``self.backbone(x)`` stock, ``_rocmfix_graph_forward(self.backbone, x)`` patched.

Under ``torch.inference_mode()`` (layout: ``torch.no_grad()``): 3 warm-up calls (the patched
side captures at its 3rd, the runner's default ``MIN_SEEN``), then ``--reps`` forwards, each
timed on the host between two ``torch.cuda.synchronize()`` (MinerU copies every output to
the host next). The patched side also checks the replay against the eager forward of the same
files on a fresh input, bit for bit (NaN payloads included: fp16 random weights overflow),
and reports the graph memory held (``rocmfix_graphs.held_bytes``).
``--pairs`` pairs per configuration, stock first in even pairs and patched first in odd ones.

``--interleave`` feeds det and rec several shapes in turn (40 calls each), checks every
output against eager bit for bit, and reports the graphs kept and memory held, with the
default caps and with room for only 2 graphs; then rec batches of 3-6 rows at one width (the
runner pads the short ones to 6 and replays the 6-row graph), each compared with eager on the
same rows.

``--memory`` feeds det and rec ``--pages`` synthetic pages through the patched predictors'
runner in one process: a page is det at one of 4 page sizes and rec at 8 batches of 6 lines,
their widths drawn from 14 (more shapes than the runner's 8 graphs a model, seen often
enough to be captured), seeded; after every page ``torch.cuda.memory_reserved``,
``memory_allocated`` and each model's graphs and held bytes, printed every 20 pages as they
come. Flat after the first pages is the caps at work.

``--check`` instead runs the fallback checks on the GPU in one process: a forward that syncs
with the host (its capture raises), grad mode, autocast, a model in training; each must give
eager's output and leave CUDA usable.

Full numbers go to ``DIR/graphs.json``; a short table is printed last.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _pages import ARCH, OCR, randomized

DEVICE = "cuda"
# (name, model, input shape, dtype): what MinerU 4.0 feeds det and rec on a GPU.
CONFIGS = {
    "det-960x672": ("det", (1, 3, 960, 672), "float32"),
    "det-736x960": ("det", (1, 3, 736, 960), "float32"),
    "rec-6x320": ("rec", (6, 3, 48, 320), "float16"),
    "rec-6x1280": ("rec", (6, 3, 48, 1280), "float16"),
    "layout-800": ("layout", (1, 3, 800, 800), "float32"),
    "formula-8x384": ("formula", (8, 3, 384, 384), "float16"),
}
LAYOUT_RUNNER = "mineru/model/layout/rocmfix_graphs.py"


def _mineru(root: str) -> None:
    """``mineru`` from ``root`` without its package __init__ (which imports the whole
    document stack); docvortex, which the predictors' utility module imports, stubbed."""
    stub = types.ModuleType("mineru")
    stub.__path__ = [os.path.join(root, "mineru")]
    sys.modules["mineru"] = stub

    class Anything(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            return lambda *a, **k: None

    if "docvortex" in sys.modules or importlib.util.find_spec("docvortex") is not None:
        return
    for name in ("docvortex", "docvortex.image", "docvortex.geometry", "docvortex.schema"):
        module = Anything(name)
        module.__path__ = []  # type: ignore[attr-defined]
        sys.modules[name] = module


def build(root: str, model: str, dtype: Any) -> Any:
    import torch
    import yaml

    _mineru(root)
    base = importlib.import_module(OCR + ".modeling.architectures.base_model")
    resources = os.path.join(root, *OCR.split("."), "utils", "resources", "arch_config.yaml")
    with open(resources) as f:
        arch = yaml.safe_load(f)
    torch.manual_seed(0)
    net = randomized(base.BaseModel(copy.deepcopy(arch[ARCH[model]])))
    for m in net.modules():
        if hasattr(m, "rep"):
            m.rep()
    return net.eval().to(DEVICE, dtype)


def layout(root: str, side: str) -> tuple[Any, Any, Any, Any]:
    """(model, call, runner, the model whose stats count) for the whole PP-DocLayoutV2."""
    import torch

    sys.path.insert(0, root)  # this side's transformers, stock or patched
    from transformers import PPDocLayoutV2Config, PPDocLayoutV2ForObjectDetection
    from transformers.models.pp_doclayout_v2 import modeling_pp_doclayout_v2 as modeling

    assert modeling.__file__.startswith(root), modeling.__file__
    with open(os.path.join(root, "mineru/model/layout/pp_doclayoutv2.py")) as f:
        routed = "_rocmfix_graph_forward(self.model, pixel_values=" in f.read()
    kept = hasattr(modeling, "_rocmfix_graph_constant")
    assert routed == kept == (side == "patched"), (routed, kept, side)
    config = PPDocLayoutV2Config()
    config.num_labels = 25
    config.class_thresholds = [0.5] * 25
    config.class_order = list(range(25))
    torch.manual_seed(0)
    net = PPDocLayoutV2ForObjectDetection(config)
    randomized(net)
    net = net.eval().to(DEVICE)
    if side == "stock":
        return net, lambda net, x: net(pixel_values=x), None, net
    spec = importlib.util.spec_from_file_location(
        "mineru.model.layout.rocmfix_graphs", os.path.join(root, LAYOUT_RUNNER)
    )
    assert spec is not None and spec.loader is not None
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    return net, lambda net, x: runner.forward(net, pixel_values=x), runner, net


def formula(root: str, side: str, dtype: Any) -> tuple[Any, Any, Any, Any]:
    """(model, call, runner, the model whose stats count) for PP-FormulaNet_plus-M's encoder,
    called as BaseModel.forward's rewritten line calls it (the head, its autoregressive
    decoder, is not run: it stays eager)."""
    import torch
    import yaml

    _mineru(root)
    base = importlib.import_module(OCR + ".modeling.architectures.base_model")
    routed = getattr(base, "_rocmfix_graph_forward", None)
    assert (routed is not None) == (side == "patched"), side
    resources = os.path.join(root, *OCR.split("."), "utils", "resources")
    with open(os.path.join(resources, "pp_formulanet_arch_config.yaml")) as f:
        arch = yaml.safe_load(f)["PP-FormulaNet_plus-M"]["Architecture"]
    torch.manual_seed(0)
    encoder = base.BaseModel(copy.deepcopy(arch)).backbone
    randomized(encoder)
    encoder = encoder.eval().to(DEVICE, dtype)
    if routed is None:
        return encoder, lambda net, x: net(x), None, encoder
    return encoder, routed, sys.modules[routed.__module__], encoder


def _bits(a: Any, b: Any) -> bool:
    """The same bits (NaN payloads too), where torch.equal calls NaN unequal to itself."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point:
        a, b = a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
    return bool(torch.equal(a, b))


def _flat(out: Any) -> list[Any]:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for k in sorted(out) for t in _flat(out[k])]
    if isinstance(out, list | tuple):
        return [t for o in out for t in _flat(o)]
    return []


def worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    model, shape, dtype_name = CONFIGS[args.config]
    dtype = getattr(torch, dtype_name)
    root = args.stock if args.side == "stock" else args.patched
    if model == "layout":
        net, call, runner, counted = layout(root, args.side)
    elif model == "formula":
        net, call, runner, counted = formula(root, args.side, dtype)
    else:
        net = counted = build(root, model, dtype)
        predictor = importlib.import_module(f"{OCR}.infer.predict_{model}")
        graphed = getattr(predictor, "_rocmfix_graph_forward", None)
        if args.side == "patched":
            assert graphed is not None, "the patched file did not import its runner"
            call, runner = graphed, sys.modules[graphed.__module__]
        else:
            assert graphed is None, "the stock file holds rocmfix's rewrite"
            call = lambda net, inp: net(inp)  # noqa: E731 - the stock line: self.net(inp)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=gen).to(DEVICE, dtype)
    times = []
    # MinerU calls its layout model under no_grad, the others under inference_mode.
    mode = torch.no_grad if model == "layout" else torch.inference_mode
    with mode():
        for _ in range(3):
            call(net, x)
        for _ in range(args.reps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            call(net, x)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e3)
        out: dict[str, Any] = {"side": args.side, "config": args.config, "ms": times}
        if args.side == "patched":
            fresh = torch.randn(shape, generator=gen).to(DEVICE, dtype)
            replayed = [t.clone() for t in _flat(call(net, fresh))]
            # The eager forward of the same files: every copy of the runner off (the patched
            # BaseModel and transformers' backbone call route through copies of their own).
            copies = {runner, *(m for n, m in sys.modules.items() if n.endswith(".rocmfix_graphs"))}
            for copy_ in copies:
                copy_.ENABLED = False
            eager = _flat(call(net, fresh))
            for copy_ in copies:
                copy_.ENABLED = True
            assert replayed and len(replayed) == len(eager)
            out["identical"] = all(_bits(a, b) for a, b in zip(replayed, eager, strict=True))
            out["max_diff"] = max(
                (a.double() - b.double()).abs().nan_to_num(nan=0.0).max().item()
                for a, b in zip(replayed, eager, strict=True)
            )
            out["stats"] = runner.stats(counted)
            out["held_mib"] = runner.held_bytes(counted) / 2**20
    return out


def check(args: argparse.Namespace) -> dict[str, Any]:
    """The fallbacks on a GPU: each call must return eager's output and CUDA stay usable."""
    import warnings

    import torch

    net = build(args.patched, "det", torch.float32)
    predictor = importlib.import_module(f"{OCR}.infer.predict_det")
    call = predictor._rocmfix_graph_forward
    runner = sys.modules[call.__module__]

    class Syncs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.lin(x)
            return y * float(y.abs().max().item() > -1)  # a host sync: capture refuses it

    results: dict[str, Any] = {}
    x = torch.randn(1, 3, 64, 96, device="cuda")
    syncs = Syncs().cuda().eval()
    small = torch.randn(4, 8, device="cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("error")  # as under python -W error
        with torch.inference_mode():
            ok = all(torch.equal(call(syncs, small), syncs(small)) for _ in range(4))
            results["capture raises"] = {"equal": ok, "stats": runner.stats(syncs)}
        with torch.no_grad():
            results["no_grad"] = torch.equal(call(net, x)["maps"], net(x)["maps"])
        ok = torch.equal(call(net, x)["maps"], net(x)["maps"])  # grad mode
        results["grad mode"] = ok
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16):
            results["autocast"] = torch.equal(call(net, x)["maps"], net(x)["maps"])
        net.train()
        with torch.inference_mode():
            results["training"] = torch.equal(call(net, x)["maps"], net(x)["maps"])
        net.eval()
        with torch.inference_mode():
            ok = all(torch.equal(call(net, x)["maps"], net(x)["maps"]) for _ in range(4))
        results["replay after all that"] = ok
        results["det stats"] = runner.stats(net)
    results["warnings"] = [str(w.message) for w in caught]
    return results


def interleave(args: argparse.Namespace) -> dict[str, Any]:
    """Several shapes a model sees in turn, as a document gives them: every call's output
    against the eager forward of the same input, bit for bit; with the default caps, then
    with room for 2 graphs (so graphs are dropped and captured again, their pool shared)."""
    import torch

    _mineru(args.patched)
    predictor = importlib.import_module(f"{OCR}.infer.predict_det")
    call = predictor._rocmfix_graph_forward
    runner = sys.modules[call.__module__]
    shapes = {
        "det": [(1, 3, h, w) for h, w in ((960, 672), (736, 960), (672, 960), (960, 704))],
        "rec": [(6, 3, 48, w) for w in (320, 640, 960, 1280, 480)],
    }
    found: dict[str, Any] = {}
    for cap in (runner.MAX_GRAPHS, 2):
        runner.MAX_GRAPHS = cap
        for model, dtype in (("det", torch.float32), ("rec", torch.float16)):
            net = build(args.patched, model, dtype)
            gen = torch.Generator().manual_seed(3)
            same, times = [], []
            with torch.inference_mode():
                for i in range(40):
                    shape = shapes[model][i % len(shapes[model])]
                    x = torch.randn(shape, generator=gen).to(DEVICE, dtype)
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    got = [t.clone() for t in _flat(call(net, x))]
                    torch.cuda.synchronize()
                    times.append((time.perf_counter() - start) * 1e3)
                    want = _flat(net(x))
                    same.append(all(torch.equal(a, b) for a, b in zip(got, want, strict=True)))
            found[f"{model} max_graphs={cap}"] = {
                "identical": all(same),
                "stats": runner.stats(net),
                "held_mib": runner.held_bytes(net) / 2**20,
                "median ms, last 20": statistics.median(times[20:]),
            }
    runner.MAX_GRAPHS = 8
    try:
        found["rec, short batches padded to 6"] = padded(args, runner, call, torch.float16)
    except Exception as exc:  # noqa: BLE001 - the runs above keep their results
        found["rec, short batches padded to 6"] = {"error": f"{type(exc).__name__}: {exc}"}
    return found


def padded(args: argparse.Namespace, runner: Any, call: Any, dtype: Any) -> dict[str, Any]:
    """rec batches of 3-6 rows at one width: the runner pads the short ones to 6 rows and
    replays the 6-row graph; each call's rows against eager's on the same rows."""
    import torch

    net = build(args.patched, "rec", dtype)
    gen = torch.Generator().manual_seed(4)
    same, diffs = [], []
    with torch.inference_mode():
        for rows in (6, 6, 4, 5, 3, 6, 4, 5, 3, 4) * 2:
            x = torch.randn(rows, 3, 48, 320, generator=gen).to(DEVICE, dtype)
            got = [t.clone() for t in _flat(call(net, x))]
            want = _flat(net(x))
            same.append(all(torch.equal(a, b) for a, b in zip(got, want, strict=True)))
            diffs.append(max((a.float() - b.float()).abs().max().item()
                             for a, b in zip(got, want, strict=True)))  # fmt: skip
    return {"identical": sum(same), "calls": len(same), "max diff": max(diffs),
            "stats": runner.stats(net)}  # fmt: skip


def memory(args: argparse.Namespace) -> dict[str, Any]:
    import random

    import torch

    _mineru(args.patched)
    call = importlib.import_module(f"{OCR}.infer.predict_det")._rocmfix_graph_forward
    runner = sys.modules[call.__module__]
    nets = {"det": build(args.patched, "det", torch.float32),
            "rec": build(args.patched, "rec", torch.float16)}  # fmt: skip
    sizes = [(960, 672), (736, 960), (960, 736), (544, 960)]
    widths = [320 + 64 * i for i in range(14)]
    rng = random.Random(5)
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    with torch.inference_mode():
        for page in range(1, args.pages + 1):
            call(nets["det"], torch.randn(1, 3, *rng.choice(sizes), device=DEVICE))
            for _ in range(8):
                x = torch.randn(6, 3, 48, rng.choice(widths), device=DEVICE, dtype=torch.float16)
                call(nets["rec"], x)
            torch.cuda.synchronize()
            rows.append({"page": page, "s": time.perf_counter() - start,
                         "reserved_mib": torch.cuda.memory_reserved() / 2**20,
                         "allocated_mib": torch.cuda.memory_allocated() / 2**20,
                         **{f"{m} graphs": runner.stats(n)["graphs"] for m, n in nets.items()},
                         **{f"{m} held_mib": runner.held_bytes(n) / 2**20
                            for m, n in nets.items()}})  # fmt: skip
            if page % 20 == 0 or page <= 3:
                print(json.dumps({k: round(v, 1) for k, v in rows[-1].items()}), flush=True)
            if time.perf_counter() - start > args.seconds:
                print(f"stopped at page {page}: past {args.seconds} s", flush=True)
                break
    return {"pages": rows, "stats": {m: runner.stats(n) for m, n in nets.items()}}


def _run(args: argparse.Namespace, side: str, config: str) -> dict[str, Any]:
    command = [sys.executable, __file__, "--worker", side, "--config", config]
    command += ["--stock", args.stock, "--patched", args.patched, "--reps", str(args.reps)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)
    if done.returncode != 0:
        return {"side": side, "config": config, "error": done.stderr[-2000:]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stock", required=True)
    parser.add_argument("--patched", required=True)
    parser.add_argument("--out", default=".")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--worker", choices=("stock", "patched"))
    parser.add_argument("--config", choices=tuple(CONFIGS))
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--interleave", action="store_true")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=1e9,
                        help="start no new process (--memory: page) past this")  # fmt: skip
    args = parser.parse_args()
    if args.worker:
        args.side = args.worker
        print(json.dumps(worker(args)))
        return
    if args.memory:
        found = memory(args)
        Path(args.out, "graphs_memory.json").write_text(json.dumps(found, indent=1))
        print(json.dumps(found["stats"], indent=1))
        return
    if args.check or args.interleave:
        found = check(args) if args.check else interleave(args)
        name = "graphs_check.json" if args.check else "graphs_interleave.json"
        Path(args.out, name).write_text(json.dumps(found, indent=1))
        print(json.dumps(found, indent=1))
        return
    runs: list[dict[str, Any]] = []
    began = time.perf_counter()
    for config in args.configs.split(","):
        for pair in range(args.pairs):
            if time.perf_counter() - began > args.seconds:
                print(f"pair {pair} of {config} not started: past {args.seconds} s", flush=True)
                break
            sides = ("stock", "patched") if pair % 2 == 0 else ("patched", "stock")
            for side in sides:
                runs.append({"pair": pair, **_run(args, side, config)})
                print(json.dumps({k: v for k, v in runs[-1].items() if k != "ms"}), flush=True)
                # After every run: a run cut off by its time limit still leaves its numbers.
                Path(args.out, "graphs.json").write_text(json.dumps(runs, indent=1))
    print(f"\n{'config':<12} {'stock ms':>16} {'graphs ms':>16} {'x (per pair)':>20} same MiB")
    for config in args.configs.split(","):
        mine = [r for r in runs if r["config"] == config and "ms" in r]
        stock = {r["pair"]: statistics.median(r["ms"]) for r in mine if r["side"] == "stock"}
        graph = {r["pair"]: statistics.median(r["ms"]) for r in mine if r["side"] == "patched"}
        ratios = sorted(stock[p] / graph[p] for p in stock if p in graph)
        if not ratios:
            print(f"{config:<12} failed")
            continue
        same = all(r.get("identical") for r in mine if r["side"] == "patched")
        held = max(r.get("held_mib", 0) for r in mine if r["side"] == "patched")
        span = lambda v: f"{min(v):.2f}-{max(v):.2f}"  # noqa: E731
        print(
            f"{config:<12} {span(list(stock.values())):>16} {span(list(graph.values())):>16} "
            f"{statistics.median(ratios):>6.2f} ({span(ratios)}) {same!s:>5} {held:.0f}"
        )


if __name__ == "__main__":
    main()
