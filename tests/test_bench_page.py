"""bench/page_gpu.py's plumbing on the CPU: MinerU 4.0.12's five page predictors built from
random weights, every model call and every piece of MinerU's CPU work timed, passes over the
same page, and the report's split. Its figures mean nothing on a CPU; its speed is measured
on a GPU (docs/performance-graphs.md).

Skipped where the page path's packages are missing (the suite's environment has none of
fpdf2, pypdfium2, docvortex: bench/page_gpu.sh's header lists them).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import releases
from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import page_gpu

NEEDS = ("fpdf", "pypdfium2", "docvortex", "shapely", "pyclipper", "tokenizers", "accelerate",
         "torchvision", "ftfy", "loguru", "safetensors", "huggingface_hub")  # fmt: skip
MISSING = [name for name in NEEDS if importlib.util.find_spec(name) is None]


@pytest.mark.network
@pytest.mark.skipif(bool(MISSING), reason=f"the page path needs {', '.join(MISSING)}")
def test_a_page_through_the_five_predictors_on_the_cpu(tmp_path: Path) -> None:
    site = tmp_path / "stock"
    for project, version in (("mineru", "4.0.12"), ("transformers", "5.17.0")):
        shutil.copytree(releases.importable(project, version) / project, site / project)
    command = [sys.executable, str(ROOT / "bench" / "page_gpu.py"), "--worker", "stock",
               "--stock", str(site), "--patched", str(site), "--device", "cpu", "--doc",
               "slides", "--pages", "1", "--passes", "2", "--formula", "PP-FormulaNet_plus-S",
               "--tokens", "2", "--process-seconds", "600",
               "--work", str(tmp_path / "work")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads(done.stdout.strip().splitlines()[-1])
    assert run["side"] == "stock" and run["pages"] == 1 and len(run["passes"]) == 2
    for one in run["passes"]:
        for model in page_gpu.MODELS:
            assert one["calls"][f"{model} forward"] > 0, model
            assert one["parts"][f"{model} pre"] > 0, model
            assert one["parts"][f"{model} post"] > 0, model
        assert one["calls"]["formula decoder"] == one["calls"]["formula forward"]
    # The same pass twice: every model called as often.
    assert run["passes"][0]["calls"] == run["passes"][1]["calls"]
    split = page_gpu.split(run, slice(1, None))
    assert split is not None
    parts = run["passes"][1]["parts"]
    forwards = sum(parts[f"{m} forward"] for m in page_gpu.MODELS)
    assert split["gpu part"] == pytest.approx(forwards * 1e3)
    whole = sum(split[k] for k in ("gpu part", "decoder", "cpu pre", "cpu post", "other"))
    assert whole == pytest.approx(split["page"])


def test_the_report_splits_the_page_and_pairs_the_sides(capsys: pytest.CaptureFixture[str]) -> None:
    def run(side: str, forward: float) -> dict[str, object]:
        parts = {f"{m} forward": forward for m in page_gpu.MODELS}
        parts |= {"formula decoder": 1.0, "det pre": 2.0, "rec post": 1.0}
        one = {"wall": 5 * forward + 4.0 + 1.0, "parts": parts, "calls": {}}
        return {"pair": 0, "side": side, "pages": 2, "passes": [one, one, one]}

    stock, patched = run("stock", 1.0), run("patched", 0.25)
    patched["stats"] = {}
    page_gpu.report([stock, patched])
    out = capsys.readouterr().out
    assert "pass 1 (a fresh process)" in out and "passes 2+" in out and "last pass alone" in out
    # GPU part 5 s against 1.25 s; the page 10 s against 6.25 s, all the GPU part leaves it.
    assert "GPU part 4.00 (median 4.00)" in out
    assert "whole page 1.60 (median 1.60); what the GPU part leaves it 1.60" in out
    # Per page (2 pages), stock: GPU part 2500 ms, decoder 500, CPU pre 1000, post 500, rest 500.
    assert "0    stock       5000.00   2500.00    500.00   1000.00    500.00    500.00" in out
