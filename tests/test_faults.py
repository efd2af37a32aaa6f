"""SIGKILL at every write point of apply and revert on a vllm release, and EIO from every
write point of apply on: three target files, the dropped kernels module and RECORD change in
one run (tests/faults.py has the checks).

The loops run two at a time on environments of their own (each run is a subprocess that
mostly waits on the disk and the target interpreter), which keeps them within CI's time
budget. The full matrix run (bench/compat_matrix.py) also kills the scheme switch and every
recovery, and fails the disk under revert and the scheme switch.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import faults
import releases
from conftest import VLLM_CONV, VLLM_TARGETS, Result, run_cli

pytestmark = pytest.mark.network

VERSION = "0.11.0"
# Kill the recovering revert at each of its own write points too, after this point of the
# first kill: the drop and the first target are written, two targets and RECORD are not.
NESTED = {15}


def _env(root: Path, logs: Path) -> tuple[Callable[..., Result], Path, Path]:
    python = releases.make_venv(root)
    members = [*VLLM_TARGETS, VLLM_CONV, "vllm/__init__.py"]
    site = releases.partial_install(python, "vllm", VERSION, members)

    def cli(*args: str, env: dict[str, str] | None = None, **kwargs: Any) -> Result:
        full = {"XDG_CACHE_HOME": str(logs), **(env or {})}
        return run_cli(*args, "--python", str(python), env=full, **kwargs)

    return cli, site, root / "share" / "rocmfix"


@pytest.fixture(scope="module")
def summaries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, faults.Summary]:
    base = tmp_path_factory.mktemp("faults")

    def loop(run: str) -> faults.Summary:
        command, fault = run.split(":")
        cli, site, state = _env(base / f"{command}-{fault}", base / f"logs-{command}-{fault}")
        return faults.kill_loop(
            cli,
            site=site,
            state=state,
            command=command,
            label=f"vllm {VERSION}",
            nested=NESTED if fault == "kill" else False,
            fault=fault,
        )

    # A failing disk during revert is swept by the full matrix (bench/compat_matrix.py) and,
    # in-process, by tests/test_transaction.py; here apply's, whose rollback fails too.
    runs = ("apply:kill", "revert:kill", "apply:io-error")
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        done = dict(zip(runs, pool.map(loop, runs), strict=True))
    for summary in done.values():
        print(summary.line())
    return done


@pytest.mark.parametrize("command", ["apply", "revert"])
def test_killed_vllm_run_is_recovered_at_every_write_point(
    summaries: dict[str, faults.Summary], command: str
) -> None:
    summary = summaries[f"{command}:kill"]
    assert not summary.problems, summary.problems
    # 3 targets and RECORD backed up, the journal, 5 files written, the final manifest:
    # every one a write point (two for each atomic replace).
    assert summary.points >= 20, summary.line()
    assert summary.recovered == summary.points
    assert summary.nested_points > 0, "the recovering revert was killed too"
    assert summary.bytes_lost == 0
    assert summary.files_left == 0


@pytest.mark.parametrize("command", ["apply"])
def test_io_errors_from_every_write_point_on_lose_nothing(
    summaries: dict[str, faults.Summary], command: str
) -> None:
    """A disk that fails from one write on, the rollback's writes included: each run ends in
    one error line, status tells the truth, and a revert once the disk is healthy brings back
    every byte."""
    summary = summaries[f"{command}:io-error"]
    assert not summary.problems, summary.problems
    assert summary.points >= 20, summary.line()
    assert summary.recovered == summary.points
    assert summary.bytes_lost == 0
    assert summary.files_left == 0
