"""GPU benchmark of the dilated-conv templates on DocLayout-YOLO's real conv shapes.

Shapes (yolov10m-doclayout.yaml at a 1280x928 page): 96->96 5x5, d = 1, 2, 3 at 160x116 (P3) and
192->192 3x3, d = 1, 3, 5 at 80x58 (P4); batch 1 and 4.  Modes: fp32 with TF32 (torch's
default), fp32 strict IEEE, bf16.  For each: cuDNN ``F.conv2d`` (dilated), the phase split
(templates/dilated_conv_phase.py) and the Triton kernel (templates/dilated_conv_triton.py), timed
in the same process with ``triton.testing.do_bench`` medians; errors are ||y - ref|| / ||ref||
against an fp64 reference on the same inputs.

  python bench/dilated_conv.py --out DIR [--sweep] [--workers 12]

--sweep first times a list of launch configs per (precision, shape class), picks the fastest
(batch 1 + batch 4 time at the largest dilation) and writes them as a rocmfix tuned file
(DIR/tuned.json), which the main table and bench/doclayout_model.py then use.  Markdown and JSON
results go to DIR.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import _load  # bench/_load.py: the templates as the targets import them
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
DEVICE = "cuda"
SHAPES = [  # (name, C, k, H, W, dilations)
    ("P3 96ch 5x5", 96, 5, 160, 116, (1, 2, 3)),
    ("P4 192ch 3x3", 192, 3, 80, 58, (1, 3, 5)),
]
BATCHES = (1, 4)
MODES = ("tf32", "ieee", "bf16")


def _c(
    bm: int, bn: int, bk: int, nw: int, ns: int, ti: int = 1, nhwc: int = 1, tma: int = 0
) -> dict[str, int]:
    return {
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "num_warps": nw,
        "num_stages": ns,
        "taps_inner": ti,
        "nhwc": nhwc,
        "tma": tma,
    }


# Sweep candidates, pre-screened offline (Triton's sm_90 compile: no register spills) and
# narrowed by earlier sweeps on an H200 (docs/performance-dilated-conv.md).
# nhwc=0: strided (NCHW) loads, 4 bytes per access; nhwc=1: channels-last copy, 16-byte
# cp.async; tma=1: tensor-descriptor (TMA) boxes, BLOCK_M = a row segment of the output.
CANDIDATES: dict[str, list[dict[str, int]]] = {
    "tf32": [
        *(
            _c(*t)
            for t in [
                (64, 128, 32, 4, 3),
                (128, 64, 32, 4, 3),
                (128, 64, 32, 8, 3),
                (256, 64, 32, 8, 3),
                (128, 128, 32, 8, 3),
                (64, 256, 32, 8, 3),
                (128, 128, 16, 8, 4),
            ]
        ),
        _c(256, 64, 32, 8, 3, nhwc=0),
        *(_c(*t, tma=1) for t in [(32, 128, 32, 4, 4), (128, 128, 64, 8, 2), (64, 128, 32, 4, 4)]),
    ],
    "bf16": [
        *(
            _c(*t)
            for t in [
                (128, 128, 32, 4, 3),
                (128, 128, 64, 8, 3),
                (256, 64, 64, 8, 3),
                (128, 128, 64, 8, 1),
                (64, 128, 64, 4, 3),
                (128, 64, 64, 4, 3),
            ]
        ),
        _c(128, 128, 32, 4, 3, nhwc=0),
        *(_c(*t, tma=1) for t in [(128, 128, 32, 4, 4), (64, 128, 64, 4, 4), (64, 256, 64, 8, 3)]),
    ],
    "ieee": [
        _c(64, 32, 16, 4, 2, nhwc=0),
        _c(64, 64, 32, 4, 2, nhwc=0),
        *(
            _c(*t)
            for t in [
                (64, 32, 16, 4, 2),
                (64, 64, 32, 4, 2),
                (64, 128, 16, 4, 2),
                (128, 64, 16, 8, 2),
            ]
        ),
    ],
}
SWEEP_TOL = {"tf32": 5e-3, "bf16": 1e-2, "ieee": 1e-5}
PREC_CLASS = {"tf32": "tf32", "ieee": "fp32", "bf16": "f16"}


def load_template(name: str) -> ModuleType:
    return _load.template(name)


def set_mode(mode: str) -> torch.dtype:
    """Set torch's TF32 switches for a mode and return the tensor dtype."""
    tf32 = mode == "tf32"
    torch.backends.cudnn.conv.fp32_precision = "tf32" if tf32 else "ieee"
    torch.backends.cuda.matmul.fp32_precision = "tf32" if tf32 else "ieee"
    return torch.bfloat16 if mode == "bf16" else torch.float32


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(y).all():
        return float("nan")
    return ((y.double() - ref).norm() / ref.norm()).item()


