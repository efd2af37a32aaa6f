"""Eager wall per call of the dropped-in Triton entries beside the vendor op, at launch-bound
(small) shapes, on an NVIDIA or AMD GPU: what a Python caller pays per call where the GPU idles.

Entries (fp16, under ``torch.inference_mode()``):

* ``depthwise``: ``depthwise_conv2d(x, conv, bn, relu)`` against ``F.conv2d`` alone (the
  vendor op the kernel replaces) and the stock modules ``relu(bn(conv(x)))``;
* ``dilated``: ``dilated_conv2d`` (d = 2) against ``F.conv2d`` with that dilation;
* ``patch-embed``: ``triton_conv3d_patchify`` against ``F.linear`` of the flattened patches
  (the GEMM it is) and the stock ``F.conv3d``.

Each entry runs three ways in one process: ``cached`` (the shipped path: the first call of a
layout through ``kernel[grid]``, the rest through the compiled kernel's ``[grid]`` runner),
``public`` (every launch through ``kernel[grid]``, as a Triton whose runner rejects the
arguments runs) and the vendor op(s). Rows are timed in interleaved bursts of back-to-back
calls, CUDA synchronised after each burst; ``wall`` is the median per call, ``x vendor`` its
ratio to the first vendor row. ``gpu`` is the same call's GPU time from a CUDA graph of 20
calls replayed (no host cost; the kernels' own time), where capture works.

    python bench/template_host.py [TEMPLATES_DIR ...] [--bursts 15] [--calls 200] [--budget 170]

Several folders (``git archive REV templates | tar -x -C /tmp/old`` for an older tree's) run
in alternating fresh processes, ``--pairs`` times each; every row names its folder. The whole
run stops starting new processes after ``--budget`` seconds. Prints plain text, then one JSON
line per process (``{"templates": ..., "rows": [...]}``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _bursts(fns: dict[str, Callable[[], Any]], bursts: int, calls: int) -> dict[str, list[float]]:
    import torch

    runs: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(bursts):
        for name, fn in fns.items():  # interleaved, burst by burst
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            runs[name].append((time.perf_counter() - t) / calls * 1e6)
    return runs


def _graph_us(fn: Callable[[], Any], calls: int = 20) -> float | None:
    """GPU time per call of ``fn`` from a CUDA graph of ``calls`` calls, or None."""
    import torch

    try:
        for _ in range(3):  # every plan made and compiled before the capture
            fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # captures on a side stream of its own
            for _ in range(calls):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        best = float("inf")
        for _ in range(10):
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            best = min(best, start.elapsed_time(end) * 1e3 / calls)
        return best
    except Exception as exc:  # noqa: BLE001 - a row without its GPU time
        print(f"  (no graph: {type(exc).__name__}: {exc})", file=sys.stderr)
        return None


def _cases(folder: str) -> list[tuple[str, Any, dict[str, Callable[[], Any]]]]:
    """(name, the launcher module, {row: call}) per entry; the entry row first."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT))
    from rocmfix.guest.templates import load

    dev, dt = torch.device("cuda"), torch.float16
    torch.manual_seed(0)
    cases = []

    tri = load(folder, "depthwise_conv_triton", fresh=True)
    for c, k, s, hw in ((32, 5, 1, 16), (64, 3, 2, 32)):
        conv = torch.nn.Conv2d(c, c, k, s, k // 2, groups=c, bias=False).to(dev, dt).eval()
        bn, relu = torch.nn.BatchNorm2d(c).to(dev, dt).eval(), torch.nn.ReLU()
        x = torch.randn(1, c, hw, hw, device=dev, dtype=dt)
        w = conv.weight

        def dw(x: Any = x, conv: Any = conv, bn: Any = bn, relu: Any = relu) -> Any:
            return tri.depthwise_conv2d(x, conv, bn, relu)

        def dw_vendor(x: Any = x, w: Any = w, s: int = s, k: int = k, c: int = c) -> Any:
            return F.conv2d(x, w, None, s, k // 2, 1, c)

        def dw_stock(x: Any = x, conv: Any = conv, bn: Any = bn, relu: Any = relu) -> Any:
            return relu(bn(conv(x)))

        name = f"depthwise 1x{c}x{hw}x{hw} k{k} s{s}"
        cases.append((name, tri, {"entry": dw, "F.conv2d": dw_vendor, "stock modules": dw_stock}))

    dil = load(folder, "dilated_conv_triton", fresh=True)
    for c, hw in ((64, 20), (128, 10)):
        x = torch.randn(1, c, hw, hw, device=dev, dtype=dt)
        w = torch.randn(c, c, 3, 3, device=dev, dtype=dt) * 0.05

        def dc(x: Any = x, w: Any = w) -> Any:
            return dil.dilated_conv2d(x, w, 2, 2)

        def dc_vendor(x: Any = x, w: Any = w) -> Any:
            return F.conv2d(x, w, None, 1, 2, 2)

        cases.append((f"dilated 1x{c}x{hw}x{hw} k3 d2", dil, {"entry": dc, "F.conv2d": dc_vendor}))

    pe = load(folder, "patch_embed_gemm", fresh=True)
    for rows in (16, 256):
        x = torch.randn(rows, 3, 2, 14, 14, device=dev, dtype=torch.bfloat16)
        w = torch.randn(1280, 3, 2, 14, 14, device=dev, dtype=torch.bfloat16) * 0.02
        b = torch.randn(1280, device=dev, dtype=torch.bfloat16)
        xf, wf = x.flatten(1), w.flatten(1)

        def pg(x: Any = x, w: Any = w, b: Any = b) -> Any:
            return pe.triton_conv3d_patchify(x, w, b)

        def pg_vendor(xf: Any = xf, wf: Any = wf, b: Any = b) -> Any:
            return F.linear(xf, wf, b)

        def pg_stock(x: Any = x, w: Any = w, b: Any = b) -> Any:
            return F.conv3d(x, w, b, stride=(2, 14, 14))

        name = f"patch-embed {rows}x1176 -> 1280 bf16"
        cases.append((name, pe, {"entry": pg, "F.linear": pg_vendor, "F.conv3d": pg_stock}))
    return cases


def one(folder: str, bursts: int, calls: int) -> dict[str, Any]:
    """Every case in this process, with the templates in ``folder``."""
    import torch

    rows = []
    with torch.inference_mode():
        for name, module, fns in _cases(folder):
            for fn in fns.values():
                fn()  # compiles, plans
            entry = fns["entry"]
            package = module.__package__
            # rocmfix_launcher in trees before it joined rocmfix_triton.
            launcher = (
                sys.modules.get(f"{package}.rocmfix_launcher")
                or sys.modules[f"{package}.rocmfix_triton"]
            )
            public = getattr(launcher, "_public_only", None)

            def public_entry(entry: Callable[[], Any] = entry, flag: Any = public) -> Any:
                flag.append(True)  # the process's fallback: every launch via kernel[grid]
                try:
                    return entry()
                finally:
                    flag.pop()

            timed = dict(fns)
            if isinstance(public, list):  # this tree's launcher has the public-only switch
                timed = {"entry": entry, "entry, kernel[grid] only": public_entry,
                         **{k: v for k, v in fns.items() if k != "entry"}}  # fmt: skip
            runs = _bursts(timed, bursts, calls)
            vendor = statistics.median(runs[list(fns)[1]])
            for row, times in runs.items():
                wall = statistics.median(times)
                graph = _graph_us(timed[row]) if row in fns else None
                rows.append({"case": name, "row": row, "wall_us": round(wall, 2),
                             "best_us": round(min(times), 2), "x_vendor": round(wall / vendor, 2),
                             "gpu_us": None if graph is None else round(graph, 2)})  # fmt: skip
    return {"templates": folder, "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "rows": rows}  # fmt: skip


def _print(result: dict[str, Any]) -> None:
    print(f"\n{result['templates']} ({result['device']}, torch {result['torch']})")
    print(f"{'case':38} {'row':26} {'wall us':>8} {'best':>7} {'x vendor':>8} {'gpu us':>7}")
    for r in result["rows"]:
        gpu = "-" if r["gpu_us"] is None else f"{r['gpu_us']:.2f}"
        print(f"{r['case']:38} {r['row']:26} {r['wall_us']:8.2f} {r['best_us']:7.2f} "
              f"{r['x_vendor']:8.2f} {gpu:>7}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("templates", nargs="*", default=[str(ROOT / "templates")])
    parser.add_argument("--bursts", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--budget", type=float, default=170.0)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.bursts, args.calls)))
        return
    started, results = time.monotonic(), []
    for _ in range(args.pairs):
        for folder in args.templates:
            left = args.budget - (time.monotonic() - started)
            if left < 20:
                print(f"budget spent: {folder} not run again", file=sys.stderr)
                continue
            cmd = [sys.executable, __file__, "--one", os.path.abspath(folder),
                   "--bursts", str(args.bursts), "--calls", str(args.calls)]  # fmt: skip
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=left)
            except subprocess.TimeoutExpired:
                print(f"{folder}: timed out", file=sys.stderr)
                continue
            sys.stderr.write(done.stderr[-4000:])
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
            if done.returncode or not lines:
                print(f"{folder}: exit {done.returncode}", file=sys.stderr)
                continue
            results.append(json.loads(lines[-1]))
            _print(results[-1])
    for result in results:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
