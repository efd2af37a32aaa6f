"""A realistic page mix for issue 41's shape and page benchmarks, and MinerU 4.0's own OCR
predictors built with random weights (bench/shape_repeat.py, bench/page_gpu.py).

Pages: PDFs written here with fpdf2 (single-column prose on Letter, a two-column paper on
A4, tables on A4, prose on A5, a landscape slide deck), their text lines read back from the
PDF's text layer with pypdfium2 (MinerU's PDF library), pages rendered at 200 DPI (docvortex's
``DEFAULT_PDF_IMAGE_DPI``, what MinerU renders at). Models with random weights find no text,
so the text layer stands in for what layout and det would find:

- a *line* is a run of characters on one baseline with no gap wider than twice their height
  (a table's cells are lines of their own), its box the characters' loose boxes (the font's
  ascent to descent: about the region DB's unclipped box covers);
- a *block* (a layout region MinerU hands det) is a run of lines in text order whose vertical
  gap is under half a line height and which overlap horizontally; MinerU crops each with 50 px
  of white around it (``crop_img(..., crop_paste_x=50, crop_paste_y=50)``).

Needs numpy, fpdf2 (and its fonttools, defusedxml, pillow), pypdfium2; the predictors need
mineru 4.0.x (``--no-deps``), torch, pyyaml, docvortex (its ``image`` and ``geometry``
modules: numpy only), shapely, pyclipper.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import random
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

DPI = 200
WORDS = (  # noqa: SIM905 - prose reads better than a list of 70 strings
    "the of and to in is for that with as on by this are be we from at an which model data "
    "results method using table figure each section page network training performance value "
    "analysis paper shown based two than our these learning between system time more can "
    "approach document layout detection recognition text line image first where error both "
    "number 2026 0.85 12.4% (see 3.1) [17] equation measured rate baseline proposed dataset"
).split()


@dataclass
class Page:
    name: str
    image: np.ndarray  # H x W x 3 uint8, RGB
    lines: list[tuple[float, float, float, float]]  # pixel boxes x0, y0, x1, y1
    blocks: list[tuple[int, int, int, int]]
    texts: list[str] = field(default_factory=list)  # each line's characters, spaces left out


def _sentence(rng: random.Random, n: int) -> str:
    words = [rng.choice(WORDS) for _ in range(n)]
    return " ".join(words).capitalize() + "."


def _paragraph(rng: random.Random) -> str:
    return " ".join(_sentence(rng, rng.randint(6, 22)) for _ in range(rng.randint(2, 7)))


def write_pdfs(folder: Path, pages_each: int = 4, seed: int = 0) -> list[Path]:
    """Five documents of ``pages_each`` pages (the deck twice as many)."""
    from fpdf import FPDF

    rng = random.Random(seed)
    out = []

    def doc(fmt: Any, orientation: str = "P") -> Any:
        pdf = FPDF(orientation=orientation, unit="pt", format=fmt)
        pdf.set_auto_page_break(True, margin=54)
        pdf.set_margins(60, 54, 60)
        return pdf

    def save(pdf: Any, name: str) -> None:
        path = folder / name
        pdf.output(str(path))
        out.append(path)

    pdf = doc("letter")  # single-column prose: headings, paragraphs, page numbers
    for p in range(pages_each):
        pdf.add_page()
        pdf.set_font("Times", "B", 16)
        pdf.multi_cell(0, 20, f"{p + 1}. " + _sentence(rng, 5)[:-1], new_x="LMARGIN", new_y="NEXT")
        while pdf.get_y() < 640:
            pdf.set_font("Times", "", 11)
            pdf.multi_cell(0, 14, _paragraph(rng), new_x="LMARGIN", new_y="NEXT")
            pdf.ln(6)
        pdf.set_font("Times", "", 9)
        pdf.set_xy(300, 724)
        pdf.cell(20, 10, str(p + 1))
    save(pdf, "prose_letter.pdf")

    pdf = doc("A4")  # a two-column paper
    for p in range(pages_each):
        pdf.add_page()
        if p == 0:
            pdf.set_font("Helvetica", "B", 15)
            pdf.multi_cell(0, 19, _sentence(rng, 9), align="C", new_x="LMARGIN", new_y="NEXT")
            pdf.set_font("Helvetica", "I", 9)
            pdf.multi_cell(0, 11, _paragraph(rng), new_x="LMARGIN", new_y="NEXT")
            pdf.ln(8)
        pdf.set_font("Times", "", 9.5)
        with pdf.text_columns(ncols=2, gutter=18, text_align="J", l_margin=60, r_margin=60) as cols:
            for _ in range(11):
                cols.write(text=_paragraph(rng) + "\n")
                cols.ln()
    save(pdf, "paper_a4_two_column.pdf")

    pdf = doc("A4")  # tables with a caption and a little prose
    tables: dict[int, list[tuple[float, float]]] = {}
    for _p in range(pages_each):
        pdf.add_page()
        for _t in range(2):
            pdf.set_font("Helvetica", "", 9)
            pdf.multi_cell(0, 12, "Table: " + _sentence(rng, 10), new_x="LMARGIN", new_y="NEXT")
            ncols = rng.randint(3, 7)
            start = (pdf.page_no(), pdf.get_y())
            with pdf.table(line_height=12, first_row_as_headings=True) as table:
                for r in range(rng.randint(6, 14)):
                    row = table.row()
                    for c in range(ncols):
                        if r == 0 or c == 0:
                            row.cell(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3))))
                        else:
                            row.cell(f"{rng.uniform(0, 1000):.{rng.randint(0, 3)}f}")
            _table_region(tables, start, (pdf.page_no(), pdf.get_y()), pdf.h)
            pdf.ln(10)
            pdf.set_font("Times", "", 10)
            pdf.multi_cell(0, 13, _paragraph(rng), new_x="LMARGIN", new_y="NEXT")
    save(pdf, "tables_a4.pdf")
    # Where the tables are: a layout model finds a table whole, not cell by cell.
    (folder / "tables_a4.json").write_text(json.dumps(tables))

    pdf = doc((419.53, 595.28))  # a small-format booklet (A5)
    pdf.set_margins(40, 40, 40)
    for _ in range(pages_each):
        pdf.add_page()
        while pdf.get_y() < 500:
            pdf.set_font("Times", "", 10)
            pdf.multi_cell(0, 13, _paragraph(rng), new_x="LMARGIN", new_y="NEXT")
            pdf.ln(4)
    save(pdf, "booklet_a5.pdf")

    pdf = doc((540, 960), "L")  # 16:9 slides: titles and bullets
    for _ in range(pages_each * 2):
        pdf.add_page()
        pdf.set_font("Helvetica", "B", 28)
        pdf.multi_cell(0, 34, _sentence(rng, 6)[:-1], new_x="LMARGIN", new_y="NEXT")
        pdf.ln(10)
        pdf.set_font("Helvetica", "", 18)
        for _ in range(rng.randint(3, 6)):
            pdf.multi_cell(0, 24, "- " + _sentence(rng, rng.randint(4, 14)), new_x="LMARGIN",
                           new_y="NEXT")  # fmt: skip
    save(pdf, "slides_16x9.pdf")
    return out


def _table_region(found: dict[int, list[tuple[float, float]]], start: tuple[int, float],
                  end: tuple[int, float], height: float) -> None:  # fmt: skip
    if start[0] == end[0]:
        found.setdefault(start[0], []).append((start[1], end[1]))
    else:
        found.setdefault(start[0], []).append((start[1], height))
        found.setdefault(end[0], []).append((0.0, end[1]))


def _lines(textpage: Any, page_height: float, texts: list[str] | None = None
           ) -> list[tuple[float, float, float, float]]:  # fmt: skip
    """Runs of characters on one baseline (PDF points, top-left origin); each run's characters
    (spaces left out) appended to ``texts`` where given."""
    runs: list[list[float]] = []
    cur: list[float] | None = None
    for i in range(textpage.count_chars()):
        ch = textpage.get_text_range(i, 1)
        if not ch.strip():
            continue
        x0, y0, x1, y1 = textpage.get_charbox(i, loose=True)  # left, bottom, right, top
        top, bottom = page_height - y1, page_height - y0
        h = bottom - top
        if h <= 0:
            continue
        if cur is not None:
            same_line = abs((top + bottom) / 2 - (cur[1] + cur[3]) / 2) < 0.5 * h
            if same_line and x0 - cur[2] < 2 * h and x0 >= cur[0]:
                cur[2], cur[1], cur[3] = max(cur[2], x1), min(cur[1], top), max(cur[3], bottom)
                if texts is not None:
                    texts[-1] += ch
                continue
            runs.append(cur)
        cur = [x0, top, x1, bottom]
        if texts is not None:
            texts.append(ch)
    if cur is not None:
        runs.append(cur)
    return [(a, b, c, d) for a, b, c, d in runs]


def _blocks(lines: list[tuple[float, float, float, float]],
            tables: list[tuple[float, float]]) -> list[tuple[float, ...]]:  # fmt: skip
    blocks: list[list[float]] = []
    in_table: dict[int, list[float]] = {}
    for x0, y0, x1, y1 in lines:
        table = next((i for i, (t0, t1) in enumerate(tables) if t0 <= (y0 + y1) / 2 <= t1), None)
        if table is not None:
            b = in_table.get(table)
            if b is None:
                b = in_table[table] = [x0, y0, x1, y1]
                blocks.append(b)
            b[0], b[1], b[2], b[3] = min(b[0], x0), min(b[1], y0), max(b[2], x1), max(b[3], y1)
            continue
        if blocks and not any(blocks[-1] is t for t in in_table.values()):
            b = blocks[-1]
            gap = y0 - b[3]
            overlap = min(x1, b[2]) - max(x0, b[0])
            if -0.5 * (y1 - y0) < gap < 0.5 * (y1 - y0) and overlap > 0.3 * min(
                x1 - x0, b[2] - b[0]
            ):
                b[0], b[1], b[2], b[3] = min(b[0], x0), min(b[1], y0), max(b[2], x1), max(b[3], y1)
                continue
        blocks.append([x0, y0, x1, y1])
    return [tuple(b) for b in blocks]


def load_pages(paths: list[Path], limit: int | None = None) -> list[Page]:
    import pypdfium2 as pdfium

    pages = []
    scale = DPI / 72
    for path in paths:
        sidecar = path.with_suffix(".json")
        tables = json.loads(sidecar.read_text()) if sidecar.exists() else {}
        pdf = pdfium.PdfDocument(str(path))
        for index in range(len(pdf)):
            page = pdf[index]
            height = page.get_height()
            texts: list[str] = []
            lines = _lines(page.get_textpage(), height, texts)
            image = page.render(scale=scale).to_numpy()[:, :, :3].copy()
            ih, iw = image.shape[:2]
            px = [
                (x0 * scale, y0 * scale, min(iw - 1.0, x1 * scale), min(ih - 1.0, y1 * scale))
                for x0, y0, x1, y1 in lines
            ]
            blocks = [
                (int(a * scale), int(b * scale), min(iw, int(c * scale) + 1),
                 min(ih, int(d * scale) + 1))
                for a, b, c, d in _blocks(lines, tables.get(str(index + 1), []))
            ]  # fmt: skip
            pages.append(Page(f"{path.stem}:{index + 1}", image, px, blocks, texts))
            if limit is not None and len(pages) >= limit:
                return pages
    return pages


def block_crops(page: Page, paste: int = 50) -> list[np.ndarray]:
    """Each block as MinerU hands it to det: cropped, 50 px of white around it, BGR (what
    docvortex's ``crop_img`` and ``rgb_to_bgr`` make of it)."""
    crops = []
    for x0, y0, x1, y1 in page.blocks:
        canvas = np.full((y1 - y0 + 2 * paste, x1 - x0 + 2 * paste, 3), 255, np.uint8)
        canvas[paste : paste + y1 - y0, paste : paste + x1 - x0] = page.image[y0:y1, x0:x1]
        crops.append(np.ascontiguousarray(canvas[:, :, ::-1]))
    return crops


def line_crops(page: Page, mineru_image: Any, texts: list[str] | None = None) -> list[np.ndarray]:
    """Each text line cropped as MinerU crops a det box for rec
    (``get_rotate_crop_image_for_text_rec``), from the BGR page; the text of each line kept
    appended to ``texts`` where given."""
    bgr = np.ascontiguousarray(page.image[:, :, ::-1])
    crops = []
    for index, (x0, y0, x1, y1) in enumerate(page.lines):
        pts = np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=np.float32)
        crop = mineru_image.get_rotate_crop_image_for_text_rec(bgr, pts)
        if crop is not None and min(crop.shape[:2]) > 0:
            crops.append(crop)
            if texts is not None:
                texts.append(page.texts[index])
    return crops


