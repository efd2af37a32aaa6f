"""What a det size bucket does to MinerU 4.0's OCR output, with real weights (issue 41, item 3;
docs/performance-graphs.md): a CPU measurement, no GPU needed.

    python bench/det_bucket_effect.py --mineru SITE --det DET.onnx --rec REC.onnx
        [--pages-each 2] [--seconds 1200] [--json out.json]

SITE holds mineru 4.0.x (``pip install --no-deps --target SITE``) and what bench/_pages.py
needs; DET.onnx, REC.onnx: PaddleOCR's PP-OCRv4 det (DB) and rec from rapidocr-onnxruntime
1.4.4, run by onnxruntime as the ``net`` of MinerU's ``TextDetector`` and ``TextRecognizer``.
MinerU 4.0's OCR stage itself (``_ocr_det``, ``_apply_ocr_rec_results``) reads each document of
bench/_pages.py's mix, each text-layer block a text block; stock, then with each det bucket
(the normalised batch padded at the bottom and right up to multiples of B, by its edge or
zeros, the map cut back). Against stock: DB's boxes per crop, each block's text, its CER
against the block's text-layer lines (spaces left out), and the det input shapes.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _pages
from rec_bucket_effect import Rec, distance

# name: (B, np.pad mode); B = 0 is stock.
VARIANTS = {"stock": (0, ""), "B=160": (160, "edge"), "B=320": (320, "edge"),
            "B=480": (480, "edge"), "B=320 zeros": (320, "constant")}  # fmt: skip
WINDOW = 64


class Det:
    """Stands for ``TextDetector.net``: PP-OCRv4 det, its input bucketed where ``bucket``."""

    def __init__(self, model: str, threads: int) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name
        self.bucket, self.mode = 0, ""
        self.shapes: list[tuple[int, ...]] = []

    def __call__(self, inp: Any) -> dict[str, Any]:
        import torch

        x = inp.float().numpy()
        h, w = x.shape[-2:]
        if self.bucket:  # H and W up to the next multiples of B, at the bottom and right
            grow = ((0, 0), (0, 0), (0, -h % self.bucket), (0, -w % self.bucket))
            x = np.pad(x, grow, mode=self.mode)
        self.shapes.append(tuple(x.shape))
        maps = self.session.run(None, {self.input: x})[0]
        assert maps.shape[-2:] == x.shape[-2:], maps.shape
        return {"maps": torch.from_numpy(np.ascontiguousarray(maps[..., :h, :w]))}


class RecNet:
    """Stands for ``TextRecognizer.net``: PP-OCRv4 rec. MinerU's decoder reads raw logits
    (``ctc_use_raw_logits``: the argmax, and softmax's top value as the score); the log of the
    model's probabilities gives it both exactly."""

    def __init__(self, rec: Rec) -> None:
        self.rec = rec

    def __call__(self, inp: Any) -> dict[str, Any]:
        import torch

        probs = self.rec.logits(np.ascontiguousarray(inp.float().numpy()))
        return {"ctc_logits": torch.from_numpy(np.log(np.maximum(probs, 1e-30))),
                "ctc_use_raw_logits": True}  # fmt: skip


class Boxes:
    """Stands for ``ocr_model``: MinerU's detector, keeping what ``batch_predict`` found per
    crop; ``ocr(crops, det=False)`` as ``PytorchPaddleOCR.ocr`` does it for a list."""

    def __init__(self, det: Any, rec: Any) -> None:
        self.text_detector, self.rec = self, rec
        self.det = det
        self.found: list[np.ndarray] = []

    def batch_predict(self, *args: Any, **kwargs: Any) -> Any:
        out = self.det.batch_predict(*args, **kwargs)
        self.found.extend(np.zeros((0, 4, 2)) if b is None else np.asarray(b) for b, _ in out)
        return out

    def ocr(self, crops: list[np.ndarray], det: bool, **kwargs: Any) -> list[Any]:
        assert not det
        return [self.rec(crops, **kwargs)[0]]


def window_ocr(ocr: Any, model: Boxes, pages: list[_pages.Page]) -> list[list[str]]:
    """MinerU 4.0's OCR stage on a window, each block its own entry (as if its own page, the
    page's image shared: the crops and batches are the same): its lines' text, no spaces."""
    images, blocks = [], []
    for p in pages:
        h, w = p.image.shape[:2]
        for x0, y0, x1, y1 in p.blocks:  # normalised; + 0.5: int() gives the pixel back
            box = [(x0 + 0.5) / w, (y0 + 0.5) / h, (x1 + 0.5) / w, (y1 + 0.5) / h]
            images.append(p.image)
            blocks.append([{"type": ocr.BlockType.TEXT, "bbox": box}])
    context = SimpleNamespace(ocr_model=model)
    found = ocr._ocr_det(context, images, blocks, [[] for _ in blocks], True,
                         ocr.PIPELINE_DET_TYPE)  # fmt: skip
    ocr._apply_ocr_rec_results(context, found)
    return [[r["text"].replace(" ", "") for r in block] for block in found]


def truths(pages: list[_pages.Page], sorted_boxes: Any) -> list[str]:
    """Each block's text-layer lines (centre inside it), in MinerU's ``sorted_boxes`` order."""
    out = []
    for p in pages:
        for x0, y0, x1, y1 in p.blocks:
            boxes, texts = [], {}
            for (a, b, c, d), text in zip(p.lines, p.texts, strict=True):
                if x0 <= (a + c) / 2 <= x1 and y0 <= (b + d) / 2 <= y1:
                    boxes.append(np.array([[a, b], [c, b], [c, d], [a, d]]))
                    texts[id(boxes[-1])] = text
            out.append("".join(texts[id(q)] for q in sorted_boxes(boxes)))
    return out


def moves(stock: np.ndarray, other: np.ndarray) -> list[float]:
    """Each stock box's largest corner move to the nearest box of ``other`` (inf: none)."""
    if not len(other):
        return [float("inf")] * len(stock)
    diff = np.abs(stock[:, None].astype(float) - other[None].astype(float)).max(axis=(2, 3))
    return [float(v) for v in diff.min(axis=1)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    det, recognizer = _pages.predictors(args.mineru, "cpu", str(work))
    ocr = importlib.import_module("mineru.backend.analysis.pdf.ocr")
    geometry = importlib.import_module("mineru.model.ocr.geometry")
    decode = importlib.import_module("mineru.model._internal.pytorchocr.postprocess")
    rec = Rec(args.rec, args.threads)
    chars = work / "ppocrv4_keys.txt"  # PP-OCRv4's characters, for MinerU's CTC decoder
    chars.write_text("\n".join(rec.chars[1:-1]) + "\n", encoding="utf-8")
    recognizer.postprocess_op = decode.build_post_process(
        {"name": "CTCLabelDecode", "character_dict_path": str(chars), "use_space_char": True}
    )
    recognizer.net = RecNet(rec)
    det.net = Det(args.det, args.threads)
    found: dict[str, Any] = {"blocks": [], "shapes": {v: [] for v in VARIANTS}}
    start = time.perf_counter()
    for pdf in _pages.write_pdfs(work, pages_each=args.pages_each):
        pages = _pages.load_pages([pdf])
        for first in range(0, len(pages), WINDOW):
            window = pages[first : first + WINDOW]
            rows = [{"block": f"{pdf.stem}:{i}", "truth": t, "boxes": {}, "lines": {}}
                    for i, t in enumerate(truths(window, geometry.sorted_boxes))]  # fmt: skip
            for name, (bucket, mode) in VARIANTS.items():
                det.net.bucket, det.net.mode = bucket, mode
                model = Boxes(det, recognizer)
                det.net.shapes = found["shapes"][name]
                for row, lines in zip(rows, window_ocr(ocr, model, window), strict=True):
                    row["lines"][name] = lines
                for row, boxes in zip(rows, model.found, strict=True):
                    row["boxes"][name] = boxes.reshape(-1, 4, 2).tolist()
            found["blocks"] += rows
            print(f"{pdf.stem} pages {first + 1}-{first + len(window)}: {len(rows)} blocks,"
                  f" {time.perf_counter() - start:.0f} s", file=sys.stderr)  # fmt: skip
        if time.perf_counter() - start > args.seconds:
            print("stopped after this document (--seconds)", file=sys.stderr)
            break
    found["seconds"] = time.perf_counter() - start
    found["summary"] = summarise(found)
    return found


def summarise(found: dict[str, Any]) -> dict[str, Any]:
    blocks = found["blocks"]
    for b in blocks:
        b["text"] = {name: "".join(lines) for name, lines in b["lines"].items()}
    truth_chars = sum(len(b["truth"]) for b in blocks)
    errors = {b["block"]: distance(b["text"]["stock"], b["truth"]) for b in blocks}
    out: dict[str, Any] = {"blocks": len(blocks), "truth chars": truth_chars}
    for name in VARIANTS:
        shapes = {tuple(s) for s in found["shapes"][name]}
        calls = len(found["shapes"][name])
        move = [m for b in blocks for m in moves(*(np.array(b["boxes"][v]).reshape(-1, 4, 2)
                                                   for v in ("stock", name)))]  # fmt: skip
        changed = [b for b in blocks if b["text"][name] != b["text"]["stock"]]
        closer = [distance(b["text"][name], b["truth"]) - errors[b["block"]] for b in changed]
        lines = [(Counter(b["lines"]["stock"]), Counter(b["lines"][name])) for b in blocks]
        otherwise = sum((old - new).total() for old, new in lines)
        out[name] = {
            "calls": calls,
            "distinct shapes": len(shapes),
            "calls at a shape seen before": calls - len(shapes),
            "pixels vs stock": sum(map(np.prod, found["shapes"][name]))
            / sum(map(np.prod, found["shapes"]["stock"])),
            "boxes": sum(len(b["boxes"][name]) for b in blocks),
            "crops, same box count": sum(
                len(b["boxes"][name]) == len(b["boxes"]["stock"]) for b in blocks
            ),
            "stock boxes within 1 px": sum(m <= 1 for m in move),
            "stock boxes within 3 px": sum(m <= 3 for m in move),
            "largest corner move": max(move, default=0.0),
            "blocks changed": len(changed),
            "chars changed": sum(distance(b["text"][name], b["text"]["stock"]) for b in changed),
            "share of blocks changed": len(changed) / len(blocks),
            "stock lines read otherwise": otherwise,
            "share of lines read otherwise": otherwise / sum(old.total() for old, _ in lines),
            "blocks nearer the text layer": sum(c < 0 for c in closer),
            "blocks further from it": sum(c > 0 for c in closer),
            "cer": (sum(errors.values()) + sum(closer)) / truth_chars,
            "exact blocks": sum(b["text"][name] == b["truth"] for b in blocks),
            "examples": [_where(b["text"]["stock"], b["text"][name], b["truth"]) for b in changed],
        }
    return out


def _where(stock: str, other: str, truth: str) -> str:
    """The first difference, with 12 characters either side."""
    i = next((i for i, (a, b) in enumerate(zip(stock, other, strict=False)) if a != b),
             min(len(stock), len(other)))  # fmt: skip
    cut = slice(max(0, i - 12), i + 12)
    return f"stock {stock[cut]!r}, bucketed {other[cut]!r}, text layer {truth[cut]!r}"


# header: summary key. Boxes: DB's per crop against stock's (same n: crops with as many;
# <=1px, <=3px: stock boxes the nearest box is within, every corner; moved: the largest corner
# move). Text: blocks changed, + / -: nearer the text layer / further; lines: stock's lines
# read otherwise; chars: edit distance to stock; CER and exact blocks against the text layer.
TABLES = [
    {"calls": "calls", "shapes": "distinct shapes", "again": "calls at a shape seen before",
     "pixels": "pixels vs stock", "boxes": "boxes", "same n": "crops, same box count",
     "<=1px": "stock boxes within 1 px", "<=3px": "stock boxes within 3 px",
     "moved": "largest corner move"},
    {"blocks": "blocks changed", "share": "share of blocks changed",
     "+": "blocks nearer the text layer", "-": "blocks further from it",
     "lines": "stock lines read otherwise", "share ": "share of lines read otherwise",
     "chars": "chars changed", "CER": "cer", "exact": "exact blocks"},
]  # fmt: skip


def _cell(key: str, value: float, width: int) -> str:
    if key == "cer" or key.startswith("share"):
        return f"{value:>{width}.{3 if key == 'cer' else 1}%}"
    return f"{value:>{width}.{2 if key.startswith('pixels') else 0}f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mineru", help="a folder holding mineru 4.0.x")
    parser.add_argument("--det", help="PP-OCRv4's det ONNX (rapidocr 1.4.4)")
    parser.add_argument("--rec", help="PP-OCRv4's rec ONNX (rapidocr 1.4.4)")
    parser.add_argument("--pages-each", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=1200, help="no new document after this")
    parser.add_argument("--work", default=tempfile.mkdtemp(prefix="det_bucket_"))
    parser.add_argument("--json", help="write the run here")
    parser.add_argument("--read", help="a --json of an earlier run: its summary again, no run")
    args = parser.parse_args()
    if args.read:
        found = json.loads(Path(args.read).read_text())
        found["summary"] = summarise(found)
    else:
        found = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=1, ensure_ascii=False))
    s = found["summary"]
    print(f"{s['blocks']} blocks, {s['truth chars']} characters of text layer,"
          f" {found['seconds']:.0f} s")  # fmt: skip
    for columns in TABLES:
        print("\n" + " ".join(f"{h:>{max(5, len(h))}}" for h in ("det".ljust(12), *columns)))
        for name in VARIANTS:
            print(" ".join([name.ljust(12)] + [_cell(k, s[name][k], max(5, len(h)))
                                               for h, k in columns.items()]))  # fmt: skip
    for name in list(VARIANTS)[1:]:
        for example in s[name]["examples"][:4]:
            print(f"  {name}: {example}")


if __name__ == "__main__":
    main()
