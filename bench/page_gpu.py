"""Pages through MinerU 4.0's own OCR predictors, stock files against the files `rocmfix apply`
rewrote for graphs, in alternating fresh processes, with MinerU's CPU work timed apart from
the forwards (issue 41, item 4).

    python bench/page_gpu.py --stock STOCK_SITE --patched PATCHED_SITE --out DIR [--pairs 5]
    python bench/page_gpu.py --memory --patched PATCHED_SITE --out DIR [--pages 200]

STOCK_SITE and PATCHED_SITE each hold mineru 4.0.x; the patched one has
``mineru-ocr-{det,rec,cls}-graphs`` applied (bench/page_gpu.sh does both). Each process builds
MinerU's ``TextDetector`` and ``TextRecognizer`` (its own classes, made as
``PytorchPaddleOCR`` makes them, weights random with seed 0: both sides hold the same models;
bench/_pages.py) and runs the page mix of bench/_pages.py (fpdf2 documents, rendered at 200
DPI) the way MinerU 4.0's OCR stage does, one document's window at a time: every block crop
through ``TextDetector.batch_predict`` (batches of up to 16 of one shape), then every line
crop through ``TextRecognizer.__call__`` (sorted, batches of 6). The models have random
weights, so the line crops come from the PDF's text layer, not from det's boxes.

What is timed, on the host with ``time.perf_counter``:

- forward: each model call, between two ``torch.cuda.synchronize()`` (``self.net`` on the
  stock side; the patched file's ``_rocmfix_graph_forward`` on the patched side, so the
  runner's own work is in it);
- CPU pre-processing: det's ``_preprocess_det_image`` (resize, normalise), rec's
  ``resize_norm_img`` (resize, pad); the crops (``get_rotate_crop_image_for_text_rec`` per
  line, a block pasted on white per block, as ``crop_img`` does);
- CPU post-processing: det's ``_build_det_preds`` (the copy to the host) and
  ``_postprocess_det_batch`` (DB boxes), rec's ``postprocess_op`` (CTC decoding);
- other: the rest of the pass (grouping, sorting, copies to the device).

The mix is run twice per process: pass 1 is a fresh process's first document set (captures
happen in it); pass 2 the same pages again (every shape seen before). ``--pairs`` pairs,
stock first in even pairs. Under ``torch.inference_mode()`` as MinerU calls the models.

``--memory``: one patched process, ``--pages`` pages (the mix over and over, each line box
moved by up to 3 px so rec's widths keep changing as a detector's would), one page per
window; after each page ``torch.cuda.memory_reserved``, ``memory_allocated`` and the runner's
``held_bytes`` and graph count for det and rec. Flat held bytes after the first pages is the
cap at work.

``--device cpu --pages-each 1`` runs the plumbing where there is no GPU (the runner passes CPU
inputs through). Results go to DIR/page.json or DIR/page_memory.json; a table is printed.
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
DET_BATCH = 16


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


def setup(root: str, device: str, weights: str, clock: Clock, side: str) -> tuple[Any, Any, Any]:
    det, rec = _pages.predictors(root, device, weights)
    image = importlib.import_module("mineru.model.ocr.image")
    for model, predictor in (("det", det), ("rec", rec)):
        module = sys.modules[type(predictor).__module__]
        graphed = getattr(module, "_rocmfix_graph_forward", None)
        if side == "patched":
            assert graphed is not None, f"the patched predict_{model}.py did not import its runner"
            module._rocmfix_graph_forward = clock.wrap(f"{model} forward", graphed, sync=True)
        else:
            assert graphed is None, f"the stock predict_{model}.py holds rocmfix's rewrite"
            # An instance attribute over the module: MinerU calls self.net(inp).
            predictor.net = _Timed(predictor.net, clock.wrap(f"{model} forward", predictor.net,
                                                             sync=True))  # fmt: skip
    det._preprocess_det_image = clock.wrap("det pre", det._preprocess_det_image)
    det._build_det_preds = clock.wrap("det post", det._build_det_preds)
    det._postprocess_det_batch = clock.wrap("det post", det._postprocess_det_batch)
    rec.resize_norm_img = clock.wrap("rec pre", rec.resize_norm_img)
    rec.postprocess_op = clock.wrap("rec post", rec.postprocess_op)
    return det, rec, image


class _Timed:
    """The stock side's ``self.net``: the timed call, and the model's attributes beside it."""

    def __init__(self, net: Any, call: Callable[..., Any]) -> None:
        self._net = net
        self._call = call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._net, name)


def run_pages(pages: list[_pages.Page], det: Any, rec: Any, image: Any, clock: Clock,
              window: int = WINDOW) -> float:  # fmt: skip
    """MinerU's OCR stage over ``pages``, ``window`` pages at a time; the wall time."""
    import torch

    start = time.perf_counter()
    with torch.inference_mode():
        for first in range(0, len(pages), window):
            group = pages[first : first + window]
            t = time.perf_counter()
            blocks = [c for p in group for c in _pages.block_crops(p)]
            lines = [c for p in group for c in _pages.line_crops(p, image)]
            clock.add("crops", time.perf_counter() - t)
            det.batch_predict(blocks, min(len(blocks), DET_BATCH))
            rec(lines)
    if clock.cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    root = args.stock if args.side == "stock" else args.patched
    pages = _pages.load_pages(_pages.write_pdfs(Path(args.work), pages_each=args.pages_each))
    passes = []
    clock = Clock(args.device)
    det, rec, image = setup(root, args.device, args.work, clock, args.side)
    for _ in range(2):
        clock.parts, clock.calls = {}, {}
        wall = run_pages(pages, det, rec, image, clock)
        passes.append({"wall": wall, "parts": dict(clock.parts), "calls": dict(clock.calls)})
    out: dict[str, Any] = {"side": args.side, "pages": len(pages), "passes": passes}
    if args.side == "patched":
        runner = _runner(det)
        out["stats"] = {m: runner.stats(p.net) for m, p in (("det", det), ("rec", rec))}
    if args.device.startswith("cuda"):
        out["reserved_mib"] = torch.cuda.memory_reserved() / 2**20
    return out