# -- MinerU's own predictors -----------------------------------------------------------------

OCR = "mineru.model._internal.pytorchocr"
# MinerU 4.0's arch table has no orientation classifier (it builds its OCR with
# ``use_angle_cls`` off and ships no cls weights); this is PaddleOCR's mobile v2.0 classifier,
# the one older MinerU releases shipped.
CLS_NAME = "ch_ptocr_mobile_v2.0_cls_infer"
CLS_ARCH = {
    "model_type": "cls",
    "algorithm": "CLS",
    "Transform": None,
    "Backbone": {"name": "MobileNetV3", "scale": 0.35, "model_name": "small"},
    "Neck": None,
    "Head": {"name": "ClsHead", "class_dim": 2},
}
ARCH = {"det": "ch_PP-OCRv6_tiny_det_infer", "rec": "ch_PP-OCRv6_small_rec_infer", "cls": CLS_NAME}


def import_mineru(root: str) -> None:
    """``mineru`` from ``root`` without its package __init__ (which imports the whole document
    stack and its services)."""
    stub = types.ModuleType("mineru")
    stub.__path__ = [os.path.join(root, "mineru")]
    sys.modules["mineru"] = stub
    for name in ("mineru.model", "mineru.model.ocr"):
        # Their __init__ files import model registries (and the hub) the OCR path never uses.
        module = types.ModuleType(name)
        module.__path__ = [os.path.join(root, *name.split("."))]
        sys.modules[name] = module


