"""The compatibility matrix (bench/compat_matrix.py) on its deterministic sample, in CI.

The full matrix (every release; ``python bench/compat_matrix.py --jobs 2``) writes
docs/compatibility.md and runs the CLI in a subprocess per call. Here the same checks run on
the sample with the CLI called in-process (typer's test runner: the same argument parsing,
engine and renderer, without an interpreter start per call) in two forked workers, to fit
CI's time budget.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
from packaging.version import Version

import releases
from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import test_doclayout

import compat_matrix

pytestmark = pytest.mark.network


def test_sample_is_deterministic_and_keeps_the_boundaries() -> None:
    vllm = compat_matrix.sample_releases("vllm")
    assert {"0.8.0", "0.11.0", "0.11.1"} <= set(vllm)
    assert min(vllm, key=Version) == "0.8.0"
    for project, eras in (
        ("vllm", compat_matrix.VLLM_ERAS),
        ("transformers", compat_matrix.TRANSFORMERS_ERAS),
        ("sglang", compat_matrix.SGLANG_ERAS),
        ("lmdeploy", compat_matrix.LMDEPLOY_ERAS),
        ("mineru", compat_matrix.MINERU_ERAS),
    ):
        every = compat_matrix.all_releases(project)
        sample = compat_matrix.sample_releases(project)
        bounds = [*map(Version, eras), Version("9999")]
        # Every code era (each shape of the target code) is met once: by its first release,
        # the last era by the newest; the full matrix meets every release.
        picked = set()
        for low, high in itertools.pairwise(bounds):
            era = [v for v in every if low <= Version(v) < high]
            assert era, (project, low)
            picked.add(era[-1] if high == bounds[-1] else era[0])
        assert set(sample) == picked, project

    mineru = compat_matrix.sample_releases("mineru-vl-utils")
    assert len(mineru) == compat_matrix.MINERU_SAMPLE_SIZE
    newest = max(releases.releases("mineru-vl-utils"), key=Version)
    assert {"0.1.0", "0.1.13", "0.1.14", newest} <= set(mineru)
    # Spread over the whole history: no stretch of releases longer than twice the even step
    # goes unsampled.
    every_mineru = compat_matrix.all_releases("mineru-vl-utils")
    positions = [every_mineru.index(v) for v in mineru]
    step = len(every_mineru) / compat_matrix.MINERU_SAMPLE_SIZE
    assert max(b - a for a, b in itertools.pairwise(positions)) <= 2 * step
    assert compat_matrix.sample_releases("doclayout-yolo") == releases.releases("doclayout-yolo")
    assert releases.releases("doclayout-yolo") == list(test_doclayout.RELEASES)


def test_sample_has_no_failures(tmp_path: Path) -> None:
    plan = compat_matrix.make_plan(sample=True)
    rows = compat_matrix.run_matrix(plan, jobs=2, workdir=tmp_path, in_process=True)
    failed = {f"{r.project} {r.version}": r.failures for r in rows if not r.ok}
    assert not failed, failed
    assert [(r.project, r.version) for r in rows] == plan

    by_release = {(r.project, r.version): r for r in rows}
    for row in rows:
        assert set(row.verdicts) == set(compat_matrix.patches_of(row.project)), row
    # Every patch's target file is in some release of the sample (a missing one reads
    # not-needed with the patch's missing_reason).
    missing = {p.id: p.missing_reason for p in compat_matrix.PATCHES}
    met = {
        pid
        for r in rows
        for pid, (_, reason) in r.verdicts.items()
        if reason != missing[pid].format(version=r.version)
    }
    assert met == {pid for p, _ in plan for pid in compat_matrix.patches_of(p)}
    assert by_release["mineru-vl-utils", "0.1.13"].verdicts["mineru-tokenizer"][0] == "applicable"
    assert by_release["mineru-vl-utils", "0.1.14"].verdicts["mineru-tokenizer"][0] == "not-needed"
    assert by_release["mineru-vl-utils", "0.1.0"].verdicts["mineru-tokenizer"][0] == "not-needed"
    assert by_release["vllm", "0.8.0"].verdicts["vllm-qwen3-vl"][0] == "not-needed"
    assert by_release["vllm", "0.11.0"].round_trip == "ok (gemm, linear)"
    for row in rows:
        if row.project == "doclayout-yolo":
            assert row.round_trip == "ok (gemm, linear)", row

    minerus = {r.version: r for r in compat_matrix.mineru_rows(sample=True, jobs=2)}
    assert all(r.failure is None for r in minerus.values()), minerus
    # MinerU 3.0 dropped DocLayout-YOLO; every MinerU from 2.5 runs the vllm async client.
    assert minerus["2.5.0"].uses["doclayout-dilated-conv"] == "imports doclayout_yolo"
    assert minerus["3.0.0"].uses["doclayout-dilated-conv"] is None
    assert all(minerus[v].uses["mineru-tokenizer"] for v in ("2.5.0", "3.0.0"))
    report = compat_matrix.render(
        rows, sample=True, seconds=1.0, jobs=1, fault_lines=[], minerus=list(minerus.values())
    )
    assert "Failures: 0." in report
    table = [line.split(" | ") for line in report.split("## mineru", 1)[1].splitlines()
             if line.startswith("| ")]  # fmt: skip
    doclayout = table[0].index("doclayout-dilated-conv")
    assert next(r for r in table if r[0] == "| 3.0.0")[doclayout] == "-"
    assert next(r for r in table if r[0] == "| 2.5.0")[doclayout].startswith("runs it")
    for project, version in plan:
        assert f"\n| {version} | " in report.split(f"## {project}", 1)[1]
