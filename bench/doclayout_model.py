"""Whole-model check of the dilated-conv templates in the real DocLayout-YOLO network.

Builds the released architecture from the installed ``doclayout-yolo`` package's
``yolov10m-doclayout.yaml`` (random weights, fixed seed, eval, fp32), then compares the stock
forward with ``DilatedBlock.dilated_conv`` monkeypatched (in this process only) to call each
template as rocmfix's rewrite does (with the block's ``bn`` and ``act``):

* outputs and top-k detections, patched vs stock (strict IEEE fp32 and TF32);
* ms per forward at 1280x928 (an A4 page letterboxed by MinerU), batch 1 and 4;
* torch.profiler (record_shapes) and a dispatch-level spy: which ``aten::convolution`` calls carry
  a dilation > 1 (none may remain once patched);
* Triton compiles: the kernel cache must not grow over new page sizes.

  python bench/doclayout_model.py --out DIR [--device cuda] [--size 1280 928]

Runs on the CPU too (phase template only; the Triton path then falls back to F.conv2d).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import _load  # bench/_load.py: the templates as the targets import them
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]


def load_template(name: str) -> ModuleType:
    return _load.template(name)


def build_model(device: str, nc: int = 10, seed: int = 0) -> torch.nn.Module:
    import doclayout_yolo
    from doclayout_yolo.nn.tasks import YOLOv10DetectionModel

    cfg = (
        Path(doclayout_yolo.__file__).parent / "cfg" / "models" / "v10" / "yolov10m-doclayout.yaml"
    )
    torch.manual_seed(seed)
    model = YOLOv10DetectionModel(str(cfg), nc=nc, verbose=False)
    # Non-trivial BN statistics, so the BN kept after the patched conv matters.
    g = torch.Generator().manual_seed(seed + 1)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return model.eval().to(device)


@contextlib.contextmanager
def patched(impl: Callable[..., torch.Tensor] | None) -> Iterator[None]:
    """Route DilatedBlock.dilated_conv through ``impl`` (GPU inputs) as rocmfix's rewrite does:
    ``impl(x, weight, dilation, padding, bn=bn, act=act)``."""
    from doclayout_yolo.nn.modules.g2l_crm import DilatedBlock

    original = DilatedBlock.dilated_conv
    if impl is None:
        yield
        return

    def dilated_conv(self: Any, x: torch.Tensor, dilation: int) -> torch.Tensor:
        act = self.dcv.act
        bn = self.dcv.bn
        weight = self.dcv.conv.weight
        padding = dilation * (self.k // 2)
        if x.is_cuda or impl_on_cpu:
            return impl(x, weight, dilation, padding, bn=bn, act=act)
        return act(bn(F.conv2d(x, weight, stride=1, padding=padding, dilation=dilation)))

    impl_on_cpu = getattr(impl, "__module__", "").endswith("dilated_conv_phase")
    DilatedBlock.dilated_conv = dilated_conv
    try:
        yield
    finally:
        DilatedBlock.dilated_conv = original


def _stock_line(
    x: torch.Tensor, weight: torch.Tensor, dilation: int, padding: int, *, bn: Any, act: Any
) -> torch.Tensor:
    return act(bn(F.conv2d(x, weight, None, 1, padding, dilation)))


class ConvSpy(TorchDispatchMode):
    """Counts aten.convolution calls by dilation as they reach the dispatcher."""

    def __init__(self) -> None:
        super().__init__()
        self.by_dilation: dict[int, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # Under inference_mode the mode sees aten.conv2d itself, elsewhere its decomposition
        # aten.convolution; dilation is argument 5 of both.
        if func in (torch.ops.aten.convolution.default, torch.ops.aten.conv2d.default):
            d = max(args[5]) if len(args) > 5 else 1
            self.by_dilation[d] = self.by_dilation.get(d, 0) + 1
        return func(*args, **(kwargs or {}))


def detections(out: Any, nc: int, k: int = 100) -> tuple[torch.Tensor, ...]:
    from doclayout_yolo.utils import ops

    preds = out["one2one"] if isinstance(out, dict) else out
    if isinstance(preds, (tuple, list)):
        preds = preds[0]
    boxes, scores, labels = ops.v10postprocess(preds.permute(0, 2, 1), k, nc)
    return preds, boxes, scores, labels


def compare(ref: Any, got: Any, nc: int) -> dict[str, float]:
    p0, b0, s0, l0 = detections(ref, nc)
    p1, b1, s1, l1 = detections(got, nc)
    rel = ((p1.double() - p0.double()).norm() / p0.double().norm()).item()
    # Same detection = same (box, label) up to tolerance; count stock top-100 entries found.
    found = 0
    total = 0
    for i in range(b0.shape[0]):
        for j in range(b0.shape[1]):
            total += 1
            close = ((b1[i] - b0[i, j]).abs().amax(-1) <= 1e-2 * (1 + b0[i, j].abs().amax())) & (
                l1[i] == l0[i, j]
            )
            found += int(bool(close.any()))
    return {
        "rel_err_raw": rel,
        "top100_matched": found / total,
        "max_abs_score_diff": (s1 - s0).abs().max().item(),
        "max_abs_box_diff_same_rank": (b1 - b0).abs().max().item(),
    }


def time_forward(
    model: torch.nn.Module, x: torch.Tensor, device: str, reps: int = 7, inner: int = 10
) -> float:
    """Median ms per forward over ``reps`` timings of ``inner`` back-to-back forwards."""
    with torch.inference_mode():
        for _ in range(5):
            model(x)
        times = []
        for _ in range(reps):
            if device == "cuda":
                torch.cuda.synchronize()
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                for _ in range(inner):
                    model(x)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / inner)
            else:
                t0 = time.perf_counter()
                for _ in range(inner):
                    model(x)
                times.append((time.perf_counter() - t0) * 1e3 / inner)
    return statistics.median(times)


def alternating(
    model: torch.nn.Module,
    x: torch.Tensor,
    impls: dict[str, Callable[..., torch.Tensor] | None],
    rounds: int,
    inner: int = 15,
) -> dict[str, list[float]]:
    """Wall ms per forward, eager, for each variant in turn, ``rounds`` times over: a round
    times ``inner`` back-to-back forwards of every variant (the order rotates each round), so
    a drift of the host or the GPU clock falls on all of them alike."""
    names = list(impls)
    times: dict[str, list[float]] = {n: [] for n in names}
    with torch.inference_mode():
        for name in names:
            with patched(impls[name]):
                for _ in range(5):
                    model(x)
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                with patched(impls[name]):
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    for _ in range(inner):
                        model(x)
                    torch.cuda.synchronize()
                    times[name].append((time.perf_counter() - start) * 1e3 / inner)
    return times


def in_context_host(
    model: torch.nn.Module,
    x: torch.Tensor,
    impls: dict[str, Callable[..., torch.Tensor] | None],
    rounds: int = 6,
    forwards: int = 5,
) -> dict[str, dict[str, float]]:
    """Median host µs of one ``DilatedBlock.dilated_conv`` call (conv, BN and act) inside the
    whole forward, per variant and for d = 1 and d > 1: a call among 500 others runs with
    cold caches, which a back-to-back micro-benchmark (bench/eager_host.py) does not see. Also
    the time to issue the whole forward, and its part outside the dilated calls: where a
    variant's calls are cheaper but its forward is not, it slows the ops around them. The
    variants take turns, ``forwards`` forwards each, over ``rounds`` rounds."""
    from doclayout_yolo.nn.modules.g2l_crm import DilatedBlock

    keys = ("d=1", "d>1", "forward", "outside")
    samples = {name: {k: [] for k in keys} for name in impls}
    names = list(impls)
    with torch.inference_mode():
        for r in range(rounds + 1):  # round 0 warms every variant up and is dropped
            for name in names[r % len(names) :] + names[: r % len(names)]:
                into = samples[name]
                with patched(impls[name]):
                    inner = DilatedBlock.dilated_conv
                    spent = [0.0]

                    def timed(self: Any, x: torch.Tensor, d: int, inner: Any = inner,
                              into: dict[str, list[float]] = into,
                              spent: list[float] = spent) -> torch.Tensor:  # fmt: skip
                        start = time.perf_counter()
                        y = inner(self, x, d)
                        took = time.perf_counter() - start
                        into["d=1" if d == 1 else "d>1"].append(took)
                        spent[0] += took
                        return y

                    DilatedBlock.dilated_conv = timed
                    try:
                        for _ in range(forwards):
                            torch.cuda.synchronize()
                            spent[0] = 0.0
                            start = time.perf_counter()
                            model(x)
                            issued = time.perf_counter() - start
                            into["forward"].append(issued)
                            into["outside"].append(issued - spent[0])
                        torch.cuda.synchronize()
                    finally:
                        DilatedBlock.dilated_conv = inner
                if r == 0:
                    for values in into.values():
                        values.clear()
    return {
        name: {k: statistics.median(v) * 1e6 for k, v in rows.items() if v}
        for name, rows in samples.items()
    }


def graph_forward_ms(model: torch.nn.Module, x: torch.Tensor, reps: int = 20) -> float | None:
    """GPU time of one forward: the whole forward captured in a CUDA graph and replayed."""
    try:
        static_x = x.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.inference_mode():
            with torch.cuda.stream(side):
                for _ in range(3):
                    model(static_x)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                model(static_x)
        graph.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            for _ in range(reps):
                graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / reps)
        del graph
        return statistics.median(times)
    except Exception as exc:  # noqa: BLE001  # report, do not abort the other measurements
        print(f"graph capture failed: {exc!r}", flush=True)
        return None


def profile_convs(model: torch.nn.Module, x: torch.Tensor, device: str) -> tuple[dict, str]:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.inference_mode():
        model(x)
        with profile(activities=acts, record_shapes=True) as prof:
            model(x)
    by_dil: dict[int, int] = {}
    for e in prof.events():
        if e.name == "aten::convolution":
            dil = e.concrete_inputs[5] if len(e.concrete_inputs) > 5 else None
            d = max(dil) if isinstance(dil, (list, tuple)) else -1  # -1: not recorded
            by_dil[d] = by_dil.get(d, 0) + 1
    sort = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=12, max_name_column_width=60)
    return by_dil, table


def alternate_report(
    model: torch.nn.Module,
    impls: dict[str, Callable[..., torch.Tensor] | None],
    args: argparse.Namespace,
) -> None:
    import triton

    h, w = args.size
    lines = [
        f"{time.strftime('%Y-%m-%d')} · {torch.cuda.get_device_name()} · torch "
        f"{torch.__version__} · triton {triton.__version__} · {h}x{w}, fp32 with TF32, "
        f"eager, inference_mode · {args.alternate} alternating rounds of 15 forwards"
        + (" · Python's garbage collector off" if args.no_gc else ""),
        "",
        "| batch | " + " | ".join(f"{n} ms" for n in impls) + " | "
        + " | ".join(f"{n}/stock (median, min)" for n in impls if n != "stock") + " |",
        "|---" * (1 + 2 * len(impls) - 1) + "|",
    ]  # fmt: skip
    g = torch.Generator(device="cpu").manual_seed(1)
    results = {}
    for n in args.batches:
        x = torch.rand(n, 3, h, w, generator=g).to("cuda")
        times = alternating(model, x, impls, args.alternate)
        results[f"b{n}"] = times
        med = {k: statistics.median(v) for k, v in times.items()}
        ratios = [
            statistics.median(a / b for a, b in zip(times[k], times["stock"], strict=True))
            for k in impls
            if k != "stock"
        ]
        lows = [min(times[k]) / min(times["stock"]) for k in impls if k != "stock"]
        lines.append(
            f"| {n} | " + " | ".join(f"{med[k]:.2f}" for k in impls) + " | "
            + " | ".join(f"{r:.3f}, {lo:.3f}" for r, lo in zip(ratios, lows, strict=True))
            + " |"
        )  # fmt: skip
        print(lines[-1], flush=True)
    if args.in_context:
        x = torch.rand(1, 3, h, w, generator=g).to("cuda")
        host = in_context_host(model, x, impls)
        lines += ["", "Host µs per `DilatedBlock.dilated_conv` call inside the batch-1 forward "
                  "(conv, BN, act; median of 30 forwards, the variants in turn):", "",
                  "| variant | d = 1 | d > 1 | issuing the forward | outside the dilated calls |",
                  "|---|---:|---:|---:|---:|"]  # fmt: skip
        for name, row in host.items():
            cells = " | ".join(f"{row.get(k, 0):.1f}" for k in ("d=1", "d>1", "forward", "outside"))
            lines.append(f"| {name} | {cells} |")
    text = "\n".join(lines) + "\n"
    print(text)
    (args.out / "doclayout_alternating.md").write_text(text)
    (args.out / "doclayout_alternating.json").write_text(json.dumps(results, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench-out")))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--size", type=int, nargs=2, default=(1280, 928), metavar=("H", "W"))
    ap.add_argument("--batches", type=int, nargs="+", default=(1, 4))
    ap.add_argument("--nc", type=int, default=10)
    ap.add_argument(
        "--alternate",
        type=int,
        metavar="ROUNDS",
        help="only the eager whole-forward table from ROUNDS alternating rounds (GPU)",
    )
    ap.add_argument(
        "--in-context",
        action="store_true",
        help="with --alternate: also each variant's host time per dilated call in the forward",
    )
    ap.add_argument(
        "--no-gc",
        action="store_true",
        help="with --alternate: Python's garbage collector off while timing",
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = args.device
    tri = load_template("dilated_conv_triton")
    phase = load_template("dilated_conv_phase")
    impls: dict[str, Callable[..., torch.Tensor] | None] = {
        "stock": None,
        "triton": tri.dilated_conv2d,
        "phase": phase.dilated_conv2d,
    }
    if dev != "cuda":
        impls.pop("triton")
    model = build_model(dev, args.nc)
    h, w = args.size
    if args.alternate:
        # The stock ops through the rewrite's route (what the route alone costs), and the
        # Triton conv with the modules called after it (what the fused store saves).
        def unfused(x: Any, w: Any, d: int, p: int, *, bn: Any, act: Any) -> Any:
            return act(bn(tri.dilated_conv2d(x, w, d, p)))

        impls = {"stock": None, "route": _stock_line, "unfused": unfused,
                 **{k: impls[k] for k in ("triton", "phase")}}  # fmt: skip
        if args.no_gc:
            gc.collect()
            gc.disable()
        alternate_report(model, impls, args)
        return
    g = torch.Generator(device="cpu").manual_seed(1)
    md = [f"# DocLayout-YOLO whole-model check ({time.strftime('%Y-%m-%d')})", ""]
    if dev == "cuda":
        import triton

        md.append(
            f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
            f"{triton.__version__}, cuDNN {torch.backends.cudnn.version()}"
        )
    md += [
        f"Model: yolov10m-doclayout.yaml, nc={args.nc}, random weights (seed 0), eval, fp32; "
        f"input {h}x{w}; Triton configs from {tri.kc.tuned_file_path()} if present.",
        "",
    ]
    results: dict[str, Any] = {"accuracy": {}, "timing": {}, "convs": {}}

    # Accuracy: strict IEEE (tight) and TF32 (torch default), batch 2 so batching is covered.
    md += [
        "## Outputs vs stock",
        "",
        "| precision | variant | rel err raw | top-100 matched | max score diff |",
        "|---|---|---|---|---|",
    ]
    x2 = torch.rand(2, 3, h, w, generator=g).to(dev)
    for prec in ("ieee", "tf32"):
        torch.backends.cudnn.conv.fp32_precision = prec
        with torch.inference_mode():
            ref = model(x2)
            for name, impl in impls.items():
                if impl is None:
                    continue
                with patched(impl):
                    got = model(x2)
                r = compare(ref, got, args.nc)
                results["accuracy"][f"{prec}/{name}"] = r
                md.append(
                    f"| {prec} | {name} | {r['rel_err_raw']:.2e} | "
                    f"{r['top100_matched']:.3f} | {r['max_abs_score_diff']:.2e} |"
                )
                print(md[-1], flush=True)
    torch.backends.cudnn.conv.fp32_precision = "tf32"

    # Timing (TF32, torch's default for cuDNN convs).
    md += [
        "",
        "## ms per forward (TF32 on, inference_mode)",
        "",
        "eager: median over 7 timings of 10 back-to-back forwards (at batch 1 the host, not "
        "the GPU, sets the pace); graph: the forward captured in a CUDA graph (GPU time).",
        "",
        "| batch | timing | "
        + " | ".join(impls)
        + " | "
        + " | ".join(f"{n}/stock" for n in impls if n != "stock")
        + " |",
        "|---" * (2 + 2 * len(impls) - 1) + "|",
    ]
    for n in args.batches:
        x = torch.rand(n, 3, h, w, generator=g).to(dev)
        for mode in ("eager", "graph") if dev == "cuda" else ("eager",):
            t: dict[str, float | None] = {}
            for name, impl in impls.items():
                with patched(impl):
                    t[name] = (
                        time_forward(model, x, dev)
                        if mode == "eager"
                        else graph_forward_ms(model, x)
                    )
            results["timing"][f"{mode}/b{n}"] = t
            md.append(
                f"| {n} | {mode} | "
                + " | ".join("n/a" if t[k] is None else f"{t[k]:.2f}" for k in impls)
                + " | "
                + " | ".join(
                    "n/a" if t[k] is None or t["stock"] is None else f"{t[k] / t['stock']:.3f}"
                    for k in impls
                    if k != "stock"
                )
                + " |"
            )
            print(md[-1], flush=True)

    # Which convolutions run: profiler (recorded args) and dispatcher spy.
    md += [
        "",
        "## Convolutions issued per forward (batch 1)",
        "",
        "| variant | profiler aten::convolution by dilation | dispatch spy by dilation |",
        "|---|---|---|",
    ]
    x1 = torch.rand(1, 3, h, w, generator=g).to(dev)
    tables = []
    for name, impl in impls.items():
        with patched(impl):
            by_dil, table = profile_convs(model, x1, dev)
            spy = ConvSpy()
            with torch.inference_mode(), spy:
                model(x1)
        results["convs"][name] = {"profiler": by_dil, "spy": spy.by_dilation}
        md.append(
            f"| {name} | {dict(sorted(by_dil.items()))} | {dict(sorted(spy.by_dilation.items()))} |"
        )
        print(md[-1], flush=True)
        tables.append(f"### {name}\n\n```\n{table}\n```\n")
        if name != "stock":
            assert not any(d > 1 for d in by_dil), f"{name}: dilated conv still issued"
            assert not any(d > 1 for d in spy.by_dilation), f"{name}: dilated conv still issued"

    if "triton" in impls:
        dev_idx = torch.cuda.current_device()
        kernels = [tri.dk.KERNEL]  # one kernel: the dot, FMA and descriptor kinds

        def compiled() -> int:
            return sum(len(k.device_caches[dev_idx][0]) for k in kernels)

        before = compiled()
        with patched(tri.dilated_conv2d), torch.inference_mode():
            for n, hh, ww in ((1, 1280, 1280), (4, 1280, 928), (2, 1024, 768), (1, 960, 1280)):
                model(torch.rand(n, 3, hh, ww, device=dev))
        after = compiled()
        md += [
            "",
            "## Triton compiles over page sizes",
            "",
            f"The dilated-conv kernels: {before} compiled variants after the runs above (two "
            f"shape classes x precisions used), {after} after forwards at 1280x1280 (b1), "
            f"1280x928 (b4), 1024x768 (b2), 960x1280 (b1).",
        ]
        results["compiles"] = [before, after]
        print(md[-1], flush=True)
    md += ["", "## Profiles (batch 1, top kernels)", "", *tables]
    (args.out / "model.md").write_text("\n".join(md) + "\n")
    (args.out / "model.json").write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
