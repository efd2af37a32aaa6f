"""How often MinerU's OCR models see the same input shape over real documents (issue 41,
item 3): the shapes are what a graph runner can replay.

    python bench/shape_repeat.py --mineru SITE [--pages-each 8] [--json out.json]

SITE holds mineru 4.0.x (``pip install --no-deps --target SITE mineru-4.0.12-...whl``);
the page mix and what stands for layout and det are bench/_pages.py's (fpdf2 documents, text
lines from pypdfium2's text layer, pages rendered at 200 DPI). MinerU's own code makes every
shape: its ``TextDetector.batch_predict`` (each block crop resized by ``DetResizeForTest``,
grouped by shape, batches of up to ``BATCH_RATIO * OCR_DET_BASE_BATCH_SIZE`` = 16, what
``_ocr_det`` asks for) and ``TextRecognizer.__call__`` (a window's line crops sorted by
aspect ratio, batches of 6, each padded to its widest by ``resize_text_recognition_image``),
called on the crops of each document's processing window (64 pages, MinerU's default) in
turn. The models are MinerU's classes built with random weights, their ``net`` then swapped
for a recorder that notes the input shape and returns zeros of the output's shape (no
forward is run: only the shapes matter here). The text layer's line boxes are exact: a
justified paragraph's full lines all have one width, where a detector's boxes move by a pixel
or two; ``--jitter PX`` moves each box edge by up to PX pixels (seeded) to see what that does
to the repeats. Whole-page det (``TextDetector.__call__`` on a
page, what table OCR and ``ocr(img, det=True)`` do) is counted apart.

For each model it prints the calls, the distinct input shapes, how many of the calls a graph
runner that captures at a shape's second sighting could replay (the sum over shapes of their
count less one), and the same under schemes that change the shape a forward sees:
``pad batch``: the batch dimension padded up to MinerU's batch size (6 for rec, 16 for det;
exact: in eval mode the rows of a batch are independent); ``pad batch pow2``: padded to the
next power of two only (at most 2x the rows); ``runner's padding``: what
templates/rocmfix_graphs.py does, up to the full batch where that at most doubles the rows;
``width /64`` etc.: rec's width rounded up to a
multiple, or ``width pow2`` to 320 x a power of two (not exact: the model sees more padded
columns than stock MinerU gives it).
"""

from __future__ import annotations

import argparse
import collections
import importlib
import json
import random
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _pages

WINDOW = 64
DET_BATCH = 16
REC_BATCH = 6


