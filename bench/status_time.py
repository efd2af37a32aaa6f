"""How long `rocmfix status` takes on an environment holding all three target packages, and
how much of it is the probe. Not a test: a measurement, printed as a markdown table.

    python bench/status_time.py [--runs 15]

It builds a venv with mineru-vl-utils 0.1.13, doclayout-yolo 0.0.4 (pip, --no-deps) and
vllm 0.11.0's target files (the real RECORD and METADATA; see tests/releases.py), then times
the real CLI in a subprocess, and the probe alone in the same interpreter.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from rocmfix import guest  # noqa: E402
from rocmfix.environment import _request  # noqa: E402
from rocmfix.registry import all_patches  # noqa: E402

import releases  # noqa: E402


def _median_ms(command: list[str], runs: int, env: dict[str, str]) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, env=env, capture_output=True, check=True)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        python = releases.make_venv(Path(tmp) / "env")
        releases.pip_install(
            python,
            releases.wheel("mineru-vl-utils", "0.1.13"),
            releases.wheel("doclayout-yolo", "0.0.4"),
        )
        models = "vllm/model_executor/models"
        releases.partial_install(
            python,
            "vllm",
            "0.11.0",
            [
                f"{models}/qwen2_vl.py",
                f"{models}/qwen2_5_vl.py",
                f"{models}/qwen3_vl.py",
                "vllm/__init__.py",
            ],
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        status = [sys.executable, "-m", "rocmfix", "status", "--python", str(python)]
        subprocess.run(status, env=env, capture_output=True, check=True)  # warm the caches
        total = _median_ms(status, args.runs, env)
        request = base64.b64encode(json.dumps(_request(all_patches())).encode()).decode()
        probe_ms = _median_ms(guest.command(str(python), "probe", request), args.runs, env)
        startup = _median_ms([sys.executable, "-m", "rocmfix", "--version"], args.runs, env)
        verdicts = json.loads(
            subprocess.run([*status, "--json"], env=env, capture_output=True, check=True).stdout
        )["patches"]
    print(
        f"rocmfix status, median of {args.runs} runs; {platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print()
    print("| what | ms | share |")
    print("|---|---|---|")
    print(f"| `rocmfix status --python ENV` (wall) | {total:.0f} | 100% |")
    print(f"| the probe in ENV's interpreter | {probe_ms:.0f} | {probe_ms / total:.0%} |")
    print(f"| rocmfix start-up (`--version`) | {startup:.0f} | {startup / total:.0%} |")
    print()
    print("verdicts: " + ", ".join(f"{p['id']}={p['verdict']}" for p in verdicts))


if __name__ == "__main__":
    main()
