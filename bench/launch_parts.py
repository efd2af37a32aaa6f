"""Where the depthwise entry's host time goes per eager call, step by step, on one GPU (fp16,
under ``torch.inference_mode()``, 1x32x16x16 k5 s1 and 1x64x32x32 k3 s2, conv only): the
whole entry, its checks, its key, its plan lookup, the Launcher, the compiled kernel's own
runner (with and without a stream given), ``kernel[grid]``, and F.conv2d beside them. With
``--old FOLDER`` (another templates folder, e.g. an older commit's), the two entries' whole
calls too, old and new in turn, each beside F.conv2d.

    python bench/launch_parts.py [--old /tmp/old_templates] [--calls 2000] [--repeats 5]
"""

# ruff: noqa: B023 - each lambda is timed at once, inside its loop turn
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rocmfix.guest.templates import load  # noqa: E402


def per_call(fn: Any, calls: int, repeats: int) -> float:
    """Median over ``repeats`` of the wall per call of ``calls`` back-to-back calls, in us."""
    for _ in range(50):
        fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def parts(tri: Any, conv: Any, x: torch.Tensor, calls: int, repeats: int) -> None:
    """The rows of this tree's entry (its plan is the one the entry made for ``conv``)."""
    ks = tri.ks
    c, k, s = conv.in_channels, conv.kernel_size[0], conv.stride[0]
    w = conv.weight
    tri.clear_config_cache()
    tri.depthwise_conv2d(x, conv)
    ((key, plan),) = tri._plans.items()
    launcher, rest, shape, contiguous = plan
    out = x.new_empty(shape)
    args = (x, w, w, w, out, *rest)
    tail, runner = launcher.tail, launcher.runner
    device = torch.cuda.current_device()
    stream = torch.cuda.current_stream().cuda_stream
    kernel, grid, kwargs = launcher.kernel, launcher.grid, launcher.kwargs
    rows = {
        "F.conv2d": lambda: F.conv2d(x, w, None, s, k // 2, 1, c),
        "entry depthwise_conv2d": lambda: tri.depthwise_conv2d(x, conv),
        "_launch (key given)": lambda: tri._launch(key, x, w, None, None, (1, 1), (0, 0), 0,
                                                   conv),
        # The entry's key, as it builds it (conv only: no scale, no shift).
        "key (19 fields, flat)": lambda: (
            x.shape, x.stride(), x.dtype, x.get_device(), x.data_ptr() % 16, w.shape,
            w.stride(), w.dtype, w.get_device(), w.data_ptr() % 16, type(conv), conv.stride,
            conv.padding, conv.dilation, conv.groups, conv.padding_mode, 0, None, None),
        "_plans.get": lambda: tri._plans.get(key),
        "x.new_empty": lambda: x.new_empty(shape),
        "checks: compiling": tri._compiling,
        "checks: training": lambda: ks.training(x, w, None, bn=None),
        "checks: autocast": tri._autocast,
        "checks: layer_hooked": lambda: ks.layer_hooked(conv, None, None),
        "checks: _epilogue": lambda: tri._epilogue(None, None, None),
        "Launcher(*args)": lambda: launcher(*args),
        "runner(*args, *tail)": lambda: runner(*args, *tail),
        "runner(..., stream=)": lambda: runner(*args, *tail, stream=stream),
        "kernel[grid](...)": lambda: kernel[grid](*args, **kwargs),
        "cuda.current_device": torch.cuda.current_device,
        "Triton's current stream": lambda: launcher.stream(device),
        "cuda.current_stream": lambda: torch.cuda.current_stream().cuda_stream,
    }  # fmt: skip
    print(f"\n1x{c}x{x.shape[2]}x{x.shape[3]} k{k} s{s} fp16: us per call (plan: weight"
          f" contiguous {contiguous}, runner adopted {runner is not None})")  # fmt: skip
    for name, fn in rows.items():
        print(f"  {name:<26} {per_call(fn, calls, repeats):8.2f}", flush=True)
    if runner is not None:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            tri.depthwise_conv2d(x, conv)
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)


def old_vs_new(trees: dict[str, Any], conv: Any, x: torch.Tensor, a: Any) -> None:
    """Each tree's whole entry call, in turn (three rounds), beside F.conv2d: medians."""
    c, k, s = conv.in_channels, conv.kernel_size[0], conv.stride[0]
    runs: dict[str, list[float]] = {"F.conv2d": [], **{name: [] for name in trees}}
    for _ in range(3):
        runs["F.conv2d"].append(
            per_call(lambda: F.conv2d(x, conv.weight, None, s, k // 2, 1, c), a.calls, a.repeats)
        )
        for name, tri in trees.items():
            runs[name].append(per_call(lambda: tri.depthwise_conv2d(x, conv), a.calls, a.repeats))
    base = statistics.median(runs["F.conv2d"])
    print(f"\n1x{c}x{x.shape[2]}x{x.shape[3]} k{k} s{s} fp16, conv only: us per call "
          "(median of 3 rounds, each the median of --repeats)")  # fmt: skip
    for name, values in runs.items():
        value = statistics.median(values)
        print(f"  {name:<26} {value:8.2f}  {value / base:5.2f}x F.conv2d", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", help="another templates folder, timed beside this tree's")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    a = parser.parse_args()
    dev, dt = torch.device("cuda"), torch.float16
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    tri = load(str(ROOT / "templates"), "depthwise_conv_triton", fresh=True)
    trees = {"entry, new": tri}
    if a.old:
        print(f"new: {ROOT / 'templates'}\nold: {a.old}")
        trees["entry, old"] = load(a.old, "depthwise_conv_triton", fresh=True)
    for c, k, s, hw in ((32, 5, 1, 16), (64, 3, 2, 32)):
        conv = torch.nn.Conv2d(c, c, k, s, k // 2, groups=c, bias=False).to(dev, dt).eval()
        x = torch.randn(1, c, hw, hw, device=dev, dtype=dt)
        with torch.inference_mode():
            if a.old:
                old_vs_new(trees, conv, x, a)
            parts(tri, conv, x, a.calls, a.repeats)


if __name__ == "__main__":
    main()
