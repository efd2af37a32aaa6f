"""Depthwise convs and the kernel == stride transposed conv at MinerU's shapes, side by side
with the vendor library, on one NVIDIA GPU (where cuDNN is fast: this bounds what rocmfix's
kernels cost).

For every depthwise shape of the depthwise-conv op (rocmfix/ops/depthwise_conv.py): the
relative error (||out - ref|| / ||ref||) of each implementation against cuDNN in fp64, on fresh
random inputs; then, per call, the kernel time (median of CUDA-graph replays of 10 calls) and
the eager wall time (median of bursts of 100 Python calls) of

- ``cudnn``: the layer as the model runs it, ``act(bn(conv(x)))``, and ``conv``: F.conv2d alone;
- ``triton``: templates/depthwise_conv_triton.py's entry point (BatchNorm and activation in
  the store), and ``kernel``: its launch alone at each tile of a small sweep (the best is kept);
- ``channels-last``: templates/depthwise_conv_vendor.py.

Bandwidth: (input + output bytes) / kernel time, against a measured device-to-device copy.
Then the DB head's transposed convs against ``nn.ConvTranspose2d``. Results: stdout (a
markdown table) and ``--json PATH``.

    python bench/depthwise_conv.py --json out.json --budget-s 240   # sweep, then shipped
    python bench/depthwise_conv.py --shipped --json out.json        # the shipped tiles only
    python bench/depthwise_conv.py --ptx     # sm_90 PTX/SASS instructions a tap, no GPU
    TRITON_INTERPRET=1 python bench/depthwise_conv.py --dry --limit 2   # the script on a CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import _load  # bench/_load.py: the templates as the targets import them
import torch

from rocmfix.ops import op

ACTS = {"none": None, "relu": torch.nn.ReLU, "silu": torch.nn.SiLU, "gelu": torch.nn.GELU,
        "hardswish": torch.nn.Hardswish}  # fmt: skip
CODES = {"none": 0, "relu": 1, "silu": 2, "gelu": 3, "hardswish": 4}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# (BLOCK_P, BLOCK_C, warps, VEC): VEC 2 reads rows as aligned pairs where the shape allows
# (stride 1 along rows, even widths), 1 one element per tap and output.
# ROWS 2: two output rows a position (BLOCK_P positions, 2 * BLOCK_P outputs a program). A
# pair tile is raised to 64 positions a warp (templates/depthwise_conv_kernels.py).
SWEEP = [
    {"BLOCK_P": p, "BLOCK_C": c, "num_warps": w, "num_stages": 1, "VEC": v, "ROWS": r}
    for p, c, w, v, r in (
        (256, 1, 4, 2, 1), (512, 1, 4, 2, 1), (1024, 1, 8, 2, 1), (128, 2, 2, 2, 1),
        (256, 1, 2, 2, 1), (128, 1, 4, 2, 2), (256, 1, 4, 2, 2), (512, 1, 4, 2, 2),
        (512, 1, 8, 2, 2), (64, 1, 2, 2, 2), (128, 1, 2, 2, 2), (256, 1, 2, 2, 2),
        (128, 2, 2, 2, 2), (64, 4, 2, 2, 2), (256, 2, 4, 2, 2), (256, 1, 4, 1, 1),
        (128, 1, 4, 1, 2),
    )
]  # fmt: skip
# --dry: the whole script on the CPU through Triton's interpreter at the op's CPU shapes, each
# timer one call (checks the script, not the speed, before a GPU run).
DEV = "cuda"
DRY = False
# --budget-s: past this many seconds of depthwise shapes, time the shipped tiles only.
BUDGET_S = 0.0
KEYS = ("BLOCK_P", "BLOCK_C", "num_warps", "num_stages", "VEC", "ROWS")


def graph_ms(fn: Callable[[], Any], calls: int = 10, reps: int = 30) -> float:
    if DRY:
        fn()
        return 1e-3
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]  # fmt: skip
    for begin, end in events:
        begin.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(b.elapsed_time(e) / calls for b, e in events)


def eager_ms(fn: Callable[[], Any], calls: int = 100, bursts: int = 7) -> float:
    if DRY:
        fn()
        return 1e-3
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(bursts):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e3 / calls)
    return statistics.median(samples)


def copy_gbps() -> float:
    a = torch.empty(256 * 2**20 // 4, device=DEV)
    b = torch.empty_like(a)
    ms = graph_ms(lambda: b.copy_(a), calls=5, reps=20)
    return 2 * a.numel() * 4 / ms / 1e6


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))


def layer(s: dict[str, Any], gen: torch.Generator) -> tuple[Any, ...]:
    c, kh, kw, kind = s["c"], s["kh"], s["kw"], DTYPES[s["dtype"]]
    conv = torch.nn.Conv2d(c, c, (kh, kw), s["s"], ((kh - 1) // 2, (kw - 1) // 2), groups=c,
                           bias=False).to(DEV)  # fmt: skip
    bn = torch.nn.BatchNorm2d(c).to(DEV)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen, device=DEV) / kh / kw)
        for t, lo, hi in ((bn.running_mean, -0.5, 0.5), (bn.running_var, 0.5, 1.5),
                          (bn.weight, 0.5, 1.5), (bn.bias, -0.5, 0.5)):  # fmt: skip
            t.copy_(torch.rand(c, generator=gen, device=DEV) * (hi - lo) + lo)
    make = ACTS[s["act"]]
    act = make() if make is not None else None
    x = torch.randn(s["n"], c, s["h"], s["w"], generator=gen, device=DEV)
    return x.to(kind), conv.to(kind).eval(), bn.to(kind).eval(), act


def fp64_ref(x: torch.Tensor, conv: Any, bn: Any, act: Any) -> torch.Tensor:
    c64 = torch.nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                          conv.padding, groups=conv.groups, bias=False)  # fmt: skip
    c64 = c64.to(DEV).double()
    bn64 = torch.nn.BatchNorm2d(bn.num_features).to(DEV).double().eval()
    with torch.no_grad():
        c64.weight.copy_(conv.weight.double())
        bn64.load_state_dict({k: v.double() if v.is_floating_point() else v
                              for k, v in bn.state_dict().items()})  # fmt: skip
        y = bn64(c64(x.double()))
        return act(y) if act is not None else y


# Timed first, so that a run cut short still has them: the two shapes below a target.
FIRST = ("depthwise-conv-c64-k5-240x168-fp32", "depthwise-conv-c512-k3-s2-48x48-b8-fp16")


def depthwise(
    results: dict[str, Any], copy: float, save: Callable[[], None], limit: int | None = None
) -> None:
    tri = _load.template("depthwise_conv_triton")
    ven = _load.template("depthwise_conv_vendor")
    gen = torch.Generator(device=DEV)
    gen.manual_seed(int(time.time() * 1e6) % 2**31)
    rows = results["depthwise"] = []
    cases = sorted(op("depthwise-conv").cases, key=lambda c: c.id not in FIRST)
    start = time.monotonic()
    for case in cases[:limit]:
        if BUDGET_S and time.monotonic() - start > BUDGET_S and SWEEP:
            print("sweep budget spent: the shipped tiles only from here", flush=True)
            SWEEP.clear()
        row = one_depthwise(case.id, dict(case.cpu if DRY else case.gpu), tri, ven, gen)
        row["copy_gbps"] = copy
        rows.append(row)
        save()
        best = row["best"]
        print(
            f"{case.id}: cudnn {row['cudnn_graph_us']:.1f} us, triton {row['triton_graph_us']:.1f}"
            f" us (best tile {best['us']:.1f} {best['config']}), eager {row['triton_eager_us']:.1f}"
            f" vs conv {row['conv_eager_us']:.1f}; err {row['triton_err']:.1e}",
            flush=True,
        )


@torch.no_grad()
def one_depthwise(
    case_id: str, s: dict[str, Any], tri: Any, ven: Any, gen: torch.Generator
) -> dict[str, Any]:
    x, conv, bn, act = layer(s, gen)
    row: dict[str, Any] = {"id": case_id, "shape": s}
    ref = fp64_ref(x, conv, bn, act)

    def stock() -> Any:
        y = bn(conv(x))
        return act(y) if act is not None else y

    def plain() -> Any:
        return torch.nn.functional.conv2d(
            x, conv.weight, None, conv.stride, conv.padding, 1, conv.groups
        )

    def entry() -> Any:
        return tri.depthwise_conv2d(x, conv, bn, act)

    def vendor() -> Any:
        return ven.depthwise_conv2d(x, conv, bn, act)

    for name, fn in (("cudnn", stock), ("triton", entry), ("channels-last", vendor)):
        row[f"{name}_err"] = rel(fn(), ref)
    row["triton_err_vs_cudnn"] = rel(entry(), stock().double())
    for name, fn in (("cudnn", stock), ("conv", plain), ("triton", entry),
                     ("channels-last", vendor)):  # fmt: skip
        row[f"{name}_graph_us"] = graph_ms(fn) * 1e3
        row[f"{name}_eager_us"] = eager_ms(fn) * 1e3
    scale = torch.rsqrt(bn.running_var.float() + bn.eps) * bn.weight.float()
    shift = bn.bias.float() - bn.running_mean.float() * scale
    shipped = tri.resolve_config(x.device, s["kh"], s["kw"], s["s"], x.dtype)
    sweep = []
    for tile in [shipped, *SWEEP]:
        cfg = {k: tile[k] for k in KEYS if k in tile}

        def kernel(cfg: dict[str, Any] = cfg) -> Any:
            return tri.conv(x, conv.weight, conv.stride, conv.padding, scale=scale,
                            shift=shift, act=CODES[s["act"]], config=cfg)  # fmt: skip

        try:
            err = rel(kernel(), ref)
            sweep.append({"config": cfg, "us": graph_ms(kernel) * 1e3, "err": err})
        except Exception as exc:  # noqa: BLE001
            sweep.append({"config": cfg, "error": f"{type(exc).__name__}: {exc}"[:200]})
    row["shipped"] = shipped
    row["sweep"] = sweep
    best = min((t for t in sweep if "us" in t), key=lambda t: float(t["us"]))
    row["best"] = best
    moved = (x.numel() + ref.numel()) * x.element_size()
    row["bytes"] = moved
    row["triton_gbps"] = moved / row["triton_graph_us"] / 1e3
    row["cudnn_gbps"] = moved / row["cudnn_graph_us"] / 1e3
    row["best_gbps"] = moved / best["us"] / 1e3
    return row


def transposed(results: dict[str, Any]) -> None:
    ct = _load.template("conv_transpose_linear")
    gen = torch.Generator(device=DEV)
    gen.manual_seed(int(time.time() * 1e6) % 2**31)
    rows = results["conv_transpose"] = []
    for case in op("conv-transpose").cases:
        row = one_transposed(case.id, dict(case.gpu), ct, gen)
        rows.append(row)
        print(f"{case.id}: {json.dumps(row)}", flush=True)


@torch.no_grad()
def one_transposed(
    case_id: str, s: dict[str, Any], ct: Any, gen: torch.Generator
) -> dict[str, Any]:
    d = torch.nn.ConvTranspose2d(s["cin"], s["cout"], s["k"], s["k"]).to(DEV).eval()
    x = torch.randn(s["n"], s["cin"], s["h"], s["w"], generator=gen, device=DEV)
    d64 = torch.nn.ConvTranspose2d(s["cin"], s["cout"], s["k"], s["k"]).to(DEV).double()
    d64.load_state_dict({k: v.double() for k, v in d.state_dict().items()})
    ref = d64(x.double())
    row: dict[str, Any] = {"id": case_id, "shape": s}

    def stock() -> Any:
        return d(x)

    def gemm() -> Any:
        return ct.conv_transpose2d(x, d)

    for name, fn in (("cudnn", stock), ("linear", gemm)):
        row[f"{name}_err"] = rel(fn(), ref)
        row[f"{name}_graph_us"] = graph_ms(fn) * 1e3
        row[f"{name}_eager_us"] = eager_ms(fn) * 1e3
    return row


@torch.no_grad()
def compiled(results: dict[str, Any]) -> None:
    """torch.compile(fullgraph=True) of a patched layer: one rocmfix::depthwise_conv2d node,
    the same output as eager."""
    tri = _load.template("depthwise_conv_triton")
    gen = torch.Generator(device=DEV)
    gen.manual_seed(int(time.time() * 1e6) % 2**31)
    x, conv, bn, act = layer(dict(op("depthwise-conv").cases[0].gpu), gen)

    def forward(t: torch.Tensor) -> torch.Tensor:
        return tri.depthwise_conv2d(t, conv, bn, act)  # type: ignore[no-any-return]

    torch._dynamo.reset()
    fn = torch.compile(forward, fullgraph=True)
    ref = fp64_ref(x, conv, bn, act)
    results["compile"] = {"err": rel(fn(x), ref), "graph_us": graph_ms(lambda: fn(x)) * 1e3}
    print(f"torch.compile(fullgraph=True): {results['compile']}", flush=True)


def _tile(cfg: dict[str, Any]) -> str:
    return (f"{cfg['BLOCK_P']}x{cfg['BLOCK_C']} w{cfg['num_warps']} v{cfg.get('VEC', 2)}"
            f" r{cfg.get('ROWS', 1)}")  # fmt: skip


def table(results: dict[str, Any]) -> str:
    """Kernel time against F.conv2d and the cuDNN layer, eager per call, bandwidth; then
    every swept tile's time per shape (to choose the shipped ones)."""
    lines = [
        "| shape | cuDNN layer | F.conv2d | Triton | vs F.conv2d | vs layer | best tile "
        "| best vs F.conv2d | eager F.conv2d / Triton | Triton GB/s (copy %) | rel err |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in results["depthwise"]:
        best, conv, layer_us, tri = (
            r["best"],
            r["conv_graph_us"],
            r["cudnn_graph_us"],
            r["triton_graph_us"],
        )
        lines.append(
            f"| {r['id']} | {layer_us:.1f} | {conv:.1f} | {tri:.1f} "
            f"| {conv / tri:.2f}x | {layer_us / tri:.2f}x "
            f"| {best['us']:.1f} ({_tile(best['config'])}) | {conv / best['us']:.2f}x "
            f"| {r['conv_eager_us']:.1f} / {r['triton_eager_us']:.1f} "
            f"({r['triton_eager_us'] / r['conv_eager_us']:.2f}x) "
            f"| {r['triton_gbps']:.0f} ({100 * r['triton_gbps'] / r['copy_gbps']:.0f}%) "
            f"| {r['triton_err']:.1e} |"
        )
    for r in results.get("conv_transpose", []):
        lines.append(
            f"| {r['id']} | {r['cudnn_graph_us']:.1f} | | GEMM {r['linear_graph_us']:.1f} | "
            f"| {r['cudnn_graph_us'] / r['linear_graph_us']:.2f}x | | "
            f"| {r['cudnn_eager_us']:.1f} / "
            f"{r['linear_eager_us']:.1f} | | {r['linear_err']:.1e} |"
        )
    lines.append("")
    lines.append("sweep (us per tile; first: shipped):")
    for r in results["depthwise"]:
        cells = [f"{_tile(t['config'])}={t['us']:.1f}" if "us" in t else f"{_tile(t['config'])}=ERR"
                 for t in r["sweep"]]  # fmt: skip
        lines.append(f"{r['id']}: " + " ".join(cells))
    return "\n".join(lines)


def ptx_counts(arch: str = "sm_90") -> list[dict[str, Any]]:
    """PTX instructions per lane, per tap and output, of the kernel at a few MinerU shapes and
    tiles, compiled for ``arch`` as ``rocmfix kernels`` compiles (no GPU needed): what a tile
    costs in issue where it is bound by instructions rather than bytes."""
    import re

    from rocmfix.guest import aot

    tri = _load.template("depthwise_conv_triton")
    rows = []
    shapes = {c.id: dict(c.gpu) for c in op("depthwise-conv").cases}
    for case_id in PTX_SHAPES:
        s = shapes[case_id]
        x = torch.zeros(s["n"], s["c"], s["h"], s["w"], dtype=DTYPES[s["dtype"]])
        w = torch.zeros(s["c"], 1, s["kh"], s["kw"], dtype=x.dtype)
        for tile in PTX_TILES:
            kernel, _, args, kwargs = tri.prepare(x, w, s["s"], dict(tile), act=CODES[s["act"]])
            compiled = aot._compile(kernel, args, kwargs, arch)
            ptx = compiled.asm["ptx"]
            body = ptx[ptx.index("{", ptx.index(".entry")) :]
            lines = [ln.strip() for ln in body.splitlines()]
            insts = [re.sub(r"^@!?%p\d+\s+", "", ln) for ln in lines
                     if ln and not ln.startswith(("//", ".", "{", "}", "$"))]  # fmt: skip
            lanes = 32 * kwargs["num_warps"]
            outs = kwargs["BLOCK_P"] * kwargs["BLOCK_C"] * kwargs["ROWS"] / lanes
            taps = outs * s["kh"] * s["kw"]
            fma = sum(1 for ln in insts if re.match(r"(fma|mad)\.", ln))
            loads = sum(1 for ln in insts if ln.startswith("ld.global"))
            row = {"id": case_id, "config": {k: kwargs[k] for k in (*KEYS[:3], "VEC", "ROWS")},
                   "instructions": len(insts), "fma": fma, "loads": loads,
                   "per_tap": len(insts) / taps}  # fmt: skip
            row["sass"] = _sass_count(compiled.asm.get("cubin"))
            row["sass_per_tap"] = row["sass"] / taps if row["sass"] else None
            rows.append(row)
            print(f"{case_id} {_tile(row['config'])}: PTX {len(insts)} instructions, {fma} fma, "
                  f"{loads} ld.global, {row['per_tap']:.2f} a tap; SASS {row['sass']}, "
                  f"{row['sass_per_tap'] or 0:.2f} a tap", flush=True)  # fmt: skip
    return rows


def _sass_count(cubin: bytes | None) -> int | None:
    """SASS instructions in a cubin, by the nvdisasm Triton's wheel ships (None without)."""
    import os
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    if cubin is None or not os.path.exists(tool):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as handle:
            handle.write(cubin)
        text = subprocess.run([tool, "-c", path], capture_output=True, text=True).stdout
    # One instruction a line, each behind its /*offset*/; NOPs pad the end.
    return sum(1 for ln in text.splitlines() if "/*" in ln and "NOP" not in ln and ";" in ln)


PTX_SHAPES = (
    "depthwise-conv-c64-k5-240x168-fp32",
    "depthwise-conv-c32-k3-240x168-fp32",
    "depthwise-conv-c384-k5-24x24-b8-fp16",
    "depthwise-conv-c512-k3-s2-48x48-b8-fp16",
)
PTX_TILES = [
    {"BLOCK_P": p, "BLOCK_C": 1, "num_warps": 4, "num_stages": 1, "VEC": v, "ROWS": r}
    for p, v, r in ((512, 2, 1), (1024, 2, 1), (256, 2, 2), (512, 2, 2), (256, 1, 1),
                    (512, 1, 1), (256, 1, 2))
]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--shipped", action="store_true", help="time the shipped tiles only")
    parser.add_argument("--ptx", action="store_true",
                        help="count sm_90 PTX instructions per tap (no GPU needed)")  # fmt: skip
    parser.add_argument("--dry", action="store_true",
                        help="run on the CPU through Triton's interpreter, untimed")  # fmt: skip
    parser.add_argument("--limit", type=int, help="the first N depthwise shapes only")
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="sweep this many seconds, then the shipped tiles only")  # fmt: skip
    args = parser.parse_args()
    global BUDGET_S
    BUDGET_S = args.budget_s
    if args.ptx:
        counted = ptx_counts()
        if args.json:
            with open(args.json, "w", encoding="utf-8") as handle:
                json.dump(counted, handle, indent=1)
        return 0
    if args.shipped:
        SWEEP.clear()
    if args.dry:
        global DEV, DRY
        DEV, DRY = "cpu", True
    elif not torch.cuda.is_available():
        print("no GPU", file=sys.stderr)
        return 1
    results: dict[str, Any] = {
        "device": "cpu (dry)" if DRY else torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "cudnn": torch.backends.cudnn.version(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    results["copy_gbps"] = 1.0 if DRY else copy_gbps()
    print(f"{results['device']}: copy {results['copy_gbps']:.0f} GB/s", flush=True)

    def save() -> None:
        if args.json:
            with open(args.json, "w", encoding="utf-8") as handle:
                json.dump(results, handle, indent=1)

    try:
        depthwise(results, results["copy_gbps"], save, args.limit)
    finally:
        try:
            transposed(results)
            if not DRY:
                compiled(results)
        finally:
            save()
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
