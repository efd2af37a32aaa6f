"""doctor and tune on a real GPU: the paths the CPU suite cannot reach (CUDA-graph timing, the
GPU's own arch in the tuned file, the ahead-of-time compile for the device's arch).

They run where torch sees a GPU and skip elsewhere: CI has none by design. On the device:

    python -m pytest tests/test_gpu.py

(docs/performance-doctor.md records the run.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import run_cli

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU visible to torch")

# Undo conftest's NO_GPU for these runs only.
GPU = {k: os.environ.get(k, "") for k in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")}
GPU = {k: v for k, v in GPU.items() if v} or {"CUDA_VISIBLE_DEVICES": "0"}


def test_doctor_measures_checks_and_compiles_on_the_gpu(tmp_path: Path) -> None:
    env = {**GPU, "ROCMFIX_TUNED_FILE": str(tmp_path / "none.json")}
    result = run_cli("doctor", "--json", env=env, timeout=900)
    assert result.returncode == 0, result.stderr
    doc = result.json()
    device = doc["device"]
    assert device["kind"] == "gpu" and device["interpreter"] is False
    for op in doc["ops"]:
        for case in op["cases"]:
            assert case["native"]["status"] in ("ok", "timeout"), case["native"]
            for scheme in case["schemes"]:
                assert scheme["status"] == "ok", (case["id"], scheme)
                assert scheme["ms"] > 0 and scheme["rel_err"] < scheme["tolerance"]
                if scheme["compiled"] is not None:  # a Triton scheme: compiled for this GPU
                    compiled = scheme["compiled"]
                    assert compiled["arch"] == device["arch"]
                    assert compiled["registers"] > 0 and compiled["problems"] == []


def test_tune_screens_times_and_stores_for_this_gpu(tmp_path: Path) -> None:
    path = tmp_path / "tuned.json"
    env = {**GPU, "ROCMFIX_TUNED_FILE": str(path)}
    result = run_cli("tune", "--json", "--op", "patch-embed", "--budget", "120", env=env,
                     timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = result.json()
    kernel = doc["kernels"][0]
    assert kernel["status"] == "ok" and kernel["arch"] == doc["device"]["arch"]
    assert kernel["timing"] in ("graph", "eager")
    for candidate in kernel["candidates"]:
        assert candidate["compiled"]["arch"] == doc["device"]["arch"]
        if candidate["status"] == "rejected":
            assert candidate["ms"] is None
        if candidate["status"] == "ok":
            assert candidate["ms"] > 0
    if kernel["tuned"]:
        assert kernel["verified"] is True
        stored = json.loads(path.read_text())
        assert doc["device"]["arch"] in stored["kernels"]["patch_embed_gemm"]
