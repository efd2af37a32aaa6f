"""1x1 convs (the pointwise-conv op) at MinerU's and DocLayout-YOLO's shapes, on one NVIDIA GPU:
the op's GEMM against ``F.conv2d`` with cuDNN on (the vendor conv library) and with
``torch.backends.cudnn.enabled = False`` (PyTorch's own path: the stand-in for a vendor library
without fast kernels for these shapes, as MIOpen is for some).

For every case of rocmfix/ops/pointwise_conv.py, in fp32 and fp16, NCHW and channels-last:

- ``cudnn``: ``conv(x)``, the ``nn.Conv2d`` as the model calls it, cuDNN on;
- ``native``: the same with cuDNN off;
- ``op``: templates/pointwise_conv_gemm.py's entry, ``pointwise_conv2d(x, conv)`` (its checks
  and the GEMM), as the patched layer calls it; ``gemm``: its GEMM alone;
- ``mul+sum`` (grouped convs with at most 16 weights a group; not shipped): broadcast
  multiplies and a sum instead of the batched GEMM, shown after the row when it ran.

Each time is the median over many rounds of a CUDA-event-timed burst of calls (eager: what a
user's Python loop gets, launch cost included), and, with ``--graphs``, the same calls replayed
as a CUDA graph (the kernels alone). Ratios are stock time / op time (above 1: the op is
faster). Max abs error of the op against ``F.conv2d`` (cuDNN on) and, for scale, of both
against an fp64 reference. Results: a plain-text table on stdout and ``--json PATH``.

    python bench/pointwise_conv.py --json pointwise.json            # about a minute
    python bench/pointwise_conv.py --graphs --json pointwise.json   # kernel times too
    python bench/pointwise_conv.py --dry                            # the script on a CPU

Needs torch (2.11 was the target) and a CUDA GPU; nothing else, no network. fp32 is run as a
user runs it: cuDNN's convs in TF32 (``cudnn.allow_tf32`` defaults to True), matmuls in full
fp32 (``cuda.matmul.allow_tf32`` defaults to False); ``--matmul-tf32`` lets the GEMM use TF32 too.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
from collections.abc import Callable
from typing import Any

import _load  # bench/_load.py: the templates as the targets import them
import torch

from rocmfix.ops import op

DTYPES = {"float32": torch.float32, "float16": torch.float16}
LAYOUTS = ("nchw", "channels-last")


def _sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def eager_ms(fn: Callable[[], Any], dev: str, burst: int, rounds: int) -> float:
    """Median per-call time of ``rounds`` bursts of ``burst`` calls, each burst timed by CUDA
    events (wall time on a CPU)."""
    for _ in range(3):
        fn()
    _sync(dev)
    times = []
    for _ in range(rounds):
        if dev == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(burst):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / burst)
        else:
            import time

            t0 = time.perf_counter()
            for _ in range(burst):
                fn()
            times.append((time.perf_counter() - t0) * 1e3 / burst)
    return statistics.median(times)


def graph_ms(fn: Callable[[], Any], burst: int, rounds: int) -> float:
    """Median per-call time of a CUDA graph of ``burst`` calls, replayed ``rounds`` times."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(burst):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / burst)
    return statistics.median(times)