class Recorder:
    """Stands for a predictor's ``net``: notes each input's shape, returns zeros shaped like
    the model's output (det: one probability map; rec: CTC logits of two classes, all blank)."""

    def __init__(self, kind: str, seen: list[tuple[int, ...]]) -> None:
        self.kind = kind
        self.seen = seen

    def __call__(self, inp: Any) -> dict[str, Any]:
        import torch

        b, _, h, w = inp.shape
        self.seen.append(tuple(inp.shape))
        if self.kind == "det":
            return {"maps": torch.zeros(b, 1, h, w)}
        return {"ctc_logits": torch.zeros(b, w // 8, 2), "ctc_use_raw_logits": True}


def _pow2(n: int, cap: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return min(p, cap)


def _runner(s: tuple[int, ...], batch: int) -> tuple[int, ...]:
    """templates/rocmfix_graphs.py's padding: up to the largest batch (MinerU's, once a full
    one was seen), where that at most doubles the rows."""
    return (batch, *s[1:]) if 2 * s[0] >= batch else s


def _up(n: int, step: int) -> int:
    return -(-n // step) * step


def _width_pow2(w: int) -> int:
    p = 320
    while p < w:
        p *= 2
    return min(p, 2560)


SCHEMES: dict[str, dict[str, Callable[[tuple[int, ...]], tuple[int, ...]]]] = {
    "det": {
        "as MinerU calls it": lambda s: s,
        "pad batch (16)": lambda s: (DET_BATCH, *s[1:]),
        "pad batch pow2": lambda s: (_pow2(s[0], DET_BATCH), *s[1:]),
        "runner's padding": lambda s: _runner(s, DET_BATCH),
    },
    "rec": {
        "as MinerU calls it": lambda s: s,
        "pad batch (6)": lambda s: (REC_BATCH, *s[1:]),
        "pad batch pow2": lambda s: (_pow2(s[0], REC_BATCH), *s[1:]),
        "runner's padding": lambda s: _runner(s, REC_BATCH),
        "pad batch, width /64": lambda s: (REC_BATCH, s[1], s[2], _up(s[3], 64)),
        "pad batch, width /128": lambda s: (REC_BATCH, s[1], s[2], _up(s[3], 128)),
        "pad batch, width /256": lambda s: (REC_BATCH, s[1], s[2], _up(s[3], 256)),
        "pad batch, width pow2": lambda s: (REC_BATCH, s[1], s[2], _width_pow2(s[3])),
    },
}


def runner_counts(
    shapes: list[tuple[int, ...]], pad: bool, policy: tuple[int, int] | None = None,
    bucket: int = 0,
) -> dict[str, int]:  # fmt: skip
    """The calls through templates/rocmfix_graphs.py itself (its default caps and capture
    policy, or ``policy``: (MIN_SEEN, PAYBACK); padding on or off; rec's width bucket where
    ``bucket`` is given, as the bucket scheme's patched call passes it), its device side a
    stand-in that captures and replays on the CPU (tests/graphs_fake.py), the model a
    stand-in that returns a row per input row and, as PP-OCRv6 rec does (measured on MinerU
    4.0.12's model), (width + 3) // 8 steps a row."""
    import importlib.util

    import torch

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "tests"))
    from graphs_fake import CpuGraphs

    spec = importlib.util.spec_from_file_location("_shape_runner", root / "templates" /
                                                  "rocmfix_graphs.py")  # fmt: skip
    assert spec is not None and spec.loader is not None
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    runner._BACKEND = CpuGraphs()
    runner.PAD_BATCH = pad
    if policy is not None:
        runner.MIN_SEEN, runner.PAYBACK = policy

    class Rows(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[:, 0, 0, : (x.shape[-1] + 3) // 8, None] * 2

    model = Rows().eval()
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for shape in shapes:
            runner.forward(model, torch.zeros(shape), rocmfix_width_bucket=bucket)
    counts: dict[str, int] = runner.stats(model)["counts"]
    return counts


def summary(shapes: list[tuple[int, ...]]) -> dict[str, Any]:
    counts = collections.Counter(shapes)
    return {
        "calls": len(shapes),
        "distinct": len(counts),
        "seen once": sum(1 for c in counts.values() if c == 1),
        "replayable": sum(c - 1 for c in counts.values()),
        "top": [[list(s), c] for s, c in counts.most_common(8)],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    folder = Path(args.work)
    folder.mkdir(parents=True, exist_ok=True)
    det, rec = _pages.predictors(args.mineru, "cpu", str(folder))
    image = importlib.import_module("mineru.model.ocr.image")
    seen: dict[str, list[tuple[int, ...]]] = {"det": [], "rec": [], "det page": []}
    det.net = Recorder("det", seen["det"])
    rec.net = Recorder("rec", seen["rec"])
    per_doc: dict[str, Any] = {}
    pdfs = _pages.write_pdfs(folder, pages_each=args.pages_each)
    pages_done = 0
    rng = random.Random(1)
    with torch.inference_mode():
        for pdf in pdfs:
            pages = _pages.load_pages([pdf])
            for p in pages:  # a detector's boxes move by a few pixels where the text layer's don't
                p.lines = [
                    tuple(v + rng.uniform(-args.jitter, args.jitter) for v in box)  # type: ignore[misc]
                    for box in p.lines
                ]
            before = {k: len(v) for k, v in seen.items()}
            for start in range(0, len(pages), WINDOW):
                window = pages[start : start + WINDOW]
                crops = [c for p in window for c in _pages.block_crops(p)]
                det.batch_predict(crops, min(len(crops), DET_BATCH))
                rec([c for p in window for c in _pages.line_crops(p, image)])
            det.net = Recorder("det", seen["det page"])
            for p in pages:
                det(np_bgr(p))
            det.net = Recorder("det", seen["det"])
            pages_done += len(pages)
            per_doc[pdf.stem] = {
                "pages": len(pages),
                "lines": sum(len(p.lines) for p in pages),
                "blocks": sum(len(p.blocks) for p in pages),
                **{k: summary(v[before[k] :]) for k, v in seen.items()},
            }
    found: dict[str, Any] = {
        "pages": pages_done,
        "jitter px": args.jitter,
        "documents": per_doc,
        "all": {},
    }
    for model in ("det", "rec"):
        for name, scheme in SCHEMES[model].items():
            found["all"][f"{model}: {name}"] = summary([scheme(s) for s in seen[model]])
    found["all"]["det, whole page"] = summary(seen["det page"])
    found["runner"] = {}
    for model in ("det", "rec"):
        for pad in (False, True):
            name = f"{model}, padding {'on' if pad else 'off'}"
            found["runner"][name] = runner_counts(seen[model], pad, (2, 0))
    # rec's width bucket (the bucket scheme), through the runner as it is now (its capture
    # policy and caps), over the mix and the mix twice.
    for bucket in BUCKETS:
        for mix, calls in (("", seen["rec"]), (", twice", seen["rec"] * 2)):
            name = f"rec{mix}: {f'width bucket {bucket}' if bucket else 'exact'}"
            found["runner"][name] = runner_counts(calls, True, None, bucket)
    found["rec widths"] = sorted(collections.Counter(s[3] for s in seen["rec"]).items())
    # The capture policy (MIN_SEEN, PAYBACK) over the shapes as MinerU calls them, and over
    # the mix twice: what bench/page_gpu.py's 2nd pass sees (every shape once more).
    found["policies"] = {}
    for model, shapes in (("det", seen["det"]), ("rec", seen["rec"]),
                          ("det, whole page", seen["det page"])):  # fmt: skip
        for mix, calls in (("", shapes), (", twice", shapes + shapes)):
            for policy in POLICIES:
                name = f"{model}{mix}: capture at {policy[0]}, payback {policy[1]}"
                found["policies"][name] = runner_counts(calls, True, policy)
    found["shapes"] = seen
    return found


# rec's width buckets weighed for the bucket scheme (0: exact, a graph per width).
BUCKETS = (0, 64, 128, 256, 320, 384, 512)
# (MIN_SEEN, PAYBACK): the old runner's, and the ones weighed for its default.
POLICIES = [(2, 0), (2, 4), (3, 0), (3, 4), (3, 8), (4, 4)]
# A rough price of each call, in eager forwards (H100, docs/performance-graphs.md): a replay
# 0.25-0.45 of one, a capture (warm-up, capture, the first replay, the allocations after) a
# few; only to rank the policies, the GPU page run measures them.
REPLAY, CAPTURE = 0.4, 4.0


def price(c: dict[str, int]) -> float:
    """The calls' estimated time against stock's, in eager forwards (eager = 1.0)."""
    calls = c.get("eager", 0) + c.get("replayed", 0)
    captured = c.get("captured", 0)
    cost = c.get("eager", 0) + (c.get("replayed", 0) - captured) * REPLAY + captured * CAPTURE
    return cost / calls if calls else 1.0


def np_bgr(page: _pages.Page) -> Any:
    import numpy as np

    return np.ascontiguousarray(page.image[:, :, ::-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mineru", required=True, help="a folder holding mineru 4.0.x")
    parser.add_argument("--pages-each", type=int, default=8)
    parser.add_argument("--work", default=tempfile.mkdtemp(prefix="shape_repeat_"))
    parser.add_argument("--json")
    parser.add_argument("--jitter", type=float, default=0.0,
                        help="move each line box's edges by up to this many pixels")  # fmt: skip
    args = parser.parse_args()
    found = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=1))
    print(f"{found['pages']} pages, line boxes moved by up to {args.jitter} px")
    print(f"{'document':<22} pages lines blocks  det calls/distinct  rec calls/distinct")
    for name, d in found["documents"].items():
        print(
            f"{name:<22} {d['pages']:>5} {d['lines']:>5} {d['blocks']:>6}  "
            f"{d['det']['calls']:>9}/{d['det']['distinct']:<8}  "
            f"{d['rec']['calls']:>9}/{d['rec']['distinct']}"
        )
    print(f"\n{'all documents, model: scheme':<36} calls distinct once replayable")
    for name, s in found["all"].items():
        share = s["replayable"] / s["calls"] if s["calls"] else 0
        print(
            f"{name:<36} {s['calls']:>5} {s['distinct']:>8} {s['seen once']:>4} "
            f"{s['replayable']:>5} ({share:.0%})"
        )
    print("\nthrough the runner (8 graphs a model; padding: capture at the 2nd sighting, no"
          " payback; widths: its defaults):")  # fmt: skip
    for name, c in found["runner"].items():
        print(
            f"  {name:<30} captured {c.get('captured', 0):>3} replayed {c.get('replayed', 0):>4}"
            f" eager {c.get('eager', 0):>4} (past the cap {c.get('past the cap', 0)},"
            f" not paying {c.get('not paying', 0)}, bucketed {c.get('bucketed', 0)})"
            f" padded {c.get('padded', 0)} price {price(c):.2f}"
        )
    print(f"\ncapture policies (price: calls' time / stock's, at replay {REPLAY}, capture"
          f" {CAPTURE} eager forwards):")  # fmt: skip
    for name, c in found["policies"].items():
        print(
            f"  {name:<44} captured {c.get('captured', 0):>3} replayed {c.get('replayed', 0):>4}"
            f" eager {c.get('eager', 0):>4} not paying {c.get('not paying', 0):>4}"
            f" price {price(c):.2f}"
        )
    print("\nmost repeated, as MinerU calls them:")
    for model in ("det", "rec"):
        top = found["all"][f"{model}: as MinerU calls it"]["top"]
        print(f"  {model}: " + ", ".join(f"{'x'.join(map(str, s))} ({c})" for s, c in top))


if __name__ == "__main__":
    main()