def randomized(net: Any) -> Any:
    """Seed-0 weights made to look trained where it matters for speed: batch norms with
    spread-out statistics (a fresh one is the identity)."""
    import torch

    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    return net


def _ocr_args(root: str, device: str, weights_dir: str) -> Any:
    """``PytorchPaddleOCR``'s arguments (its defaults, ``rec_batch_num=6``), with det, rec and
    cls weight files written here (random, seed 0) under the names MinerU's arch table knows
    (cls: :data:`CLS_ARCH`, which :func:`page_models` adds to that table)."""
    import torch
    import yaml

    import_mineru(root)
    utility = importlib.import_module(OCR + ".infer.pytorchocr_utility")
    base = importlib.import_module(OCR + ".modeling.architectures.base_model")
    resources = importlib.import_module("mineru.model.ocr.resources")
    with open(utility.DEFAULT_CFG_PATH, encoding="utf-8") as f:
        arch = {**yaml.safe_load(f), CLS_NAME: CLS_ARCH}
    paths = {}
    for model, name in ARCH.items():
        path = os.path.join(weights_dir, name + ".pth")
        paths[model] = path
        if not os.path.exists(path):
            torch.manual_seed(0)
            torch.save(randomized(base.BaseModel(copy.deepcopy(arch[name]))).state_dict(), path)
    args = utility.init_args().parse_args([])
    args.det_model_path, args.rec_model_path = paths["det"], paths["rec"]
    args.cls_model_path = paths["cls"]
    args.rec_char_dict_path = str(resources.PPOCRV6_DICT_PATH)
    args.rec_batch_num = 6
    args.device = device
    return args