def no_cudnn(fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        with torch.backends.cudnn.flags(enabled=False):
            return fn()

    return run


def shapes(dry: bool) -> list[dict[str, Any]]:
    """The op's cases, each once (by its GPU shape, or its CPU shape with --dry), in both
    dtypes and layouts."""
    seen, out = set(), []
    for case in op("pointwise-conv").cases:
        s = case.cpu if dry else case.gpu
        key = (s["n"], s["cin"], s["cout"], s["g"], s["h"], s["w"])
        if key in seen:
            continue
        seen.add(key)
        out += [dict(s, dtype=d, layout=lay) for d in DTYPES for lay in LAYOUTS]
    return out


def one(s: dict[str, Any], module: Any, dev: str, args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    dtype = DTYPES[s["dtype"]]
    cin, cout, g = s["cin"], s["cout"], s["g"]
    conv = torch.nn.Conv2d(cin, cout, 1, groups=g, bias=False).to(dev, dtype).eval()
    x = torch.randn(s["n"], cin, s["h"], s["w"], device=dev, dtype=dtype)
    if s["layout"] == "channels-last":
        x = x.contiguous(memory_format=torch.channels_last)
        conv = conv.to(memory_format=torch.channels_last)
    w = conv.weight

    def gemm() -> Any:
        return module.gemm(x, w, None, g)

    def mulsum() -> Any:
        # Not shipped: a grouped 1x1 with few channels a group as broadcast multiplies and a
        # sum (no GEMM), to see whether the batched GEMM is the right formulation there.
        n, _, h, wd = x.shape
        cig, cog = cin // g, cout // g
        if x.is_contiguous():
            prod = x.view(n, g, 1, cig, h * wd) * w.view(1, g, cog, cig, 1)
            return prod.sum(3).view(n, cout, h, wd)
        rows = x.permute(0, 2, 3, 1).reshape(-1, g, 1, cig)
        out = (rows * w.view(1, g, cog, cig)).sum(-1)
        return out.view(n, h, wd, cout).permute(0, 3, 1, 2)

    calls: dict[str, Callable[[], Any]] = {
        "cudnn": lambda: conv(x),
        "native": no_cudnn(lambda: conv(x)),
        "op": lambda: module.pointwise_conv2d(x, conv),
        "gemm": gemm,
    }
    if g > 1 and cin // g * (cout // g) <= 16:
        calls["mulsum"] = mulsum
    row: dict[str, Any] = {**s, "label": op("pointwise-conv").label(s)}
    with torch.inference_mode():
        ref = torch.nn.functional.conv2d(x.double(), w.double(), groups=g)
        outs = {name: fn() for name, fn in calls.items()}
        for name, out in outs.items():
            row[f"err_{name}"] = float((out.double() - ref).abs().max())
        row["err_op_vs_cudnn"] = float((outs["op"].double() - outs["cudnn"].double()).abs().max())
        mine, theirs = outs["op"], outs["cudnn"]
        row["op_layout_as_cudnn"] = all(
            mine.is_contiguous(memory_format=f) == theirs.is_contiguous(memory_format=f)
            for f in (torch.contiguous_format, torch.channels_last)
        )
        for name, fn in calls.items():
            row[f"ms_{name}"] = eager_ms(fn, dev, args.burst, args.rounds)
            if args.graphs and dev == "cuda":
                row[f"graph_ms_{name}"] = graph_ms(fn, args.burst, args.rounds)
    if "ms_mulsum" in row:
        row["x_mulsum_vs_op"] = row["ms_op"] / row["ms_mulsum"]
    for base in ("cudnn", "native"):
        row[f"x_{base}"] = row[f"ms_{base}"] / row["ms_op"]
        if f"graph_ms_{base}" in row:
            row[f"graph_x_{base}"] = row[f"graph_ms_{base}"] / row["graph_ms_op"]
    return row


def table(rows: list[dict[str, Any]], graphs: bool) -> str:
    head = (f"{'shape':<34} {'cuDNN':>8} {'native':>8} {'op':>8} {'gemm':>8} {'vs cuDNN':>8} "
            f"{'vs nat.':>8} {'err op-cuDNN':>12}")  # fmt: skip
    if graphs:
        head += f" {'graph vs cuDNN':>14} {'graph vs nat.':>13}"
    lines = [head, "-" * len(head)]
    for r in rows:
        line = (f"{r['label']:<34} {r['ms_cudnn'] * 1e3:>6.1f}us {r['ms_native'] * 1e3:>6.1f}us "
                f"{r['ms_op'] * 1e3:>6.1f}us {r['ms_gemm'] * 1e3:>6.1f}us {r['x_cudnn']:>7.2f}x "
                f"{r['x_native']:>7.2f}x {r['err_op_vs_cudnn']:>12.2e}")  # fmt: skip
        if graphs and "graph_x_cudnn" in r:
            line += f" {r['graph_x_cudnn']:>13.2f}x {r['graph_x_native']:>12.2f}x"
        if "x_mulsum_vs_op" in r:
            alt = r["ms_mulsum"] * 1e3
            line += f"  (mul+sum {alt:.1f}us: op/mul+sum {r['x_mulsum_vs_op']:.2f}x)"
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every row here")
    parser.add_argument("--graphs", action="store_true", help="also time CUDA-graph replays")
    parser.add_argument("--burst", type=int, default=20, help="calls a timed burst")
    parser.add_argument("--rounds", type=int, default=50, help="timed bursts a call (median)")
    parser.add_argument("--matmul-tf32", action="store_true", help="let fp32 GEMMs use TF32")
    parser.add_argument("--dry", action="store_true", help="the CPU shapes on the CPU, briefly")
    args = parser.parse_args()
    dev = "cpu" if args.dry else "cuda"
    if args.dry:
        args.burst, args.rounds = 1, 2
    elif not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU (--dry runs the script on the CPU)")
    torch.backends.cuda.matmul.allow_tf32 = args.matmul_tf32
    module = _load.template("pointwise_conv_gemm")
    device = torch.cuda.get_device_name(0) if dev == "cuda" else "CPU (--dry)"
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# {device}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {when}")
    print("# times: median per call of event-timed bursts (eager); ratios: stock / op")
    rows = []
    for s in shapes(args.dry):
        rows.append(one(s, module, dev, args))
        print(table(rows[-1:], args.graphs).splitlines()[-1], flush=True)
    print()
    print(table(rows, args.graphs))
    for base in ("cudnn", "native"):
        ratios = [r[f"x_{base}"] for r in rows]
        print(f"# vs {base}: median {statistics.median(ratios):.2f}x, "
              f"min {min(ratios):.2f}x, max {max(ratios):.2f}x")  # fmt: skip
    if not all(r["op_layout_as_cudnn"] for r in rows):
        print("# WARNING: the op's output layout differs from F.conv2d's for some rows")
    if args.json:
        meta = {"device": device, "torch": torch.__version__, "date": when,
                "cudnn": torch.backends.cudnn.version(),
                "matmul_tf32": args.matmul_tf32}  # fmt: skip
        with open(args.json, "w") as handle:
            json.dump({"meta": meta, "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
