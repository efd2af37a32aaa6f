"""Wall per eager call of the depthwise entry, back to back, beside F.conv2d and the stock
modules, on one GPU (fp16, under ``torch.inference_mode()``): what a Python caller pays per
call at a launch-bound shape. ``bench/template_host.py`` interleaves rows that switch the
launch path, which re-plans; this loop does not.

    python bench/dw_call.py [TEMPLATES_DIR ...] [--calls 500] [--repeats 5]
"""

# ruff: noqa: B023 - each lambda is timed at once, inside its loop turn
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launch_parts import per_call  # noqa: E402  (bench/ is on the path when run)

from rocmfix.guest.templates import load  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("templates", nargs="*", default=[str(ROOT / "templates")])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    dev, dt = torch.device("cuda"), torch.float16
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'templates':<28} {'case':<24} {'entry us':>9} {'conv only':>9} "
          f"{'F.conv2d':>9} {'stock':>9}")  # fmt: skip
    for folder in args.templates:
        tri = load(folder, "depthwise_conv_triton", fresh=True)
        for c, k, s, hw in ((32, 5, 1, 16), (64, 3, 2, 32)):
            conv = torch.nn.Conv2d(c, c, k, s, k // 2, groups=c, bias=False).to(dev, dt).eval()
            bn, relu = torch.nn.BatchNorm2d(c).to(dev, dt).eval(), torch.nn.ReLU()
            x = torch.randn(1, c, hw, hw, device=dev, dtype=dt)
            with torch.inference_mode():
                row = [
                    per_call(lambda: tri.depthwise_conv2d(x, conv, bn, relu), args.calls,
                             args.repeats),
                    per_call(lambda: tri.depthwise_conv2d(x, conv), args.calls, args.repeats),
                    per_call(lambda: F.conv2d(x, conv.weight, None, s, k // 2, 1, c),
                             args.calls, args.repeats),
                    per_call(lambda: relu(bn(conv(x))), args.calls, args.repeats),
                ]  # fmt: skip
            name = f"1x{c}x{hw}x{hw} k{k} s{s}"
            print(f"{Path(folder).parent.name + '/' + Path(folder).name:<28} {name:<24} "
                  + " ".join(f"{v:9.2f}" for v in row))  # fmt: skip


if __name__ == "__main__":
    main()