def predictors(root: str, device: str, weights_dir: str) -> tuple[Any, Any]:
    """MinerU's ``TextDetector`` and ``TextRecognizer``, made the way ``PytorchPaddleOCR``
    makes them, from weight files written here with random values (seed 0)."""
    args = _ocr_args(root, device, weights_dir)
    det = importlib.import_module(OCR + ".infer.predict_det").TextDetector(args)
    rec = importlib.import_module(OCR + ".infer.predict_rec").TextRecognizer(args)
    return det, rec


FORMULA = ("PP-FormulaNet_plus-M", "PP-FormulaNet_plus-S")


def page_models(root: str, device: str, work: str, formula: str = FORMULA[0]) -> dict[str, Any]:
    """MinerU 4.0's own predictors for a page, from ``root`` (its ``mineru`` and
    ``transformers``), weights random (seed 0; files written under ``work`` once):
    ``PPDocLayoutV2LayoutModel`` (transformers' default PP-DocLayoutV2 config, MinerU's 25
    labels and thresholds), ``TextDetector``, ``TextClassifier`` (:data:`CLS_ARCH`),
    ``TextRecognizer`` and ``FormulaRecognizer`` (``formula``: its arch from MinerU's table, a
    word-level tokenizer of the decoder's 50,000 ids standing in for the real one)."""
    import torch

    sys.path.insert(0, root)  # this side's transformers
    args = _ocr_args(root, device, work)
    utility = importlib.import_module(OCR + ".infer.pytorchocr_utility")
    table = utility.get_arch_config
    utility.get_arch_config = lambda path: (
        copy.deepcopy(CLS_ARCH) if Path(path).stem == CLS_NAME else table(path)
    )
    models = {
        "det": importlib.import_module(OCR + ".infer.predict_det").TextDetector(args),
        "cls": importlib.import_module(OCR + ".infer.predict_cls").TextClassifier(args),
        "rec": importlib.import_module(OCR + ".infer.predict_rec").TextRecognizer(args),
    }
    layout = importlib.import_module("mineru.model.layout.pp_doclayoutv2")
    # This side's own files: a stock transformers has no rocmfix rewrite to route.
    assert layout.__file__.startswith(root), layout.__file__
    assert sys.modules["transformers"].__file__.startswith(root), "transformers from elsewhere"
    folder = os.path.join(work, "pp_doclayout_v2")
    if not os.path.exists(os.path.join(folder, "config.json")):
        config = layout.PPDocLayoutV2Config()
        config.num_labels = len(layout.PP_DOCLAYOUT_V2_LABELS)
        config.id2label = dict(enumerate(layout.PP_DOCLAYOUT_V2_LABELS))
        config.label2id = {v: k for k, v in config.id2label.items()}
        config.class_thresholds = list(layout.DEFAULT_CLASS_THRESHOLDS)
        config.class_order = list(layout.DEFAULT_CLASS_ORDER)
        torch.manual_seed(0)
        randomized(layout.PPDocLayoutV2ForObjectDetection(config)).save_pretrained(folder)
    models["layout"] = layout.PPDocLayoutV2LayoutModel(folder, device=device)
    mfr = importlib.import_module("mineru.model.mfr.pp_formulanet.predict_formula")
    _formula_files(root, work, formula)
    models["formula"] = mfr.FormulaRecognizer(work, device=device, model_name=formula)
    return models


