"""``rocmfix kernels``: every shipped Triton kernel compiled ahead of time for the GPUs MinerU's
users have (gfx1100, gfx1201, gfx90a, gfx942, gfx950) and for sm_90, with this environment's
Triton and no GPU, through the templates' own config resolution and launch preparation.

The sweep is the proof issue 15 asks for: no shipped config fails to compile, spills, overflows
LDS or misses a matrix instruction. The other tests show the check can fail: the fp32 RDNA
config as it shipped before (spills), and a tuned 256x256x64 tile (overflows LDS); then that
``tune`` and ``doctor`` use the same compiles.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rocmfix.guest.aot import TARGETS
from rocmfix.ops import OPS
from rocmfix.render.console import config_text

from conftest import ROOT, run_cli

HOOK = "ROCMFIX_UNSAFE_TEST_HOOKS"
pytest.importorskip("triton")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tuned = tmp_path_factory.mktemp("kernels") / "none.json"
    result = run_cli("kernels", "--json", env={"ROCMFIX_TUNED_FILE": str(tuned)}, timeout=900)
    assert result.returncode in (0, 1), result.stderr
    doc: dict[str, Any] = result.json()
    return doc


def _expected() -> Iterator[tuple[str, str, str, str, str]]:
    for op in OPS:
        for scheme in op.schemes:
            if scheme.needs_triton:
                for target in op.tune:
                    for dtype in op.dtypes:
                        for arch in TARGETS:
                            yield op.name, scheme.name, target.id, dtype, arch


def test_every_shipped_kernel_compiles_cleanly_for_every_gpu(sweep: dict[str, Any]) -> None:
    assert sweep["schema"] == "rocmfix-kernels/1"
    rows = {(c["op"], c["scheme"], c["shape"], c["dtype"], c["arch"]): c for c in sweep["checks"]}
    assert sorted(rows) == sorted(_expected())
    problems = [f"{key}: {c['problems']}" for key, c in rows.items() if c["problems"]]
    assert problems == [] and sweep["ok"] is True
    for key, c in rows.items():
        assert isinstance(c["registers"], int) and c["registers"] > 0, key
        assert c["spills"] == 0 and c["scratch_bytes"] == 0, key
        assert c["shared_bytes"] <= c["shared_limit_bytes"], key
        # 16-bit dots reach the matrix cores on every GPU here; fp32 on CDNA's MFMA too.
        if c["dtype"] in ("bfloat16", "float16") and c["scheme"] == "gemm":
            assert c["matrix_instruction"] and c["matrix_count"] > 0, key
        if c["arch"].startswith("gfx") and c["waves_per_simd"] is not None:
            assert c["waves_per_simd"] >= 4, key  # latency hiding needs a few waves


def test_the_docs_table_covers_every_row_with_zero_spills(sweep: dict[str, Any]) -> None:
    text = (ROOT / "docs" / "amd-kernels.md").read_text(encoding="utf-8")
    table = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in table[0]]
    documented = {
        (cells[0].strip(), cells[2].strip(), cells[3].strip(), cells[4].strip()): cells
        for cells in (row for row in table[1:])
    }
    for c in sweep["checks"]:
        key = (f"{c['op']} {c['scheme']}", c["dtype"], c["shape_label"], c["arch"])
        assert key in documented, f"docs/amd-kernels.md lacks {key}: run bench/kernels_table.py"
        cells = dict(zip(header, (cell.strip() for cell in documented[key]), strict=True))
        assert cells["spills"] == "0", key
        # The config that GPU resolves to now, in the words `rocmfix kernels` prints.
        assert cells["config"] == config_text(c["config"]), key
    versions = [h for h in header if h.startswith("Triton ")]
    assert len(versions) >= 2, "the table must cover at least two Triton versions"
    assert f"Triton {sweep['triton']}" in versions


def _row(doc: dict[str, Any], **match: str) -> dict[str, Any]:
    found = [c for c in doc["checks"] if all(c[k] == v for k, v in match.items())]
    assert len(found) == 1, (match, [c["arch"] for c in doc["checks"]])
    return found[0]


def test_the_check_fails_on_the_fp32_rdna_config_as_it_shipped(tmp_path: Path) -> None:
    # Before the fix gfx1100/gfx1201 ran default's fp32 tile on 4 warps: 128 accumulators a lane.
    env = {
        "ROCMFIX_TUNED_FILE": str(tmp_path / "none.json"),
        "ROCMFIX_PATCH_EMBED_CONFIG": json.dumps({"fp32": {"num_warps": 4}}),
    }
    result = run_cli("kernels", "--json", "--arch", "gfx1100", "--arch", "gfx1201",
                     "--op", "patch-embed", env=env, timeout=600)  # fmt: skip
    assert result.returncode == 1, result.stderr
    doc = result.json()
    for arch in ("gfx1100", "gfx1201"):
        row = _row(doc, scheme="gemm", dtype="float32", arch=arch)
        assert row["ok"] is False and row["spills"] > 0
        assert any(p.startswith("spills registers") for p in row["problems"])
        assert _row(doc, scheme="gemm", dtype="bfloat16", arch=arch)["ok"] is True
    assert any("float32" in line and "spills" in line for line in doc["failures"])
    # The table says it too, and the exit code is the pipeline's signal.
    table = run_cli("kernels", "--arch", "gfx1100", "--op", "patch-embed", env=env, timeout=600)
    assert table.returncode == 1 and "spills registers" in table.stdout


def test_the_check_fails_on_a_tuned_tile_that_overflows_lds(tmp_path: Path) -> None:
    tuned = tmp_path / "tuned.json"
    big = {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}
    tuned.write_text(
        json.dumps({"schema": 1, "kernels": {"patch_embed_gemm": {"gfx1100": {"f16": big}}}})
    )
    result = run_cli("kernels", "--json", "--arch", "gfx1100", "--op", "patch-embed",
                     env={"ROCMFIX_TUNED_FILE": str(tuned)}, timeout=600)  # fmt: skip
    assert result.returncode == 1
    row = _row(result.json(), scheme="gemm", dtype="bfloat16", arch="gfx1100")
    assert row["config"]["BLOCK_M"] == 256  # the tuned file's tile is what was compiled
    assert row["shared_bytes"] > row["shared_limit_bytes"] == 65536
    assert any("shared memory" in p for p in row["problems"])


def test_an_unknown_arch_is_one_line_and_exit_2() -> None:
    result = run_cli("kernels", "--arch", "gfx9999")
    assert result.returncode == 2 and result.stdout == ""
    assert re.search(r"unknown arch gfx9999", result.stderr)
    assert "gfx1100" in result.stderr  # the hint lists the choices


def test_tune_rejects_candidates_that_spill_or_overflow_before_timing(tmp_path: Path) -> None:
    # In the CPU interpreter, the test hook names the GPU the candidates are compiled for.
    tuned = tmp_path / "tuned.json"
    big = {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}
    tuned.write_text(json.dumps({"schema": 1, "kernels": {"patch_embed_gemm": {"cpu": big}}}))
    env = {
        "ROCMFIX_TUNED_FILE": str(tuned),
        HOOK: json.dumps({"aot_arch": "gfx1100", "slow": {"candidates": 0.3}}),
    }
    result = run_cli("tune", "--interpret", "--json", "--op", "patch-embed", env=env,
                     timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr
    kernel = result.json()["kernels"][0]
    current = [c for c in kernel["candidates"] if c["role"] == "current"]
    assert len(current) == 1 and current[0]["status"] == "rejected"
    assert current[0]["ms"] is None  # never timed
    assert "LDS" in current[0]["message"] and "gfx1100" in current[0]["message"]
    assert current[0]["compiled"]["shared"] > current[0]["compiled"]["shared_limit"]
    timed = [c for c in kernel["candidates"] if c["status"] == "ok"]
    assert timed and all(c["compiled"]["spills"] == 0 for c in timed[1:])
    # The big tile lost and left the file; put it back for the table's run.
    tuned.write_text(json.dumps({"schema": 1, "kernels": {"patch_embed_gemm": {"cpu": big}}}))
    table = run_cli("tune", "--interpret", "--op", "patch-embed", env=env, timeout=600)
    assert "rejected: spills or LDS" in table.stdout


def test_doctor_reports_what_the_compiler_made_of_the_configs_it_ran() -> None:
    env = {HOOK: json.dumps({"aot_arch": "gfx1100"})}
    result = run_cli("doctor", "--json", "--op", "patch-embed", env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    case = result.json()["ops"][0]["cases"][0]
    gemm = next(s for s in case["schemes"] if s["impl"] == "gemm")
    compiled = gemm["compiled"]
    assert compiled["arch"] == "gfx1100" and compiled["registers"] > 0
    assert compiled["config"]["BLOCK_M"] == gemm["config"]["BLOCK_M"]  # the config it ran
    assert next(s for s in case["schemes"] if s["impl"] == "linear")["compiled"] is None
    table = run_cli("doctor", "--op", "patch-embed", env=env, timeout=600)
    assert "Compiled for gfx1100" in table.stdout and "registers" in table.stdout
    # No tuned file in this test's config home: doctor says so rather than naming a file.
    assert re.search(r"Tuned +none \(.*tuned\.json does not exist", table.stdout)
