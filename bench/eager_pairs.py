"""The patched eager forward against the stock one, as a user runs it (issue 41's eager
target): each model in its own fresh process, stock files and patched files alternating,
``--pairs`` pairs per model (stock first in even pairs, patched first in odd ones).

    python bench/eager_pairs.py --stock STOCK --pairs 10 --out DIR

STOCK is a folder holding copies of the ``mineru`` and ``transformers`` packages taken before
``rocmfix apply`` rewrote the machine's own (bench/eager_pairs.sh does both); the stock side
runs with STOCK first on ``sys.path``, the patched side with the machine's site-packages. Each
process builds one model with bench/models_gpu.py's builders (random weights, seed 0: the same
model on both sides), runs 5 warm-up forwards, then ``--reps`` forwards under
``torch.inference_mode()``, each timed on the host between two ``torch.cuda.synchronize()``,
and reports its minimum and median. The figure of a pair is patched/stock of the minimums
(the issue's measure; the medians are printed beside it). No graphs: ROCMFIX_GRAPHS=0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def worker(model: str, reps: int) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    import models_gpu  # after the path that finds it
    import torch

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    dtype, shape, _ = models_gpu.MODELS[model]
    net = models_gpu.build(model).to("cuda", dtype)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to("cuda", dtype)
    rewritten = sorted(
        {m.__name__ for m in map(sys.modules.get, list(sys.modules)) if m is not None
         and any(k.startswith("_rocmfix_") for k in vars(m))}
    )  # fmt: skip
    times = []
    with torch.inference_mode():
        for _ in range(5):
            net(x)
        for _ in range(reps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            net(x)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e3)
    return {"min": min(times), "median": statistics.median(times), "rewritten": rewritten}


def _run(args: argparse.Namespace, side: str, model: str) -> dict[str, Any]:
    env = dict(os.environ, ROCMFIX_GRAPHS="0")
    if side == "stock":
        env["PYTHONPATH"] = os.pathsep.join([args.stock, env.get("PYTHONPATH", "")])
    command = [sys.executable, __file__, "--worker", model, "--reps", str(args.reps)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env,
                          timeout=300)  # fmt: skip
    if done.returncode != 0:
        return {"side": side, "model": model, "error": done.stderr[-1500:]}
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    # The stock side must run no rewritten module, the patched side at least one.
    found["as_expected"] = bool(found["rewritten"]) == (side == "patched")
    return {"side": side, "model": model, **found}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stock")
    parser.add_argument("--out", default=".")
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--models", default="det,rec,layout,formula")
    parser.add_argument("--worker")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.reps)))
        return
    runs: list[dict[str, Any]] = []
    for model in args.models.split(","):
        for pair in range(args.pairs):
            for side in ("stock", "patched")[:: 1 if pair % 2 == 0 else -1]:
                runs.append({"pair": pair, **_run(args, side, model)})
                print(json.dumps({k: v for k, v in runs[-1].items() if k != "rewritten"}),
                      flush=True)  # fmt: skip
                Path(args.out, "eager_pairs.json").write_text(json.dumps(runs, indent=1))
    print(f"\n{'model':<8} {'pairs':>5} {'min ratio: median (range)':>28} {'median ratio':>13} ok")
    for model in args.models.split(","):
        mine = [r for r in runs if r["model"] == model and "min" in r]
        by = {(r["pair"], r["side"]): r for r in mine}
        pairs = [p for p in range(args.pairs) if (p, "stock") in by and (p, "patched") in by]
        if not pairs:
            print(f"{model:<8} failed")
            continue
        mins = [by[p, "patched"]["min"] / by[p, "stock"]["min"] for p in pairs]
        meds = [by[p, "patched"]["median"] / by[p, "stock"]["median"] for p in pairs]
        ok = all(r["as_expected"] for r in mine)
        span = f"({min(mins):.3f}-{max(mins):.3f})"
        print(f"{model:<8} {len(pairs):>5} {statistics.median(mins):>10.3f} {span} "
              f"{statistics.median(meds):>13.3f} {ok}")  # fmt: skip


if __name__ == "__main__":
    main()