def _formula_files(root: str, work: str, name: str) -> None:
    """``{name}.pth`` (random, seed 0) and ``{name}_inference.yml`` (its tokenizer)."""
    import torch
    import yaml
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    weights = os.path.join(work, name + ".pth")
    if not os.path.exists(weights):
        base = importlib.import_module(OCR + ".modeling.architectures.base_model")
        resources = os.path.join(root, *OCR.split("."), "utils", "resources")
        with open(os.path.join(resources, "pp_formulanet_arch_config.yaml")) as f:
            arch = yaml.safe_load(f)[name]["Architecture"]
        torch.manual_seed(0)
        torch.save(randomized(base.BaseModel(arch)).state_dict(), weights)
    special = ["<s>", "<pad>", "</s>", "<unk>"]
    vocab = {t: i for i, t in enumerate(special + [f"x{i}" for i in range(4, 50000)])}
    tokenizer = json.loads(Tokenizer(WordLevel(vocab, unk_token="<unk>")).to_str())
    decode = {"PostProcess": {"character_dict": {"fast_tokenizer_file": tokenizer}}}
    with open(os.path.join(work, name + "_inference.yml"), "w") as f:
        yaml.safe_dump(decode, f)


def formula_boxes(page: Page, every: int = 8) -> list[dict[str, Any]]:
    """What the layout model would hand MinerU's formula recognizer for ``page``: every
    ``every``-th text line as an inline formula (random weights find none of their own)."""
    return [
        {"label": "inline_formula", "bbox": [int(v) for v in box], "score": 0.9}
        for box in page.lines[every // 2 :: every]
    ]
