"""Where the depthwise entry's host time goes per eager call, step by step, on one GPU (fp16,
under ``torch.inference_mode()``, 1x32x16x16 k5 s1 and 1x64x32x32 k3 s2, conv only): the
whole entry, its checks, its key, its plan lookup, the Launcher, the compiled kernel's own
runner (with and without a stream given), ``kernel[grid]``, and F.conv2d beside them.

    python bench/launch_parts.py [--calls 2000] [--repeats 5]
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    a = parser.parse_args()
    dev, dt = torch.device("cuda"), torch.float16
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    tri = load(str(ROOT / "templates"), "depthwise_conv_triton", fresh=True)
    ks, rl = tri.ks, tri.rl
    for c, k, s, hw in ((32, 5, 1, 16), (64, 3, 2, 32)):
        conv = torch.nn.Conv2d(c, c, k, s, k // 2, groups=c, bias=False).to(dev, dt).eval()
        x = torch.randn(1, c, hw, hw, device=dev, dtype=dt)
        w = conv.weight
        with torch.inference_mode():
            tri.depthwise_conv2d(x, conv)
            key = (rl.layout_key(x), rl.layout_key(w), type(conv), conv.stride, conv.padding,
                   conv.dilation, conv.groups, conv.padding_mode, 0, None, None)  # fmt: skip
            plan = tri._plans.get(key)
            assert plan is not None, "no plan under the expected key"
            launcher, rest, shape = plan
            out = x.new_empty(shape)
            args = (x, w, w, w, out, *rest)
            tail = launcher.tail
            runner = launcher.runner
            stream = torch.cuda.current_stream().cuda_stream
            kernel, grid, kwargs = launcher.kernel, launcher.grid, launcher.kwargs
            rows = {
                "F.conv2d": lambda: F.conv2d(x, w, None, s, k // 2, 1, c),
                "entry depthwise_conv2d": lambda: tri.depthwise_conv2d(x, conv),
                "_eager (no type checks)": lambda: tri._eager(x, conv, None, None),
                "_launch (key given)": lambda: tri._launch(x, w, None, None, (1, 1), (0, 0), 0,
                                                           key, conv),
                "key (11 fields)": lambda: (rl.layout_key(x), rl.layout_key(w), type(conv),
                                            conv.stride, conv.padding, conv.dilation,
                                            conv.groups, conv.padding_mode, 0, None, None),
                "layout_key(x)": lambda: rl.layout_key(x),
                "_plans.get": lambda: tri._plans.get(key),
                "x.new_empty": lambda: x.new_empty(shape),
                "checks: training": lambda: ks.training(x, w, None, bn=None),
                "checks: autocast": lambda: tri._autocast(),
                "checks: layer_hooked": lambda: ks.layer_hooked(conv, None, None),
                "checks: _epilogue": lambda: tri._epilogue(None, None, None),
                "Launcher(*args)": lambda: launcher(*args),
                "runner(*args, *tail)": lambda: runner(*args, *tail),
                "runner(..., stream=)": lambda: runner(*args, *tail, stream=stream),
                "kernel[grid](...)": lambda: kernel[grid](*args, **kwargs),
                "cuda.current_device": torch.cuda.current_device,
                "cuda.current_stream": lambda: torch.cuda.current_stream().cuda_stream,
            }  # fmt: skip
            print(f"\n1x{c}x{hw}x{hw} k{k} s{s} fp16: us per call")
            for name, fn in rows.items():
                print(f"  {name:<26} {per_call(fn, a.calls, a.repeats):8.2f}", flush=True)
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


if __name__ == "__main__":
    main()