def _runner(det: Any) -> Any:
    """The dropped runner module the patched predictors imported."""
    for name, module in sys.modules.items():
        if name.endswith("rocmfix_graphs") and hasattr(module, "stats"):
            return module
    raise RuntimeError("no rocmfix_graphs module loaded")


def memory(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    mix = _pages.load_pages(_pages.write_pdfs(Path(args.work), pages_each=2))
    clock = Clock(args.device)
    det, rec, image = setup(args.patched, args.device, args.work, clock, "patched")
    runner = _runner(det)
    rng = random.Random(2)
    rows = []
    for i in range(args.pages):
        page = mix[i % len(mix)]
        moved = _pages.Page(
            page.name,
            page.image,
            [tuple(v + rng.uniform(-3, 3) for v in box) for box in page.lines],  # type: ignore[misc]
            page.blocks,
        )
        wall = run_pages([moved], det, rec, image, clock, window=1)
        cuda = args.device.startswith("cuda")
        rows.append(
            {
                "page": i + 1,
                "ms": wall * 1e3,
                "reserved_mib": torch.cuda.memory_reserved() / 2**20 if cuda else 0.0,
                "allocated_mib": torch.cuda.memory_allocated() / 2**20 if cuda else 0.0,
                **{
                    f"{m} held_mib": runner.held_bytes(p.net) / 2**20
                    for m, p in (("det", det), ("rec", rec))
                },
                **{
                    f"{m} graphs": runner.stats(p.net)["graphs"]
                    for m, p in (("det", det), ("rec", rec))
                },
            }
        )
    stats = {m: runner.stats(p.net) for m, p in (("det", det), ("rec", rec))}
    return {"pages": rows, "stats": stats}


def _run(args: argparse.Namespace, side: str) -> dict[str, Any]:
    command = [sys.executable, __file__, "--worker", side, "--stock", args.stock or "",
               "--patched", args.patched, "--pages-each", str(args.pages_each),
               "--device", args.device, "--work", args.work]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=900)
    except subprocess.TimeoutExpired:
        return {"side": side, "error": "no result in 900 s"}
    if done.returncode != 0:
        return {"side": side, "error": done.stderr[-3000:]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def split(run: dict[str, Any], index: int) -> dict[str, float]:
    """ms per page: forward (GPU part), CPU pre, CPU post, other."""
    one = run["passes"][index]
    parts, n = one["parts"], run["pages"]
    fwd = sum(v for k, v in parts.items() if k.endswith("forward"))
    pre = sum(v for k, v in parts.items() if k.endswith(" pre") or k == "crops")
    post = sum(v for k, v in parts.items() if k.endswith(" post"))
    wall = one["wall"]
    return {
        "page": wall / n * 1e3,
        "forward": fwd / n * 1e3,
        "cpu pre": pre / n * 1e3,
        "cpu post": post / n * 1e3,
        "other": (wall - fwd - pre - post) / n * 1e3,
        "det forward": parts.get("det forward", 0.0) / n * 1e3,
        "rec forward": parts.get("rec forward", 0.0) / n * 1e3,
    }


def report(runs: list[dict[str, Any]]) -> None:
    ok = [r for r in runs if "passes" in r]
    if not ok:
        print("no run gave a result")
    for r in runs:
        if "error" in r:
            print(f"pair {r['pair']} {r['side']}: failed\n{r['error']}")
    for index, label in ((0, "pass 1 (fresh process)"), (1, "pass 2 (shapes seen before)")):
        if not ok:
            break
        print(f"\n{label}: ms per page")
        print(f"{'pair side':<14}" + "".join(f"{k:>12}" for k in split(ok[0], 0)))
        for r in ok:
            s = split(r, index)
            print(f"{r['pair']:<4} {r['side']:<9}" + "".join(f"{v:>12.2f}" for v in s.values()))
        pairs = sorted({r["pair"] for r in ok})
        gpu, whole = [], []
        for p in pairs:
            side = {r["side"]: split(r, index) for r in ok if r["pair"] == p}
            if "stock" in side and "patched" in side:
                gpu.append(side["stock"]["forward"] / side["patched"]["forward"])
                whole.append(side["stock"]["page"] / side["patched"]["page"])
        for r in ok:
            if r["side"] == "patched" and index == 1:
                print(f"pair {r['pair']} patched, runner: " + "; ".join(
                    f"{m} {st['graphs']} graphs, {st['held_bytes'] / 2**20:.0f} MiB, {st['counts']}"
                    for m, st in r.get("stats", {}).items()))  # fmt: skip
        if gpu:
            print(
                "stock/patched, per pair: forwards (the GPU part) "
                f"{', '.join(f'{x:.2f}' for x in gpu)} "
                f"(median {statistics.median(gpu):.2f}); whole page "
                f"{', '.join(f'{x:.2f}' for x in whole)} (median {statistics.median(whole):.2f})"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stock")
    parser.add_argument("--patched", required=True)
    parser.add_argument("--out", default=".")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--pages-each", type=int, default=8)
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--work", default=tempfile.mkdtemp(prefix="page_gpu_"))
    parser.add_argument("--worker", choices=("stock", "patched"))
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--seconds", type=float, default=1e9, help="start no pair past this")
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    if args.worker:
        args.side = args.worker
        print(json.dumps(worker(args)))
        return
    if args.memory:
        found = memory(args)
        Path(args.out, "page_memory.json").write_text(json.dumps(found, indent=1))
        rows = found["pages"]
        head = f"{'page':>5} {'ms':>8} {'reserved':>9} {'allocated':>9}"
        print(head + " det held/graphs rec held/graphs (MiB)")
        for r in rows[:5] + rows[9::10]:
            print(
                f"{r['page']:>5} {r['ms']:>8.1f} {r['reserved_mib']:>9.0f} "
                f"{r['allocated_mib']:>9.0f}"
                f" {r['det held_mib']:>8.0f}/{r['det graphs']:<6} "
                f"{r['rec held_mib']:>8.0f}/{r['rec graphs']}"
            )
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
            runs.append({"pair": pair, **_run(args, side)})
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "passes"})[:300],
                  flush=True)  # fmt: skip
            Path(args.out, "page.json").write_text(json.dumps(runs, indent=1))
    report(runs)


if __name__ == "__main__":
    main()
