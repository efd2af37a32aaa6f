"""Host cost per call of two dropped-in entry points on the CPU, with nothing launched: what a
template's own Python costs on the path every call but a layer's first takes.

* ``depthwise``: ``depthwise_conv2d`` on 27 conv-BN-ReLU layers (PP-DocLayoutV2's count) under
  ``TRITON_INTERPRET=1``, the launcher's ``__call__`` stubbed out (its own cost is
  bench/eager_host.py's row), so the row is the checks, the replay and the output's allocation;
* ``conv-transpose``: ``conv_transpose2d`` at a tiny size, from the template's source with
  its GPU test dropped (CPU tensors take the GEMM path), so the row is the checks, the views
  and the ops themselves; ``mm`` alone beside it.

    python bench/template_host.py [TEMPLATES_DIR] [--bursts 21]

Compare two trees by running each one's copy (``git archive`` the old commit's ``templates``,
``bench`` and ``rocmfix`` into a folder and point PYTHONPATH and TEMPLATES_DIR at it); on a
shared machine compare the best bursts, interleaving the runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import types
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: the templates' kernels

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rocmfix.guest.templates import load


def _bursts(fn: types.FunctionType, bursts: int, calls: int) -> tuple[float, float]:
    runs = []
    for _ in range(bursts):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(runs), min(runs)


def depthwise(folder: str, bursts: int) -> str:
    tri = load(folder, "depthwise_conv_triton", fresh=True)
    sys.modules[f"{tri.__package__}.rocmfix_launcher"].Launcher.__call__ = lambda *_: None  # type: ignore[attr-defined]
    torch.manual_seed(0)
    layers = []
    for _ in range(27):
        conv = torch.nn.Conv2d(32, 32, 5, 1, 2, groups=32, bias=False).eval()
        layers.append((conv, torch.nn.BatchNorm2d(32).eval(), torch.nn.ReLU()))
    x = torch.randn(1, 32, 16, 16)

    def forward() -> None:
        for conv, bn, act in layers:
            tri.depthwise_conv2d(x, conv, bn, act)

    with torch.no_grad():
        forward()
        med, best = _bursts(forward, bursts, 200)  # type: ignore[arg-type]
    return f"| depthwise, 27 layers | {med / 27:.2f} | {best / 27:.2f} |"


def conv_transpose(folder: str, bursts: int) -> list[str]:
    ct = load(folder, "conv_transpose_linear", fresh=True)
    source = Path(ct.__file__).read_text()  # type: ignore[arg-type]
    source = source.replace("if not x.is_cuda or params is None:", "if params is None:")
    mod = types.ModuleType(f"{ct.__name__}_cpu")
    mod.__package__ = ct.__package__
    sys.modules[mod.__name__] = mod
    exec(compile(source, str(ct.__file__), "exec"), mod.__dict__)
    torch.manual_seed(0)
    deconv = torch.nn.ConvTranspose2d(8, 4, 2, 2).eval()
    x = torch.randn(1, 8, 4, 4)
    with torch.no_grad():
        torch.testing.assert_close(mod.conv_transpose2d(x, deconv), deconv(x))
        entry = _bursts(lambda: mod.conv_transpose2d(x, deconv), bursts, 1000)  # type: ignore[arg-type]
        w = deconv.weight.view(8, 16).t()
        xv = x.view(8, 16)
        mm = _bursts(lambda: torch.mm(w, xv), bursts, 1000)  # type: ignore[arg-type]
    return [
        f"| conv-transpose 1x8x4x4 -> 4, k2 | {entry[0]:.2f} | {entry[1]:.2f} |",
        f"| (mm alone) | {mm[0]:.2f} | {mm[1]:.2f} |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "templates", nargs="?", default=str(Path(__file__).parents[1] / "templates")
    )
    parser.add_argument("--bursts", type=int, default=21)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, {args.templates}")
    print("| entry | median us/call | best us/call |\n|---|---|---|")
    print(depthwise(args.templates, args.bursts))
    print("\n".join(conv_transpose(args.templates, args.bursts)))


if __name__ == "__main__":
    main()
