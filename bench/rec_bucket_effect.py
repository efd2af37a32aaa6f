"""What rec's width bucket (``rocmfix apply --scheme bucket``) does to the text, with real
weights (issue 41, item 3): a CPU measurement, no GPU needed.

    python bench/rec_bucket_effect.py --mineru SITE --model REC.onnx [--pages-each 2]
        [--json out.json]

SITE holds mineru 4.0.x (``pip install --no-deps --target SITE mineru-4.0.12-...whl``) and
what bench/_pages.py needs; REC.onnx is PaddleOCR's PP-OCRv4 rec model as the PyPI wheel
rapidocr-onnxruntime 1.4.4 ships it (``rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx``,
its character list in the model's metadata), run by onnxruntime on the CPU. PP-OCRv4's rec is
an SVTR-LCNet with a CTC head, an earlier version of the family of MinerU's PP-OCRv5/v6 rec
(same 48-pixel height, same width arithmetic: a step each 8 columns); MinerU's own weights are
not on PyPI, so this stands for them.

The lines are real: bench/_pages.py's documents (fpdf2, rendered at 200 DPI with pypdfium2),
each text line of the PDF's text layer cropped as MinerU crops a box for rec, its text the
ground truth. MinerU's own ``TextRecognizer.__call__`` sorts each document's lines by aspect
ratio, batches them by 6 and pads each batch to its widest line with
``resize_text_recognition_image``; its ``net`` is swapped for a recorder of those batches.
Each batch is then decoded (CTC, greedy: the most likely class a step, repeats merged, blanks
dropped) at MinerU's width (stock) and at each bucketed width (the batch right-padded with
zeros, what the runner does), the bucketed output taken whole (what the runner returns) and
cut back to the stock's sequence length (what its first version returned). Spaces are left
out of every comparison (the text layer has none; CTC's spaces follow the glyph gaps).

It reports, per bucket: the calls bucketed (a wider batch than MinerU's), the lines whose text
differs from the stock decode (count, share), the characters that differ (edit distance),
each side's character error rate and exact lines against the PDF's text, and whether the
first version's length rule (:func:`_length`: a step each stride columns, from a stock call
at a width of the same remainder) gives the stock length on every call.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _pages

BATCH = 6  # MinerU's rec batch
BUCKETS = "128,256,320,320x2^k"  # --buckets: multiples of a width, or 320 x a power of two


def bucketed(width: int, bucket: str) -> int:
    if bucket.isdigit():
        return -(-width // int(bucket)) * int(bucket)
    wide = 320
    while wide < width:
        wide *= 2
    return wide


def distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions)."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


class Batches:
    """Stands for ``TextRecognizer.net``: keeps each batch as MinerU made it; returns blank
    logits so that MinerU's own decoder runs on (its text is not used)."""

    def __init__(self) -> None:
        self.seen: list[np.ndarray] = []

    def __call__(self, inp: Any) -> dict[str, Any]:
        import torch

        self.seen.append(inp.numpy().copy())
        return {"ctc_logits": torch.zeros(inp.shape[0], inp.shape[-1] // 8, 2),
                "ctc_use_raw_logits": True}  # fmt: skip


class Rec:
    """PP-OCRv4's rec in onnxruntime, and its CTC decoder."""

    def __init__(self, model: str, threads: int) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        meta = self.session.get_modelmeta().custom_metadata_map
        # PaddleOCR's CTCLabelDecode: blank first, then the dictionary, then the space.
        self.chars = ["", *meta["character"].splitlines(), " "]
        self.input = self.session.get_inputs()[0].name

    def logits(self, batch: np.ndarray) -> np.ndarray:
        out: np.ndarray = self.session.run(None, {self.input: batch})[0]
        return out

    def decode(self, logits: np.ndarray) -> list[str]:
        texts = []
        for best in logits.argmax(axis=2):
            kept = [c for i, c in enumerate(best) if c and (i == 0 or c != best[i - 1])]
            texts.append("".join(self.chars[c] for c in kept).replace(" ", ""))
        return texts


def _length(lengths: dict[int, int], stride: int, width: int) -> int | None:
    """The runner's first version's rule (it cut the output back; the runner now returns it
    whole)."""
    for known, length in lengths.items():
        if (width - known) % stride == 0:
            return length + (width - known) // stride
    return None


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    _, recognizer = _pages.predictors(args.mineru, "cpu", str(work))
    image = importlib.import_module("mineru.model.ocr.image")
    recorder = recognizer.net = Batches()
    truth: list[list[str]] = []  # per batch, its rows' text, in MinerU's sorted order
    with torch.inference_mode():
        for pdf in _pages.write_pdfs(work, pages_each=args.pages_each):
            pages = _pages.load_pages([pdf])
            for first in range(0, len(pages), 64):  # MinerU's window
                texts: list[str] = []
                crops = [
                    c for p in pages[first : first + 64] for c in _pages.line_crops(p, image, texts)
                ]
                # MinerU's order (np.argsort of the same ratios), to know each row's text.
                order = np.argsort(np.array([c.shape[1] / float(c.shape[0]) for c in crops]))
                recognizer(crops)
                for b in range(0, len(crops), BATCH):
                    truth.append([texts[i] for i in order[b : b + BATCH]])
    assert len(truth) == len(recorder.seen), (len(truth), len(recorder.seen))
    rec = Rec(args.model, args.threads)
    rows: list[dict[str, Any]] = []
    lengths: dict[int, int] = {}  # stock lengths by width, as the runner notes them
    start = time.perf_counter()
    for batch, gt in zip(recorder.seen, truth, strict=True):
        width = batch.shape[-1]
        stock = rec.logits(batch)
        steps = stock.shape[1]
        row: dict[str, Any] = {"width": width, "steps": steps, "truth": gt,
                               "stock": rec.decode(stock), "buckets": {}}  # fmt: skip
        for bucket in args.buckets.split(","):
            wide = bucketed(width, bucket)
            if wide == width:
                row["buckets"][bucket] = {"wide": wide}
                continue
            out = rec.logits(np.pad(batch, ((0, 0), (0, 0), (0, 0), (0, wide - width))))
            stride = wide // out.shape[1] if wide % out.shape[1] == 0 else 0
            rule = _length({**lengths, wide: out.shape[1]}, stride, width) if stride else None
            row["buckets"][bucket] = {
                "wide": wide,
                "whole": rec.decode(out),
                # What the runner's first version returned: cut back where its rule knew the
                # length, else the stock call's.
                "cut": rec.decode(out[:, :rule]) if rule else row["stock"],
                "rule": rule,
            }
        lengths.setdefault(width, steps)
        rows.append(row)
        if time.perf_counter() - start > args.seconds:
            print(f"stopped at {len(rows)} of {len(truth)} batches (--seconds)", file=sys.stderr)
            break
    return {"batches": rows, "summary": summarise(rows, args.buckets.split(","))}


def summarise(rows: list[dict[str, Any]], buckets: list[str]) -> dict[str, Any]:
    lines = sum(len(r["truth"]) for r in rows)
    truth_chars = sum(len(t) for r in rows for t in r["truth"])

    def against_truth(texts: list[tuple[str, str]]) -> dict[str, Any]:
        errors = sum(distance(p, t) for p, t in texts)
        return {"cer": errors / truth_chars, "exact lines": sum(p == t for p, t in texts)}

    stock = [(p, t) for r in rows for p, t in zip(r["stock"], r["truth"], strict=True)]
    found: dict[str, Any] = {"batches": len(rows), "lines": lines, "truth chars": truth_chars,
                             "stock": against_truth(stock)}  # fmt: skip
    for bucket in buckets:
        done = [r for r in rows if "whole" in r["buckets"][bucket]]
        rules = [r["buckets"][bucket]["rule"] for r in done]
        each: dict[str, Any] = {
            "calls bucketed": len(done),
            "rule gives the stock length": sum(
                a == r["steps"] for a, r in zip(rules, done, strict=True)
            ),
            "rule gives no length": rules.count(None),
            "rule gives another length": sum(
                a not in (None, r["steps"]) for a, r in zip(rules, done, strict=True)
            ),
        }
        for how in ("whole", "cut"):
            pairs = [
                (r["buckets"][bucket].get(how, r["stock"])[i], r["stock"][i], r["truth"][i])
                for r in rows
                for i in range(len(r["truth"]))
            ]
            changed = [(b, s, t) for b, s, t in pairs if b != s]
            each[how] = {
                "lines changed": len(changed),
                "share changed": len(changed) / lines,
                "chars changed": sum(distance(b, s) for b, s, _ in changed),
                **against_truth([(b, t) for b, _, t in pairs]),
                "examples": [{"stock": s, "bucketed": b, "truth": t} for b, s, t in changed[:8]],
            }
        found[bucket] = each
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mineru", required=True, help="a folder holding mineru 4.0.x")
    parser.add_argument("--model", required=True, help="PP-OCRv4's rec ONNX (rapidocr 1.4.4)")
    parser.add_argument("--pages-each", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--buckets", default=BUCKETS)
    parser.add_argument("--seconds", type=float, default=1800, help="stop decoding after this")
    parser.add_argument("--work", default=tempfile.mkdtemp(prefix="rec_bucket_"))
    parser.add_argument("--json")
    args = parser.parse_args()
    found = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=1, ensure_ascii=False))
    s = found["summary"]
    stock = s["stock"]
    print(f"{s['lines']} lines in {s['batches']} batches ({s['truth chars']} characters);"
          f" stock: CER {stock['cer']:.2%}, exact lines {stock['exact lines']}")  # fmt: skip
    print(f"{'bucket':<9} {'output':<6} {'bucketed':>8} {'lines changed':>14} {'chars':>6}"
          f" {'CER':>7} {'exact':>6}  runner's length rule (stock / none / other)")  # fmt: skip
    for bucket in args.buckets.split(","):
        each = s[bucket]
        for how in ("whole", "cut"):
            e = each[how]
            print(
                f"{bucket:<9} {how:<6} {each['calls bucketed']:>8} {e['lines changed']:>6}"
                f" ({e['share changed']:>5.1%}) {e['chars changed']:>6} {e['cer']:>7.2%}"
                f" {e['exact lines']:>6}  {each['rule gives the stock length']} /"
                f" {each['rule gives no length']} / {each['rule gives another length']}"
            )
    for bucket in args.buckets.split(","):
        for example in s[bucket]["cut"]["examples"][:3]:
            print(f"  {bucket}, cut: {example}")


if __name__ == "__main__":
    main()
