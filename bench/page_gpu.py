"""A page through MinerU 4.0's own predictors, stock files against the files `rocmfix apply`
rewrote for graphs, in alternating fresh processes, with MinerU's CPU work timed apart from
the forwards (issue 41, item 4 and its page target).

    python bench/page_gpu.py --stock STOCK_SITE --patched PATCHED_SITE --out DIR [--pairs 3]
    python bench/page_gpu.py --memory --patched PATCHED_SITE --out DIR [--pages 200]

STOCK_SITE and PATCHED_SITE each hold mineru 4.0.x and transformers (5.3+); the patched one
has the seven graph patches applied (``mineru-ocr-{det,rec,cls}-graphs``,
``mineru-layout-graphs``, ``mineru-formula-encoder-graphs``,
``transformers-pp-doclayout-v2-graphs``, ``transformers-eager-mask-graphs``; bench/page_gpu.sh
does both). Each process builds MinerU's own predictor classes from that site's code, weights
random with seed 0 (both sides hold the same models; bench/_pages.py writes the weight files
the constructors read into ``--work`` once): ``PPDocLayoutV2LayoutModel``,
``FormulaRecognizer`` (PP-FormulaNet_plus-M), ``TextDetector``, ``TextClassifier`` and
``TextRecognizer``. It runs the page mix of bench/_pages.py (fpdf2 documents rendered at 200
DPI) in MinerU 4.0's order, one document's window at a time, with MinerU's batch sizes at a
batch ratio of 2: the page images through layout's ``batch_predict`` (batches of 2); every
8th text line as an inline formula through the formula recognizer's ``batch_predict``
(batches of up to 32, every crop resized to 384x384); every block crop through det's
``batch_predict`` (up to 16 of one shape); every line crop through cls (as ``TextSystem``
runs it where ``use_angle_cls`` is on: MinerU 4.0.12 builds its OCR with it off and ships no
cls weights, so cls is PaddleOCR's mobile v2.0 classifier here) and then rec (sorted, batches
of 6). Models with random weights find nothing real, so the crops come from the PDF's text
layer, not from layout's or det's boxes.

What is timed, on the host with ``time.perf_counter``:

- forward, per model: each model call between two ``torch.cuda.synchronize()`` (``self.net``,
  ``self.model`` or the formula net's ``self.backbone`` on the stock side; the patched file's
  ``_rocmfix_graph_forward`` on the patched side, so the runner's own work is in it). The GPU
  part of a page is the sum over the five models (the formula encoder, not its decoder);
- the formula decoder (the net's ``head``): autoregressive, a forward a token, eager on both
  sides (graphs capture the encoder only); its tokens are bounded by ``--tokens`` (random
  weights rarely end a sequence: MinerU's bound is 2560) and it is reported apart;
- CPU pre-processing: layout's ``_preprocess_single_image``, the formula ``pre_tfs``, det's
  ``_preprocess_det_image``, cls's and rec's ``resize_norm_img``, and the crops (a line as
  ``get_rotate_crop_image_for_text_rec`` crops it, a block pasted on white as ``crop_img``
  does);
- CPU post-processing: layout's box decoding and filters (``_post_process_object_detection``,
  ``_parse_prediction``, ``_apply_paddlex_filter_boxes``, ``_apply_layout_post_process``; on
  random weights its box count is not a trained model's), the formula ``post_op``, det's
  ``_build_det_preds`` and ``_postprocess_det_batch``, cls's and rec's ``postprocess_op``;
- other: the rest of the pass (grouping, sorting, copies to and from the device, tqdm).

``--passes`` passes over the same pages per process (default 4): pass 1 is a fresh process's
first document set, later passes give the same shapes again, as a long document or a batch of
similar ones does (the runner captures a shape at its 3rd sighting, while its graphs pay back).
Pass 1, the later passes and the last pass alone (every capture behind it) are reported
apart. ``--pairs`` pairs, stock first in even pairs.
Each part is bounded: no pair starts past ``--seconds``, no pass past ``--process-seconds`` in
its process; progress goes to stderr as it comes.

``--memory``: one patched process, ``--pages`` pages (the mix over and over, each line box
moved by up to 3 px so rec's widths keep changing as a detector's would), one page a window;
after each page ``torch.cuda.memory_reserved``, ``memory_allocated`` and each model's graphs
and held bytes. Flat held bytes after the first pages is the caps at work.

``--device cpu --pages 1 --formula PP-FormulaNet_plus-S`` runs the plumbing where there is no
GPU (the runner passes CPU inputs through; tests/test_bench_page.py). Results go to
DIR/page.json or DIR/page_memory.json; a table is printed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _pages

WINDOW = 64
BATCH_RATIO = 2  # MinerU's batch sizes: layout min(8, 1x), formulas 16x, det 8x this
# MinerU's order in a window (mineru/backend/analysis/pdf/window.py, ocr.py): layout, formulas,
# then OCR (det on block crops; cls where `use_angle_cls` is on; rec on line crops).
MODELS = ("layout", "formula", "det", "cls", "rec")
# Where each predictor keeps its model and what the patched file routes through the runner.
NET = {"layout": "model", "det": "net", "cls": "net", "rec": "net"}
# MinerU's CPU work per model (the predictor's own methods; pre_tfs and the crops apart).
PRE = {"layout": ("_preprocess_single_image",), "det": ("_preprocess_det_image",),
       "cls": ("resize_norm_img",), "rec": ("resize_norm_img",)}  # fmt: skip
POST = {
    "layout": ("_post_process_object_detection", "_parse_prediction",
               "_apply_paddlex_filter_boxes", "_apply_layout_post_process"),
    "det": ("_build_det_preds", "_postprocess_det_batch"),
    "cls": ("postprocess_op",),
    "rec": ("postprocess_op",),
    "formula": ("post_op",),
}  # fmt: skip


class Clock:
    """Seconds spent in each named part."""

    def __init__(self, device: str) -> None:
        self.parts: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.cuda = device.startswith("cuda")

    def add(self, part: str, seconds: float) -> None:
        self.parts[part] = self.parts.get(part, 0.0) + seconds
        self.calls[part] = self.calls.get(part, 0) + 1

    def wrap(self, part: str, fn: Callable[..., Any], sync: bool = False) -> Callable[..., Any]:
        import torch

        def timed(*args: Any, **kwargs: Any) -> Any:
            if sync and self.cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            if sync and self.cuda:
                torch.cuda.synchronize()
            self.add(part, time.perf_counter() - start)
            return out

        return timed


def setup(args: argparse.Namespace, root: str, clock: Clock, side: str) -> dict[str, Any]:
    """The five predictors, each model call and each piece of MinerU's CPU work timed."""
    models = _pages.page_models(root, args.device, args.work, args.formula)
    # Each patched folder holds its own copy of the runner, each with its own graphs: per
    # model, that copy and the module it keys them by.
    runners: dict[str, tuple[Any, Any]] = {}
    for name, attr in NET.items():
        predictor = models[name]
        module = sys.modules[type(predictor).__module__]
        graphed = getattr(module, "_rocmfix_graph_forward", None)
        if side == "patched":
            assert graphed is not None, f"the patched {module.__name__} did not import its runner"
            runners[name] = (sys.modules[graphed.__module__], getattr(predictor, attr))
            module._rocmfix_graph_forward = clock.wrap(f"{name} forward", graphed, sync=True)
        else:
            assert graphed is None, f"the stock {module.__name__} holds rocmfix's rewrite"
            # An instance attribute over the class's: MinerU calls self.net(inp).
            net = getattr(predictor, attr)
            setattr(predictor, attr, _Timed(net, clock.wrap(f"{name} forward", net, sync=True)))
    formula = models["formula"]
    # The encoder is what the patched BaseModel.forward routes (`self.backbone(x)`); its
    # decoder generates token by token, eager on both sides: timed apart, bounded by --tokens.
    encoder, head = formula.net.backbone, formula.net.head
    base = sys.modules[_pages.OCR + ".modeling.architectures.base_model"]
    routed = getattr(base, "_rocmfix_graph_forward", None)
    assert (routed is not None) == (side == "patched"), f"{side} base_model.py"
    if routed is None:
        encoder.forward = clock.wrap("formula forward", encoder.forward, sync=True)
    else:
        # Every BaseModel's backbone goes through this name (det's, rec's and cls's eager
        # forwards too, inside their own timed calls): only the formula encoder is its part.
        runners["formula"] = (sys.modules[routed.__module__], encoder)
        timed = clock.wrap("formula forward", routed, sync=True)
        base._rocmfix_graph_forward = lambda model, *a, **k: (
            timed if model is encoder else routed
        )(model, *a, **k)
    head.forward = clock.wrap("formula decoder", head.forward, sync=True)
    head.max_seq_len = args.tokens
    for name, methods in PRE.items():
        for method in methods:
            setattr(models[name], method, clock.wrap(f"{name} pre", getattr(models[name], method)))
    for name, methods in POST.items():
        for method in methods:
            setattr(models[name], method, clock.wrap(f"{name} post", getattr(models[name], method)))
    formula.pre_tfs = {k: clock.wrap("formula pre", v) for k, v in formula.pre_tfs.items()}
    models["image"] = importlib.import_module("mineru.model.ocr.image")
    models["runners"] = runners
    return models


