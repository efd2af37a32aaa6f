"""Does tune's ahead-of-time screen warm the Triton cache its timed candidates load from?

Branch slim-guest dropped tune's second round of compile helpers (the worker's ``compile``
mode) on the claim that the screen (mode ``check``, one helper process) binds each launch as
the JIT does, for this GPU, into the same cache. This checks it on a GPU, per tune target, in
a fresh ``TRITON_CACHE_DIR``:

1. the screen alone: mode ``check`` with every candidate tune would try (the shipped config
   and the op's grid here), timed, then the cache entries it wrote;
2. the tune worker on the same target (which screens again, then checks and times every
   candidate), timed, then the cache entries it added.

Where the claim holds, step 2 adds no kernel of the op's own (only its re-screen's hits and
torch's or the launcher's own small kernels, if any) and takes far less than step 1.
Run on a machine with a GPU, torch and Triton: ``python bench/tune_cache.py`` (a few minutes;
each worker run is bounded by 600 s). Prints one JSON line per target. Compare with the same
script on main (its tune also runs the helpers: step 2's time there is the baseline).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
CACHE = tempfile.mkdtemp(prefix="rocmfix-tune-cache-")
os.environ["TRITON_CACHE_DIR"] = CACHE

from rocmfix import worker  # noqa: E402
from rocmfix.guest import protocol  # noqa: E402
from rocmfix.ops import OPS  # noqa: E402


def entries() -> set[str]:
    return set(os.listdir(CACHE))


def main() -> None:
    for op in OPS:
        if not op.kernel:
            continue
        for target in op.tune:
            spec = op.request()
            spec = dataclasses.replace(spec, tune={target.id: spec.tune[target.id]})
            # The shipped config (None: the template's own) and every grid config over it, a
            # superset of what tune tries on this GPU (it keeps the groups whose conditions hold).
            configs = [None] + [dict(c) for g in op.grid for c in g.configs]
            base = worker.request("tune", [op], budget_s=300.0)
            base = dataclasses.replace(base, ops={op.name: spec})
            # The GPU's arch, from a quick worker run (resolve: the tuned file read back).
            resolve = dataclasses.replace(base, mode="resolve")
            answer = worker.run(sys.executable, resolve, limit_for=lambda _i: 600.0)
            arch = answer.device.arch
            item = functools.partial(
                protocol.CompileItem, op=op.name, scheme=spec.kernel_scheme, shape=target.id,
                gpu=dict(target.gpu), dtype=target.gpu["dtype"], arch=arch,
            )  # fmt: skip
            compiles = [item(config=cfg) for cfg in configs]
            # A fresh cache for this target: screen first, then the tune worker.
            shutil.rmtree(CACHE)
            os.mkdir(CACHE)
            t0 = time.monotonic()
            check = dataclasses.replace(base, mode="check", compiles=compiles)
            worker.run(sys.executable, check, limit_for=lambda _i: 600.0)
            screen_s, screened = time.monotonic() - t0, entries()
            t0 = time.monotonic()
            tuned = worker.run(sys.executable, base, limit_for=lambda _i: 600.0)
            tune_s, added = time.monotonic() - t0, entries() - screened
            rows = [c for e in tuned.of(protocol.Tuned) for c in e.candidates]
            print(json.dumps({
                "target": target.id, "device": answer.device.name, "arch": arch,
                "screen_s": round(screen_s, 1), "screen_entries": len(screened),
                "tune_s": round(tune_s, 1), "tune_added_entries": len(added),
                "candidates": len(rows), "timed": sum(r.ms is not None for r in rows),
            }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