def bench_ms(fn: Callable[[], Any], rep: int = 100) -> float:
    """do_bench median: events around each call, L2 flushed in between.  A call whose host
    work outlasts the GPU work queued before it is timed partly on the host."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=rep, return_mode="median"))


def graph_ms(fn: Callable[[], Any], rep: int = 20) -> float:
    """GPU time alone: the call captured in a CUDA graph and replayed (no host overhead, and
    no L2 flush: inputs of these sizes stay in the 60 MB L2, for every method alike)."""
    from triton.testing import do_bench_cudagraph

    return float(do_bench_cudagraph(fn, rep=rep, return_mode="median"))


# --------------------------------------------------------------------------------------------
# Parallel precompile: fills Triton's on-disk cache so the sweep itself only times kernels.
# --------------------------------------------------------------------------------------------


def _compile_job(jobs: list[tuple[str, int, int, dict[str, int]]]) -> tuple[int, float]:
    tri = load_template("dilated_conv_triton")
    t0 = time.time()
    n = 0
    with torch.no_grad():
        for mode, c, k, cfg in jobs:
            dtype = set_mode(mode)
            x = torch.randn(1, c, 16, 12, device=DEVICE, dtype=dtype)
            w = torch.randn(c, c, k, k, device=DEVICE, dtype=dtype)
            try:
                tri.dilated_conv2d(x, w, 2, 2 * (k // 2), config=cfg)
                n += 1
            except Exception as exc:  # noqa: BLE001  # reported again and skipped by the sweep
                print(f"compile failed {mode} c{c} k{k} {cfg}: {exc}", file=sys.stderr)
    torch.cuda.synchronize()
    return n, time.time() - t0


def precompile(workers: int) -> None:
    jobs = [
        (mode, c, k, cfg)
        for mode, cands in CANDIDATES.items()
        for cfg in cands
        for _, c, k, _, _, _ in SHAPES
    ]
    chunks = [jobs[i::workers] for i in range(workers)]
    t0 = time.time()
    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
        done = sum(n for n, _ in ex.map(_compile_job, chunks))
    print(f"precompiled {done}/{len(jobs)} kernels in {time.time() - t0:.1f}s", flush=True)


# --------------------------------------------------------------------------------------------


def sweep(tri: ModuleType, out_dir: Path) -> dict[str, dict[str, Any]]:
    """Best config per '<shape class>_<precision class>' key, plus the full timing log."""
    best: dict[str, dict[str, Any]] = {}
    log = []
    for mode, cands in CANDIDATES.items():
        dtype = set_mode(mode)
        for name, c, k, h, w, dils in SHAPES:
            d = max(dils)
            ws = torch.randn(c, c, k, k, device=DEVICE, dtype=dtype)
            xs = {n: torch.randn(n, c, h, w, device=DEVICE, dtype=dtype) for n in BATCHES}
            ref = F.conv2d(xs[1].double(), ws.double(), None, 1, d * (k // 2), d)
            results = []
            for cfg in cands:
                try:
                    with torch.no_grad():
                        err = rel_err(
                            tri.dilated_conv2d(xs[1], ws, d, d * (k // 2), config=cfg), ref
                        )
                    if not err < SWEEP_TOL[mode]:  # NaN fails too
                        print(f"  WRONG {cfg}: rel err {err:.2e}", flush=True)
                        continue
                    # Graph replay: the explicit-config path does all its host work per call,
                    # which would otherwise swamp the fast kernels.
                    ms = [
                        graph_ms(
                            partial(tri.dilated_conv2d, xs[n], ws, d, d * (k // 2), config=cfg),
                            rep=15,
                        )
                        for n in BATCHES
                    ]
                except Exception as exc:  # noqa: BLE001  # a config that fails to compile
                    print(f"  skip {cfg}: {exc}", flush=True)
                    continue
                results.append((sum(ms), ms, cfg))
                log.append({"mode": mode, "shape": name, "d": d, "cfg": cfg, "ms": ms, "err": err})
            del ref
            results.sort(key=lambda r: r[0])
            top = results[0]
            key = f"{tri.shape_class(c, c, k)}_{PREC_CLASS[mode]}"
            best[key] = top[2]
            print(
                f"sweep {mode:5s} {name}: best {top[2]} b1 {top[1][0] * 1e3:.1f} us, "
                f"b4 {top[1][1] * 1e3:.1f} us; worst {results[-1][1][0] * 1e3:.1f} us",
                flush=True,
            )
    (out_dir / "sweep.json").write_text(json.dumps(log, indent=1))
    return best


def correctness(tri: ModuleType, phase: ModuleType) -> list[str]:
    """Odd shapes, non-contiguous inputs and poisoned outputs on the GPU."""
    lines = []
    cases = [
        ("odd 157x113 c20 k5 d3", (2, 20, 157, 113), 20, 5, 3, None),
        ("c8 k3 d5 33x7", (3, 8, 33, 7), 8, 3, 5, None),
        ("channel slice of 192", (1, 192, 40, 29), 96, 5, 2, "slice"),
        ("channels_last", (2, 96, 40, 29), 96, 5, 2, "cl"),
        ("page 1280x1280 P3", (1, 96, 160, 160), 96, 5, 3, None),
    ]
    for mode in MODES:
        dtype = set_mode(mode)
        for label, shape, c, k, d, layout in cases:
            x = torch.randn(*shape, device=DEVICE, dtype=dtype)
            if layout == "slice":
                x = x[:, 48 : 48 + c]
            elif layout == "cl":
                x = x.to(memory_format=torch.channels_last)
            w = torch.randn(c, c, k, k, device=DEVICE, dtype=dtype)
            ref = F.conv2d(x.double(), w.double(), None, 1, d * (k // 2), d)
            full = tri.resolve_config(DEVICE, c, c, k, dtype)
            kh = w.shape[-1]
            out = torch.full(
                (
                    x.shape[0],
                    c,
                    x.shape[2] + 2 * d * (k // 2) - d * (kh - 1),
                    x.shape[3] + 2 * d * (k // 2) - d * (kh - 1),
                ),
                float("nan"),
                device=DEVICE,
                dtype=dtype,
            )
            kern, grid, args, kwargs, out = tri.dk.prepare_launch(x, w, d, d * (k // 2), full, out)
            with torch.no_grad():
                kern[grid](*args, **kwargs)
                e_tri = rel_err(out, ref)
                e_ph = rel_err(phase.dilated_conv2d(x, w, d, d * (k // 2)), ref)
                e_cu = rel_err(F.conv2d(x, w, None, 1, d * (k // 2), d), ref)
            lines.append(f"| {mode} | {label} | {e_tri:.2e} | {e_ph:.2e} | {e_cu:.2e} |")
    return lines


def main_table(tri: ModuleType, phase: ModuleType) -> tuple[list[str], list[dict[str, Any]]]:
    rows, data = [], []
    for mode in MODES:
        dtype = set_mode(mode)
        for name, c, k, h, w, dils in SHAPES:
            wt = torch.randn(c, c, k, k, device=DEVICE, dtype=dtype)
            cfg = tri.resolve_config(DEVICE, c, c, k, dtype)
            for n in BATCHES:
                x = torch.randn(n, c, h, w, device=DEVICE, dtype=dtype)
                for d in dils:
                    p = d * (k // 2)
                    fns = (
                        partial(F.conv2d, x, wt, None, 1, p, d),
                        partial(phase.dilated_conv2d, x, wt, d, p),
                        partial(tri.dilated_conv2d, x, wt, d, p),
                    )
                    with torch.no_grad():
                        ref = F.conv2d(x.double(), wt.double(), None, 1, p, d)
                        errs = [rel_err(f(), ref) for f in fns]
                        del ref
                        t_cu, t_ph, t_tr = (bench_ms(f, rep=50) for f in fns)
                        g_cu, g_ph, g_tr = (graph_ms(f) for f in fns)
                    flop = 2 * n * c * c * k * k * h * w
                    rows.append(
                        f"| {mode} | {name} | {n} | {d} | {g_cu * 1e3:.1f} | {g_ph * 1e3:.1f} | "
                        f"{g_tr * 1e3:.1f} | **{g_cu / g_tr:.2f}** | {flop / g_tr / 1e9:.0f} | "
                        f"{t_cu * 1e3:.1f} | {t_ph * 1e3:.1f} | {t_tr * 1e3:.1f} | "
                        f"{t_cu / t_tr:.2f} | "
                        f"{errs[0]:.1e} | {errs[1]:.1e} | {errs[2]:.1e} |"
                    )
                    data.append(
                        {
                            "mode": mode,
                            "shape": name,
                            "batch": n,
                            "dilation": d,
                            "cudnn_ms": t_cu,
                            "phase_ms": t_ph,
                            "triton_ms": t_tr,
                            "graph_cudnn_ms": g_cu,
                            "graph_phase_ms": g_ph,
                            "graph_triton_ms": g_tr,
                            "err_cudnn": errs[0],
                            "err_phase": errs[1],
                            "err_triton": errs[2],
                            "config": cfg,
                        }
                    )
                    print(rows[-1], flush=True)
    return rows, data


def host_overhead(tri: ModuleType, phase: ModuleType) -> str:
    """Host (CPU) time per call on a tiny input, where launching, not the GPU, is the cost."""
    set_mode("tf32")
    x = torch.randn(1, 96, 8, 8, device=DEVICE)
    w = torch.randn(96, 96, 5, 5, device=DEVICE)
    fns = {
        "cuDNN": partial(F.conv2d, x, w, None, 1, 4, 2),
        "phase": partial(phase.dilated_conv2d, x, w, 2, 4),
        "Triton": partial(tri.dilated_conv2d, x, w, 2, 4),
    }
    out = []
    with torch.no_grad():
        for name, fn in fns.items():
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(200):
                fn()
            host = (time.perf_counter() - t0) / 200 * 1e6
            torch.cuda.synchronize()
            out.append(f"{name} {host:.1f} us")
    return "host time per call (1x96x8x8, no sync): " + ", ".join(out)


def no_recompile_check(tri: ModuleType) -> str:
    set_mode("tf32")
    dev = torch.cuda.current_device()
    w = torch.randn(96, 96, 5, 5, device=DEVICE)
    kernel = tri.dk.KERNEL
    with torch.no_grad():
        tri.dilated_conv2d(torch.randn(1, 96, 160, 116, device=DEVICE), w, 1, 2)
        before = len(kernel.device_caches[dev][0])
        sizes = [(1, 160, 116), (4, 160, 116), (1, 160, 160), (2, 128, 96), (1, 97, 61), (3, 8, 8)]
        for n, h, wd in sizes:
            for d in (1, 2, 3):
                x = torch.randn(n, 96, h, wd, device=DEVICE)
                y = tri.dilated_conv2d(x, w, d, 2 * d)
                assert rel_err(y, F.conv2d(x.double(), w.double(), None, 1, 2 * d, d)) < 1e-2
        after = len(kernel.device_caches[dev][0])
    return (
        f"compiled variants of {kernel.fn.__name__}: {before} after the first call, {after} "
        f"after {len(sizes) * 3} calls over {len(sizes)} page sizes x 3 dilations"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench-out")))
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--workers", type=int, default=12)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import triton

    t_start = time.time()
    props = torch.cuda.get_device_properties(0)
    env = (
        f"{props.name}, torch {torch.__version__}, triton {triton.__version__}, "
        f"cuDNN {torch.backends.cudnn.version()}, CUDA {torch.version.cuda}"
    )
    print(env, flush=True)
    torch.backends.cudnn.benchmark = False  # MinerU's setting; cuDNN heuristics pick the kernel
    if args.sweep:
        precompile(args.workers)
    tri = load_template("dilated_conv_triton")
    phase = load_template("dilated_conv_phase")
    arch = tri.device_arch(DEVICE)
    if args.sweep:
        best = sweep(tri, args.out)
        tuned = {"schema": 1, "kernels": {"dilated_conv": {arch: best}}}
        (args.out / "tuned.json").write_text(json.dumps(tuned, indent=1))
        os.environ["ROCMFIX_TUNED_FILE"] = str(args.out / "tuned.json")
        tri.clear_config_cache()
        print("best:", json.dumps(best), flush=True)
    torch.manual_seed(0)
    corr = correctness(tri, phase)
    rows, data = main_table(tri, phase)
    recompile = no_recompile_check(tri)
    overhead = host_overhead(tri, phase)
    md = [
        f"# Dilated conv benchmark ({time.strftime('%Y-%m-%d')})",
        "",
        env,
        "",
        "Times in microseconds.  graph: median of CUDA-graph replays (GPU time only); "
        "do_bench: median with events around each call and L2 flushed between calls (host "
        "overhead shows where it exceeds the queued GPU work).  cuDNN/Triton >= 1: Triton "
        "faster.  Errors: ||y - ref|| / ||ref|| against fp64 on the GPU.",
        "",
        "| mode | shape | batch | d | graph: cuDNN us | phase us | Triton us | cuDNN/Triton | "
        "Triton TFLOP/s | do_bench: cuDNN us | phase us | Triton us | cuDNN/Triton | "
        "err cuDNN | err phase | err Triton |",
        "|---" * 16 + "|",
        *rows,
        "",
        "## Odd shapes / layouts (Triton output NaN-poisoned before launch)",
        "",
        "| mode | case | err Triton | err phase | err cuDNN |",
        "|---|---|---|---|---|",
        *corr,
        "",
        "## Recompiles",
        "",
        recompile,
        "",
        "## Host overhead",
        "",
        overhead,
        "",
        f"Configs used: {json.dumps({d['mode'] + ' ' + d['shape']: d['config'] for d in data})}",
        "",
        f"wall time {time.time() - t_start:.0f}s",
    ]
    (args.out / "dilated_conv.md").write_text("\n".join(md) + "\n")
    (args.out / "dilated_conv.json").write_text(json.dumps({"env": env, "rows": data}, indent=1))
    print("\n".join(md[6:8] + rows), flush=True)
    print(recompile, flush=True)
    print(overhead, flush=True)


if __name__ == "__main__":
    main()