class _Timed:
    """The stock side's ``self.net``: the timed call, and the model's attributes beside it."""

    def __init__(self, net: Any, call: Callable[..., Any]) -> None:
        self._net = net
        self._call = call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._net, name)


def run_pages(pages: list[_pages.Page], models: dict[str, Any], clock: Clock,
              window: int = WINDOW) -> float:  # fmt: skip
    """MinerU's page stages over ``pages``, ``window`` pages at a time; the wall time. Each
    predictor sets its own grad mode, as in MinerU (layout ``no_grad``, the rest
    ``inference_mode``)."""
    import torch

    start = time.perf_counter()
    for first in range(0, len(pages), window):
        group = pages[first : first + window]
        t = time.perf_counter()
        images = [p.image for p in group]
        formulas = [_pages.formula_boxes(p) for p in group]
        blocks = [c for p in group for c in _pages.block_crops(p)]
        lines = [c for p in group for c in _pages.line_crops(p, models["image"])]
        clock.add("crops", time.perf_counter() - t)
        models["layout"].batch_predict(images, batch_size=min(8, BATCH_RATIO))
        models["formula"].batch_predict(formulas, images, batch_size=16 * BATCH_RATIO)
        models["det"].batch_predict(blocks, min(len(blocks), 8 * BATCH_RATIO))
        lines = models["cls"](lines)[0]
        models["rec"](lines)
    if clock.cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    root = args.stock if args.side == "stock" else args.patched
    pdfs = _pages.write_pdfs(Path(args.work), pages_each=args.pages_each)
    pages = _pages.load_pages([p for p in pdfs if args.doc in p.stem], limit=args.pages)
    clock = Clock(args.device)
    began = time.perf_counter()
    models = setup(args, root, clock, args.side)
    out: dict[str, Any] = {"side": args.side, "pages": len(pages), "passes": [],
                           "setup_s": time.perf_counter() - began}  # fmt: skip
    for index in range(args.passes):
        if index > 0 and time.perf_counter() - began > args.process_seconds:
            print(f"  {args.side}: pass {index + 1} not started: past "
                  f"{args.process_seconds} s", file=sys.stderr, flush=True)  # fmt: skip
            break
        clock.parts, clock.calls = {}, {}
        wall = run_pages(pages, models, clock)
        out["passes"].append({"wall": wall, "parts": dict(clock.parts), "calls": dict(clock.calls)})
        print(f"  {args.side} pass {index + 1}: {wall:.2f} s, {len(pages)} pages",
              file=sys.stderr, flush=True)  # fmt: skip
    if args.side == "patched":
        out["stats"] = graph_stats(models)
    if args.device.startswith("cuda"):
        out["reserved_mib"] = torch.cuda.memory_reserved() / 2**20
    return out


