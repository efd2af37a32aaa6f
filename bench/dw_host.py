"""Host cost of a replayed depthwise conv call and a transposed-conv call on the CPU, with the
launch stubbed where it leaves Python: what the templates' own code costs per call, step by
step, beside the torch calls it is made of.

The depthwise kernel is replaced by a stand-in with the real kernel's signature whose
``kernel[grid](...)`` returns a compiled kernel with a no-op ``run`` (what Triton's C launcher
would be), and Triton's driver by one whose current device and stream are C builtins: the
``Launcher`` adopts it as it adopts a real one, so the row is the entry's checks, the output's
allocation, the Launcher's checks and the call into ``run``. The transposed conv runs its
real torch ops on CPU tensors (its GPU test dropped from the source), so its row includes
``mm``'s and ``add``'s CPU dispatch, ``mm`` alone beside it.

    python bench/dw_host.py [TEMPLATES_DIR ...] [--bursts 21]

Compare trees by naming each one's ``templates`` folder (``git archive`` an old commit's into
a folder): their bursts are interleaved, case by case. On a shared machine read the best
bursts as much as the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: the templates' kernels

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rocmfix.guest.templates import load


def _bursts(fn: Callable[[], Any], bursts: int, calls: int) -> tuple[float, float]:
    runs = []
    for _ in range(bursts):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(runs), min(runs)


class _Compiled:
    function = "function"
    packed_metadata = "metadata"

    def run(self, *args: Any) -> None:
        pass


class _Kernel:
    """A JITFunction stand-in: the real kernel's signature, a compiled kernel per launch."""

    def __init__(self, real: Any) -> None:
        self.fn = getattr(real, "fn", real)
        self.compiled = _Compiled()
        self.pre_run_hooks: list[Any] = []

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: self.compiled


def _stub_launches(tri: types.ModuleType) -> None:
    package = sys.modules[tri.__package__]  # type: ignore[index]
    launcher = package.rocmfix_launcher
    dk = package.depthwise_conv_kernels
    import triton

    active = types.SimpleNamespace(get_current_device=int, get_current_stream=int)
    launcher._launch_path[:] = [(triton.knobs, types.SimpleNamespace(active=active))]
    dk.KERNEL = _Kernel(dk.KERNEL)


def depthwise_calls(folder: str) -> list[tuple[str, Callable[[], Any]]]:
    """One replayed call per case, from ``folder``'s template (launch stubbed)."""
    tri = load(folder, "depthwise_conv_triton", fresh=True)
    _stub_launches(tri)
    torch.manual_seed(0)
    c = 64
    x = torch.randn(1, c, 30, 21)
    calls: list[tuple[str, Callable[[], Any]]] = []
    for label, bn, act, stride in (
        ("conv + BN + Hardswish, 3x3", torch.nn.BatchNorm2d(c).eval(), torch.nn.Hardswish(), 1),
        ("conv alone, 3x3", None, None, 1),
        ("conv alone, 3x3 stride 2", None, None, 2),
    ):
        conv = torch.nn.Conv2d(c, c, 3, stride, 1, groups=c, bias=False).eval()
        with torch.no_grad():
            tri.depthwise_conv2d(x, conv, bn, act)
            tri.depthwise_conv2d(x, conv, bn, act)
        assert id(conv) in getattr(tri, "_replays", {}), "no replay plan"

        def call(conv: Any = conv, bn: Any = bn, act: Any = act) -> Any:
            return tri.depthwise_conv2d(x, conv, bn, act)

        calls.append((f"depthwise entry: {label}", call))
    return calls


def interleaved(
    folders: list[str], make: Callable[[str], list[tuple[str, Callable[[], Any]]]], bursts: int
) -> list[str]:
    """Each case of each folder's copy, their bursts taken in turn (A, B, A, B ...), so that
    a shared machine's load weighs on all alike."""
    per = [make(folder) for folder in folders]
    rows = []
    with torch.no_grad():
        for case in range(len(per[0])):
            runs: list[list[float]] = [[] for _ in folders]
            for _ in range(bursts):
                for index, calls in enumerate(per):
                    runs[index].append(_bursts(calls[case][1], 1, 2000)[0])
            for index, folder in enumerate(folders):
                tag = (
                    f" ({Path(folder).parent.name}/{Path(folder).name})" if len(folders) > 1 else ""
                )
                rows.append(f"| {per[index][case][0]}{tag} | {statistics.median(runs[index]):.2f} "
                            f"| {min(runs[index]):.2f} |")  # fmt: skip
    return rows


def primitives(bursts: int) -> list[str]:
    x = torch.randn(1, 64, 30, 21)
    shape = tuple(x.shape)
    fns: list[tuple[str, Callable[[], Any]]] = [
        ("x.new_empty(tuple)", lambda: x.new_empty(shape)),
        ("torch.empty(tuple, dtype=, device=)",
         lambda: torch.empty(shape, dtype=x.dtype, device=x.device)),
        ("torch.empty_like(x)", lambda: torch.empty_like(x)),
        ("torch.empty_like(x, memory_format=contiguous)",
         lambda: torch.empty_like(x, memory_format=torch.contiguous_format)),
        ("x.data_ptr()", x.data_ptr),
        ("x._version", lambda: x._version),
        ("x.stride()", x.stride),
        ("x.shape", lambda: x.shape),
    ]  # fmt: skip
    out = []
    with torch.no_grad():
        for label, fn in fns:
            med, best = _bursts(fn, bursts, 5000)
            out.append(f"| {label} | {med:.2f} | {best:.2f} |")
    return out


def conv_transpose_calls(folder: str) -> list[tuple[str, Callable[[], Any]]]:
    ct = load(folder, "conv_transpose_linear", fresh=True)
    source = Path(ct.__file__).read_text()  # type: ignore[arg-type]
    source = source.replace("if not x.is_cuda or params is None:", "if params is None:")
    mod = types.ModuleType(f"{ct.__name__}_cpu")
    mod.__package__ = ct.__package__
    sys.modules[mod.__name__] = mod
    exec(compile(source, str(ct.__file__), "exec"), mod.__dict__)
    torch.manual_seed(0)
    calls: list[tuple[str, Callable[[], Any]]] = []
    for label, cin, cout, bias in (("16 -> 16, bias", 16, 16, True), ("16 -> 1", 16, 1, False)):
        deconv = torch.nn.ConvTranspose2d(cin, cout, 2, 2, bias=bias).eval()
        x = torch.randn(1, cin, 2, 2)
        with torch.no_grad():
            torch.testing.assert_close(mod.conv_transpose2d(x, deconv), deconv(x))
        w = deconv.weight.detach().view(cin, -1).t()
        xv = x.view(cin, 4)
        calls += [
            (f"conv-transpose entry {label}, 1x{cin}x2x2",
             lambda d=deconv, x=x: mod.conv_transpose2d(x, d)),
            (f"  (its mm alone, {label})", lambda w=w, xv=xv: torch.mm(w, xv)),
        ]  # fmt: skip
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "templates", nargs="*", default=[str(Path(__file__).parents[1] / "templates")]
    )
    parser.add_argument("--bursts", type=int, default=21)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"{args.templates}")  # fmt: skip
    print("| call | median µs | best µs |\n|---|---:|---:|")
    print("\n".join(interleaved(args.templates, depthwise_calls, args.bursts)))
    print("\n".join(interleaved(args.templates, conv_transpose_calls, args.bursts)))
    print("\n".join(primitives(args.bursts)))


if __name__ == "__main__":
    main()