def graph_stats(models: dict[str, Any]) -> dict[str, Any]:
    """Each model's runner counts, graphs and the memory they hold."""
    found = {}
    for name, (runner, net) in models["runners"].items():
        found[name] = {**runner.stats(net), "held_mib": runner.held_bytes(net) / 2**20}
    return found


def memory(args: argparse.Namespace) -> dict[str, Any]:
    """``--pages`` pages (the mix over and over, each line box moved by up to 3 px) through
    the patched predictors one page a window; the memory held after each."""
    import torch

    mix = _pages.load_pages(_pages.write_pdfs(Path(args.work), pages_each=2))
    clock = Clock(args.device)
    models = setup(args, args.patched, clock, "patched")
    cuda = args.device.startswith("cuda")
    rng = random.Random(2)
    rows: list[dict[str, Any]] = []
    began = time.perf_counter()
    for i in range(args.pages):
        if time.perf_counter() - began > args.seconds:
            print(f"stopped at page {i}: past {args.seconds} s", flush=True)
            break
        page = mix[i % len(mix)]
        moved = [tuple(v + rng.uniform(-3, 3) for v in box) for box in page.lines]
        one = _pages.Page(page.name, page.image, moved, page.blocks)  # type: ignore[arg-type]
        wall = run_pages([one], models, clock, window=1)
        stats = graph_stats(models)
        rows.append({"page": i + 1, "ms": wall * 1e3,
                     "reserved_mib": torch.cuda.memory_reserved() / 2**20 if cuda else 0.0,
                     "allocated_mib": torch.cuda.memory_allocated() / 2**20 if cuda else 0.0,
                     **{f"{m} held_mib": st["held_mib"] for m, st in stats.items()},
                     **{f"{m} graphs": st["graphs"] for m, st in stats.items()}})  # fmt: skip
        if i < 3 or (i + 1) % 20 == 0:
            print(json.dumps({k: round(v, 1) for k, v in rows[-1].items()}), flush=True)
    return {"pages": rows, "stats": graph_stats(models)}


def _run(args: argparse.Namespace, side: str) -> dict[str, Any]:
    """One fresh process; its progress lines pass through (stderr), its result comes back."""
    command = [sys.executable, __file__, "--worker", side]
    for flag in ("stock", "patched", "pages_each", "pages", "doc", "passes", "device", "work",
                 "formula", "tokens", "process_seconds"):  # fmt: skip
        if getattr(args, flag) is not None:
            command += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
    limit = args.process_seconds + 240  # setup and the pass under way when the limit came
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False,
                              timeout=limit)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"side": side, "error": f"no result in {limit} s"}
    if done.returncode != 0:
        return {"side": side, "error": f"exit {done.returncode} (its stderr is above)"}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def split(run: dict[str, Any], passes: slice) -> dict[str, float] | None:
    """ms per page over ``passes``: the whole page, the GPU part (every model's forward: the
    formula encoder's, not its decoder's), the decoder, MinerU's CPU pre- and post-processing
    and the rest; then each model's forward, pre and post."""
    chosen = run["passes"][passes]
    if not chosen:
        return None
    n = run["pages"] * len(chosen)
    parts: dict[str, float] = {}
    for one in chosen:
        for k, v in one["parts"].items():
            parts[k] = parts.get(k, 0.0) + v
    wall = sum(one["wall"] for one in chosen)
    fwd = sum(v for k, v in parts.items() if k.endswith(" forward"))
    pre = sum(v for k, v in parts.items() if k.endswith(" pre") or k == "crops")
    post = sum(v for k, v in parts.items() if k.endswith(" post"))
    dec = parts.get("formula decoder", 0.0)
    found = {"page": wall, "gpu part": fwd, "decoder": dec, "cpu pre": pre, "cpu post": post,
             "other": wall - fwd - dec - pre - post}  # fmt: skip
    for model in MODELS:
        for what in ("forward", "pre", "post"):
            found[f"{model} {what}"] = parts.get(f"{model} {what}", 0.0)
    return {k: v / n * 1e3 for k, v in found.items()}


def report(runs: list[dict[str, Any]]) -> None:
    ok = [r for r in runs if r.get("passes")]
    for r in runs:
        if "error" in r:
            print(f"pair {r['pair']} {r['side']}: failed: {r['error']}")
    if not ok:
        print("no run gave a result")
        return
    heads = ("page", "gpu part", "decoder", "cpu pre", "cpu post", "other")
    # Later passes capture what comes back a 3rd time: the last pass is the steadiest.
    for passes, label, least in ((slice(0, 1), "pass 1 (a fresh process)", 1),
                                 (slice(1, None), "passes 2+ (the same documents again)", 2),
                                 (slice(-1, None), "the last pass alone", 3)):  # fmt: skip
        rows = [(r, split(r, passes)) for r in ok if len(r["passes"]) >= least]
        rows = [(r, s) for r, s in rows if s is not None]
        if not rows:
            continue
        print(f"\n{label}: ms per page ({rows[0][0]['pages']} pages)")
        print(f"{'pair side':<14}" + "".join(f"{k:>10}" for k in heads))
        for r, s in rows:
            print(f"{r['pair']:<4} {r['side']:<9}" + "".join(f"{s[k]:>10.2f}" for k in heads))
        print("per model, median over processes (ms per page): forward / CPU pre / CPU post")
        for model in MODELS:
            cells = []
            for side in ("stock", "patched"):
                mine = [s for r, s in rows if r["side"] == side]
                if mine:
                    cells.append(f"{side} " + " / ".join(
                        f"{statistics.median(s[f'{model} {w}'] for s in mine):.2f}"
                        for w in ("forward", "pre", "post")))  # fmt: skip
            print(f"  {model:<8} " + "   ".join(cells))
        gpu, whole, bound = [], [], []
        for pair in sorted({r["pair"] for r, _ in rows}):
            side = {r["side"]: s for r, s in rows if r["pair"] == pair}
            if "stock" in side and "patched" in side:
                st, pa = side["stock"], side["patched"]
                gpu.append(st["gpu part"] / pa["gpu part"])
                whole.append(st["page"] / pa["page"])
                # What the GPU part's speed-up alone leaves for the whole page, the rest
                # (MinerU's CPU work, the decoder, the copies) as the stock process had it.
                bound.append(st["page"] / (st["page"] - st["gpu part"] + pa["gpu part"]))
        if gpu:
            print(f"stock/patched per pair: GPU part {_show(gpu)}")
            print(f"  whole page {_show(whole)}; what the GPU part leaves it {_show(bound)}")
    for r in ok:
        if r["side"] == "patched":
            print(f"pair {r['pair']} patched, runner at the end: " + "; ".join(
                f"{m} {st['graphs']} graphs {st['held_mib']:.0f} MiB {st['counts']}"
                for m, st in r.get("stats", {}).items()))  # fmt: skip


def _show(ratios: list[float]) -> str:
    return f"{', '.join(f'{x:.2f}' for x in ratios)} (median {statistics.median(ratios):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stock")
    parser.add_argument("--patched", required=True)
    parser.add_argument("--out", default=".")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--passes", type=int, default=4, help="over the same pages, per process")
    parser.add_argument("--pages-each", type=int, default=1)
    parser.add_argument("--pages", type=int, help="at most this many pages of the mix")
    parser.add_argument("--doc", default="", help="only the mix's documents named so")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--work", default=tempfile.mkdtemp(prefix="page_gpu_"))
    parser.add_argument("--formula", choices=_pages.FORMULA, default=_pages.FORMULA[0])
    parser.add_argument("--tokens", type=int, default=32, help="the formula decoder's bound")
    parser.add_argument("--worker", choices=("stock", "patched"))
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--seconds", type=float, default=1e9,
                        help="start no pair (--memory: page) past this")  # fmt: skip
    parser.add_argument("--process-seconds", type=float, default=90,
                        help="start no pass past this in a process")  # fmt: skip
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    if args.worker:
        args.side = args.worker
        print(json.dumps(worker(args)))
        return
    if args.memory:
        args.pages = args.pages or 200
        found = memory(args)
        Path(args.out, "page_memory.json").write_text(json.dumps(found, indent=1))
        print(json.dumps(found["stats"], indent=1))
        return
    if not args.stock:
        parser.error("--stock is needed (or --memory)")
    runs: list[dict[str, Any]] = []
    began = time.perf_counter()
    for pair in range(args.pairs):
        if time.perf_counter() - began > args.seconds:
            print(f"pair {pair} not started: past {args.seconds} s", flush=True)
            break
        for side in ("stock", "patched") if pair % 2 == 0 else ("patched", "stock"):
            print(f"pair {pair} {side}, {time.perf_counter() - began:.0f} s in", flush=True)
            runs.append({"pair": pair, **_run(args, side)})
            Path(args.out, "page.json").write_text(json.dumps(runs, indent=1))
    report(runs)


if __name__ == "__main__":
    main()
