"""GPU benchmark and proofs for the patch-embed templates (templates/patch_embed_*.py).

Runs on one CUDA or ROCm GPU, bf16, K = 1176, N = 1280 (MinerU2.5 / Qwen2-VL):

* correctness of every scheme (bf16/fp16/fp32, with and without bias, odd M and odd K)
  against an fp64 reference, with the caching allocator poisoned with NaN first;
* optional ``--sweep`` over a bounded grid of gemm tile configs;
* timings (``triton.testing.do_bench`` medians, L2 flushed between calls) of every scheme
  against ``F.linear`` and ``nn.Conv3d`` in the same run, plus CUDA-graph replay timings;
* proofs: the profiler sees no convolution op or kernel on the patched path,
  ``torch.compile(fullgraph=True)`` traces through it, and CUDA-graph capture + replay gives
  correct results on fresh inputs.

Prints a short table last; with ``$OUT`` set (or ``--out``) writes ``patch_embed.md``,
``patch_embed.json`` and (with ``--sweep``) ``sweep.md`` there.

    python bench/patch_embed.py [--sweep] [--quick]
    python bench/patch_embed.py --sweep-only --sweep-config JSON [--sweep-config JSON ...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import _load  # bench/_load.py: the templates as the targets import them
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "templates"
SCHEMES = ("gemm", "linear")
C, T, P, N = 3, 2, 14, 1280
K = C * T * P * P
BENCH_M = (1024, 5476, 16384, 56700)
SWEEP_M = (5476, 16384, 56700)
PROVE_M = 5476
SWEEP_BUDGET_S = 200

# Bounded grid for --sweep. "tma" rows use the sm_90 descriptor kernel, the others the
# portable pointer kernel (peeled K tail, aligned row strides).
SWEEP_CONFIGS: list[dict[str, Any]] = [
    {
        "tma": True,
        "persistent": True,
        "flatten": True,
        "BLOCK_M": 128,
        "BLOCK_N": 256,
        "BLOCK_K": 64,
        "num_warps": 8,
        "num_stages": 3,
    },
    {
        "tma": True,
        "persistent": True,
        "flatten": False,
        "BLOCK_M": 128,
        "BLOCK_N": 256,
        "BLOCK_K": 64,
        "num_warps": 8,
        "num_stages": 3,
    },
    {
        "tma": True,
        "persistent": False,
        "flatten": False,
        "BLOCK_M": 128,
        "BLOCK_N": 256,
        "BLOCK_K": 64,
        "num_warps": 8,
        "num_stages": 3,
    },
    {
        "tma": True,
        "persistent": True,
        "flatten": True,
        "epilogue_subtile": True,
        "BLOCK_M": 128,
        "BLOCK_N": 256,
        "BLOCK_K": 64,
        "num_warps": 8,
        "num_stages": 4,
    },
    {
        "tma": True,
        "persistent": True,
        "flatten": True,
        "epilogue_subtile": True,
        "BLOCK_M": 128,
        "BLOCK_N": 256,
        "BLOCK_K": 128,
        "num_warps": 8,
        "num_stages": 2,
    },
    {
        "tma": True,
        "persistent": True,
        "flatten": True,
        "BLOCK_M": 128,
        "BLOCK_N": 256,
        "BLOCK_K": 64,
        "num_warps": 8,
        "num_stages": 3,
        "GROUP_M": 16,
    },
    {
        "tma": True,
        "persistent": True,
        "flatten": True,
        "BLOCK_M": 256,
        "BLOCK_N": 128,
        "BLOCK_K": 64,
        "num_warps": 8,
        "num_stages": 3,
    },
    {
        "tma": True,
        "persistent": False,
        "flatten": False,
        "BLOCK_M": 256,
        "BLOCK_N": 128,
        "BLOCK_K": 64,
        "num_warps": 8,
        "num_stages": 3,
    },
    # 114 KB of shared memory: two CTAs per SM. The L2-bandwidth model predicts ~0.6x (a
    # 128x128 tile needs 33% more L2 bytes per FLOP than 128x256).
    {
        "tma": True,
        "persistent": False,
        "epilogue_subtile": True,
        "BLOCK_M": 128,
        "BLOCK_N": 128,
        "BLOCK_K": 64,
        "num_warps": 8,
        "num_stages": 3,
    },
    {"tma": False, "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3},
    {"tma": False, "BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3},
    {"tma": False, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "num_warps": 8, "num_stages": 4},
]

CONV_MARKERS = ("conv", "cudnn", "miopen", "implicit_gemm", "fprop")


def load_template(scheme: str, alias: str | None = None) -> ModuleType:
    # Each call is a fresh module (``alias`` named one before the templates shared a package).
    return _load.template(f"patch_embed_{scheme}")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64 = out.double()
    if not torch.isfinite(out64).all():
        return float("nan")
    return float((out64 - ref).norm() / ref.norm().clamp_min(1e-30))


def poison_allocator(nbytes: int, device: torch.device) -> None:
    # The next same-sized allocation reuses this block: an output element the kernel never
    # writes then stays NaN and fails the check.
    buf = torch.empty(nbytes // 2 + 64, dtype=torch.float16, device=device)
    buf.fill_(float("nan"))
    del buf


def cfg_name(cfg: dict[str, Any]) -> str:
    kind = "tma" if cfg.get("tma") else "ptr"
    extra = []
    if cfg.get("persistent"):
        extra.append("pers")
        if cfg.get("occupancy", 1) != 1:
            extra.append(f"occ{cfg['occupancy']}")
        if cfg.get("flatten"):
            extra.append("flat")
    elif cfg.get("tma"):
        extra.append("grid")
    if cfg.get("tma") and cfg.get("epilogue_subtile"):
        extra.append("sub")
    if cfg.get("GROUP_M", 8) != 8:
        extra.append(f"g{cfg['GROUP_M']}")
    if not cfg.get("pack_weight", True):
        extra.append("unpacked")
    tile = f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']}x{cfg['BLOCK_K']}"
    return f"{kind} {tile} w{cfg['num_warps']} s{cfg['num_stages']} " + " ".join(extra)


def bench_ms(fn: Callable[[], Any], warmup: int = 25, rep: int = 100) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def tflops(m: int, ms: float) -> float:
    return 2.0 * m * N * K / (ms * 1e-3) / 1e12


# ------------------------------------------------------------------------------------------


def check_correctness(mods: dict[str, ModuleType], dev: torch.device, quick: bool) -> list[dict]:
    rows: list[dict] = []
    gemm = mods["gemm"]
    gemm_variants: list[tuple[str, dict[str, Any] | None]] = [("shipped", None)]
    gemm_variants.append(
        (
            "ptr 128x256x64",
            {
                "tma": False,
                "BLOCK_M": 128,
                "BLOCK_N": 256,
                "BLOCK_K": 64,
                "num_warps": 8,
                "num_stages": 3,
            },
        )
    )
    # (dtype, C, T, P, N, M values, bias values): the MinerU shape in full, odd K/N in part
    # (K=150 has 300-byte bf16 rows, so it also covers the pointer fallback of the TMA config).
    ms = (1, 7, 130, 5476) if not quick else (1, 130)
    plan = [
        (dt, 3, 2, 14, 1280, ms, (False, True))
        for dt in (torch.bfloat16, torch.float16, torch.float32)
    ]
    plan += [
        (dt, c, t, p, n, (7, 130), (True,))
        for dt in (torch.bfloat16, torch.float32)
        for (c, t, p, n) in ((3, 2, 5, 96), (3, 2, 4, 40))
    ]
    tol = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
    gen = torch.Generator(device=dev)
    gen.manual_seed(int(time.time()))
    for dtype, c, t, p, n, m_values, bias_values in plan:
        k = c * t * p * p
        for m in m_values:
            for with_bias in bias_values:
                x = torch.randn(m, k, device=dev, dtype=dtype, generator=gen)
                w = torch.randn(n, c, t, p, p, device=dev, dtype=dtype, generator=gen)
                w = w * (1.0 / math.sqrt(k))
                b = torch.randn(n, device=dev, dtype=dtype, generator=gen) if with_bias else None
                ref = x.double() @ w.reshape(n, k).double().T
                if b is not None:
                    ref = ref + b.double()
                x5 = x.view(m, c, t, p, p)
                cases: list[tuple[str, Callable[[], torch.Tensor]]] = []
                for label, cfg in gemm_variants:
                    if cfg is None:
                        fn = partial(gemm.triton_conv3d_patchify, x5, w, b)
                    else:
                        fn = partial(gemm.patchify_gemm, x, w.reshape(n, k), b, config=cfg)
                    cases.append((f"gemm {label}", fn))
                cases.append(("linear", partial(mods["linear"].triton_conv3d_patchify, x5, w, b)))
                for label, fn in cases:
                    poison_allocator(m * n * x.element_size(), dev)
                    try:
                        out = fn()
                        torch.cuda.synchronize()
                        err = rel_err(out, ref)
                        shape_ok = tuple(out.shape) == (m, n) and out.dtype == dtype
                        ok = shape_ok and err == err and err < tol[dtype]
                        msg = ""
                    except Exception as exc:  # noqa: BLE001
                        err, ok, msg = float("nan"), False, f"{type(exc).__name__}: {exc}"
                    rows.append(
                        {
                            "impl": label,
                            "dtype": str(dtype).split(".")[-1],
                            "M": m,
                            "K": k,
                            "N": n,
                            "bias": with_bias,
                            "rel_err": err,
                            "ok": ok,
                            "error": msg,
                        }
                    )
    return rows


def rotating_graph_ms(fn: Callable[[int], Any], sets: int, calls: int = 8) -> float:
    """Per-call time of a CUDA graph of ``calls`` calls cycling through ``sets`` input sets.

    No launch gaps or host overhead, and with several input sets larger than L2 between
    them, no all-hot-cache replay either.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(sets):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i % sets)
    ms = bench_ms(graph.replay, warmup=10, rep=60) / calls
    del graph
    return ms


def graph_ms(fn: Callable[[], Any], calls: int = 8) -> float:
    """Per-call kernel time of ``fn`` (one input set) under CUDA-graph replay."""
    return rotating_graph_ms(lambda _: fn(), sets=1, calls=calls)


def run_sweep(
    gemm: ModuleType,
    dev: torch.device,
    configs: list[dict[str, Any]] | None = None,
    budget_s: float = SWEEP_BUDGET_S,
) -> list[dict]:
    results: list[dict] = []
    data: dict[int, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}
    base: dict[str, float] = {}
    w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) / math.sqrt(K)
    for m in SWEEP_M:
        sets = 4 if m < 16384 else 2
        data[m] = []
        for _ in range(sets):
            x = torch.randn(m, K, device=dev, dtype=torch.bfloat16)
            data[m].append((x, F.linear(x, w), torch.empty(m, N, device=dev, dtype=torch.bfloat16)))
        x0 = data[m][0][0]
        base[f"ms_{m}"] = bench_ms(partial(F.linear, x0, w), warmup=10, rep=50)
        base[f"gms_{m}"] = rotating_graph_ms(
            lambda i, m=m: torch.mm(data[m][i][0], w.t(), out=data[m][i][2]), len(data[m])
        )
    print(
        "  F.linear baseline "
        + " ".join(
            f"M={m}: {base[f'ms_{m}'] * 1e3:.1f}/{base[f'gms_{m}'] * 1e3:.1f} us" for m in SWEEP_M
        )
    )
    t_start = time.time()
    for cfg in configs or SWEEP_CONFIGS:
        if time.time() - t_start > budget_s:
            print(f"  sweep budget of {budget_s:.0f}s spent: skipping {cfg_name(cfg)}")
            continue
        full = dict(gemm.PATCH_EMBED_CONFIGS["default"]["any"])
        full.update(cfg)
        row: dict[str, Any] = {"config": full, "name": cfg_name(full)}
        t0 = time.time()
        try:
            for m in SWEEP_M:
                x, ref, _ = data[m][0]
                out = gemm.patchify_gemm(x, w, None, config=full)
                torch.cuda.synchronize()
                err = rel_err(out, ref.double())
                row[f"err_{m}"] = err
                if not err < 1e-2:
                    raise RuntimeError(f"wrong result at M={m}: rel err {err}")
                ms = bench_ms(
                    partial(gemm.patchify_gemm, x, w, None, config=full), warmup=10, rep=50
                )
                gms = rotating_graph_ms(
                    lambda i, m=m, full=full: gemm.patchify_gemm(
                        data[m][i][0], w, None, config=full, out=data[m][i][2]
                    ),
                    len(data[m]),
                )
                row[f"ms_{m}"], row[f"gms_{m}"] = ms, gms
                row[f"ratio_{m}"] = base[f"ms_{m}"] / ms
                row[f"gratio_{m}"] = base[f"gms_{m}"] / gms
            for key in ("ratio", "gratio"):
                vals = [row[f"{key}_{m}"] for m in SWEEP_M]
                row[f"geo_{key}"] = math.exp(sum(math.log(r) for r in vals) / len(vals))
        except Exception as exc:  # noqa: BLE001
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            row["geo_ratio"] = row["geo_gratio"] = 0.0
        row["wall_s"] = time.time() - t0
        results.append(row)
        print(
            f"  sweep {row['name']:<40} do_bench "
            + " ".join(f"{row.get(f'ratio_{m}', 0):.3f}" for m in SWEEP_M)
            + "  graph "
            + " ".join(f"{row.get(f'gratio_{m}', 0):.3f}" for m in SWEEP_M)
            + (f" ERR {row['error']}" if "error" in row else ""),
            flush=True,
        )
    results.sort(key=lambda r: -r["geo_gratio"])
    for r in results:
        r["baseline"] = base
    return results


def host_overhead(mods: dict[str, ModuleType], dev: torch.device) -> dict[str, float]:
    """Wall µs per call over a burst of calls on a tiny problem (GPU time ~5 µs): where a
    call costs more than that, the excess is host-side (Python, dispatch, launch)."""
    gemm = mods["gemm"]
    m = 64
    a = torch.randn(m, K, device=dev, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
    out = torch.empty(m, N, device=dev, dtype=torch.bfloat16)
    cfg = gemm.resolve_config(dev)
    ptr_cfg = {**cfg, "tma": False}
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    half = bool(cfg.get("epilogue_subtile"))
    bn_out = bn // 2 if half else bn
    op = getattr(torch.ops.rocmfix, gemm.OP_NAME)
    cases: dict[str, Callable[[], Any]] = {
        "F.linear": partial(F.linear, a, w),
        "torch.empty": partial(torch.empty, (m, N), device=dev, dtype=torch.bfloat16),
        "resolve_config": partial(gemm.resolve_config, dev),
        "op rocmfix::patch_embed_gemm (shipped)": partial(op, a, w, None),
        "triton_conv3d_patchify (shipped)": partial(
            gemm.triton_conv3d_patchify, a.view(m, C, T, P, P), w.view(N, C, T, P, P)
        ),
        "patchify_gemm (shipped)": partial(gemm.patchify_gemm, a, w, None),
        "patchify_gemm (ptr kernel)": partial(gemm.patchify_gemm, a, w, None, ptr_cfg),
        "patchify_gemm (ptr kernel, out=)": partial(gemm.patchify_gemm, a, w, None, ptr_cfg, out),
    }
    if cfg.get("tma") and gemm._HAS_HOST_TMA:
        desc_cls = gemm.TensorDescriptor
        cases["3x TensorDescriptor.from_tensor"] = lambda: (
            desc_cls.from_tensor(a, [bm, bk]),
            desc_cls.from_tensor(w, [bn, bk]),
            desc_cls.from_tensor(out, [bm, bn_out]),
        )
        descs = (
            desc_cls.from_tensor(a, [bm, bk]),
            desc_cls.from_tensor(w, [bn, bk]),
            desc_cls.from_tensor(out, [bm, bn_out]),
        )
        tiles = triton_cdiv(m, bm) * triton_cdiv(N, bn)
        cases["raw TMA kernel launch"] = lambda: gemm._gemm_tma_kernel[(tiles,)](
            *descs,
            out,
            m,
            N,
            K,
            tiles,
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=bk,
            GROUP_M=cfg["GROUP_M"],
            HAS_BIAS=False,
            UPCAST=False,
            EPILOGUE_SUBTILE=half,
            FLATTEN=bool(cfg.get("flatten")),
            num_warps=cfg["num_warps"],
            num_stages=cfg["num_stages"],
        )
    res: dict[str, float] = {}
    for name, fn in cases.items():
        try:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            n = 300
            t = time.perf_counter()
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
            res[name] = (time.perf_counter() - t) / n * 1e6
        except Exception as exc:  # noqa: BLE001
            print(f"  overhead {name}: FAILED {type(exc).__name__}: {str(exc)[:200]}")
    return res


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def run_bench(
    mods: dict[str, ModuleType], dev: torch.device, extra_cfgs: list[tuple[str, dict]], quick: bool
) -> list[dict]:
    rows: list[dict] = []
    for m in BENCH_M if not quick else (5476,):
        rows += bench_one_m(mods, dev, extra_cfgs, m)
    return rows


def bench_one_m(
    mods: dict[str, ModuleType], dev: torch.device, extra_cfgs: list[tuple[str, dict]], m: int
) -> list[dict]:
    gemm = mods["gemm"]
    rows: list[dict] = []
    sets = 4 if m < 16384 else 2
    xs = [torch.randn(m, K, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
    conv = nn.Conv3d(C, N, (T, P, P), stride=(T, P, P), bias=False).to(dev, torch.bfloat16)
    with torch.no_grad():
        conv.weight.normal_(0, 1 / math.sqrt(K))
    w5 = conv.weight.detach()
    w2 = w5.reshape(N, K)
    ref = xs[0].double() @ w2.double().T

    def five(i: int) -> torch.Tensor:
        return xs[i].view(m, C, T, P, P)

    impls: list[tuple[str, Callable[[int], torch.Tensor]]] = [
        ("F.linear (cuBLAS/hipBLAS)", lambda i: F.linear(xs[i], w2)),
        ("nn.Conv3d (cuDNN/MIOpen)", lambda i: conv(five(i))),
        ("gemm (shipped config)", lambda i: gemm.triton_conv3d_patchify(five(i), w5)),
    ]
    for label, cfg in extra_cfgs:
        impls.append((f"gemm {label}", lambda i, cfg=cfg: gemm.patchify_gemm(xs[i], w2, None, cfg)))
    impls.append(("linear", lambda i: mods["linear"].triton_conv3d_patchify(five(i), w5)))
    lin_ms = lin_gms = None
    for label, fn in impls:
        try:
            with torch.no_grad():
                out = fn(0)
                torch.cuda.synchronize()
                err = rel_err(out.reshape(m, N), ref)
                slow = label.startswith("nn.Conv3d")
                ms = bench_ms(partial(fn, 0), warmup=25, rep=300 if slow else 100)
                gms = rotating_graph_ms(fn, 1 if slow else sets, calls=2 if slow else 8)
        except Exception as exc:  # noqa: BLE001
            print(f"  M={m:<6} {label:<34} FAILED {type(exc).__name__}: {str(exc)[:300]}")
            continue
        if lin_ms is None or lin_gms is None:
            lin_ms, lin_gms = ms, gms
        rows.append(
            {
                "M": m,
                "impl": label,
                "ms": ms,
                "graph_ms": gms,
                "tflops": tflops(m, ms),
                "vs_linear": lin_ms / ms,
                "graph_vs_linear": lin_gms / gms,
                "rel_err": err,
            }
        )
        print(
            f"  M={m:<6} {label:<34} {ms * 1e3:9.1f} us  graph {gms * 1e3:9.1f} us  "
            f"{tflops(m, ms):6.1f} TF  x{lin_ms / ms:.3f} (graph x{lin_gms / gms:.3f})  "
            f"err {err:.2e}",
            flush=True,
        )
    return rows


def prove(mods: dict[str, ModuleType], dev: torch.device) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    proofs: dict[str, Any] = {}
    gemm = mods["gemm"]
    m = PROVE_M
    x = torch.randn(m, K, device=dev, dtype=torch.bfloat16)
    conv = nn.Conv3d(C, N, (T, P, P), stride=(T, P, P), bias=True).to(dev, torch.bfloat16)
    conv.requires_grad_(False)
    w5, b = conv.weight, conv.bias
    ref = x.double() @ w5.reshape(N, K).double().T + b.double()

    def names_of(fn: Callable[[], Any]) -> list[str]:
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
        return sorted({evt.key for evt in prof.key_averages()})

    def conv_like(names: list[str]) -> list[str]:
        return [n for n in names if any(s in n.lower() for s in CONV_MARKERS)]

    # (a) profiler: the patched path launches no convolution; the detector does see nn.Conv3d.
    for scheme in SCHEMES:
        names = names_of(
            lambda s=scheme: mods[s].triton_conv3d_patchify(x.view(m, C, T, P, P), w5, b)
        )
        proofs[f"profiler_{scheme}_events"] = names
        proofs[f"profiler_{scheme}_conv_events"] = conv_like(names)
    conv_names = names_of(lambda: conv(x.view(m, C, T, P, P)))
    proofs["profiler_nn_conv3d_conv_events"] = conv_like(conv_names)

    # (b) torch.compile(fullgraph=True) on a vllm-shaped module whose forward is patched.
    class PatchEmbed(nn.Module):
        def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
            super().__init__()
            self.fn = fn
            self.proj = conv

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            L, _ = x.shape
            x = x.view(L, -1, T, P, P)
            return self.fn(x, self.proj.weight, self.proj.bias)

    for scheme in ("gemm",):
        try:
            torch._dynamo.reset()
            module = PatchEmbed(mods[scheme].triton_conv3d_patchify)
            compiled = torch.compile(module, fullgraph=True)
            with torch.no_grad():
                out = compiled(x)
                torch.cuda.synchronize()
                names = names_of(lambda compiled=compiled: compiled(x))
            proofs[f"compile_{scheme}_rel_err"] = rel_err(out, ref)
            proofs[f"compile_{scheme}_conv_events"] = conv_like(names)
            proofs[f"compile_{scheme}_ok"] = proofs[f"compile_{scheme}_rel_err"] < 1e-2
        except Exception:  # noqa: BLE001
            proofs[f"compile_{scheme}_ok"] = False
            proofs[f"compile_{scheme}_error"] = traceback.format_exc()[-2000:]

    # (c) CUDA graph capture + replay on fresh inputs copied into the static buffer.
    gemm_ptr = {
        "tma": False,
        "BLOCK_M": 128,
        "BLOCK_N": 256,
        "BLOCK_K": 64,
        "num_warps": 8,
        "num_stages": 3,
    }
    graph_cases: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "gemm": lambda xs: gemm.triton_conv3d_patchify(xs.view(-1, C, T, P, P), w5, b),
        "gemm_ptr": lambda xs: gemm.patchify_gemm(xs, w5.reshape(N, K), b, gemm_ptr),
        "linear": lambda xs: mods["linear"].triton_conv3d_patchify(xs.view(-1, C, T, P, P), w5, b),
    }
    for label, fn in graph_cases.items():
        try:
            static_x = torch.randn(m, K, device=dev, dtype=torch.bfloat16)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    fn(static_x)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = fn(static_x)
            errs = []
            for _ in range(3):
                static_x.copy_(torch.randn_like(static_x))
                static_out.fill_(float("nan"))
                graph.replay()
                torch.cuda.synchronize()
                ref_g = static_x.double() @ w5.reshape(N, K).double().T + b.double()
                errs.append(rel_err(static_out, ref_g))
            proofs[f"graph_{label}_rel_errs"] = errs
            proofs[f"graph_{label}_ok"] = all(e < 1e-2 for e in errs)
        except Exception:  # noqa: BLE001
            proofs[f"graph_{label}_ok"] = False
            proofs[f"graph_{label}_error"] = traceback.format_exc()[-2000:]
    return proofs


# ------------------------------------------------------------------------------------------


def md_table(rows: list[dict]) -> str:
    lines = [
        "| M | implementation | do_bench median µs | TFLOP/s | vs F.linear | "
        "graph µs/call | graph vs F.linear | rel err |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['M']} | {r['impl']} | {r['ms'] * 1e3:.1f} | {r['tflops']:.0f} | "
            f"{r['vs_linear']:.3f} | {r['graph_ms'] * 1e3:.1f} | "
            f"{r['graph_vs_linear']:.3f} | {r['rel_err']:.2e} |"
        )
    return "\n".join(lines)


def sweep_table(rows: list[dict]) -> str:
    """Ratios vs F.linear: CUDA-graph replay (kernel time) / do_bench (with host overhead)."""
    head = " | ".join(f"M={m} graph / do_bench" for m in SWEEP_M)
    lines = [
        f"| config | geo-mean graph / do_bench | {head} |",
        "|---|---|" + "---|" * len(SWEEP_M),
    ]
    for r in rows:
        vals = " | ".join(
            f"{r.get(f'gratio_{m}', 0):.3f} / {r.get(f'ratio_{m}', 0):.3f}" for m in SWEEP_M
        )
        name = r["name"] + (f" (error: {r['error'][:80]})" if "error" in r else "")
        lines.append(f"| {name} | {r['geo_gratio']:.3f} / {r['geo_ratio']:.3f} | {vals} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="time the tile-config grid")
    ap.add_argument("--quick", action="store_true", help="fewer shapes (smoke test)")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for md/json results")
    ap.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="JSON",
        help="also time the gemm with this config (JSON object; repeatable)",
    )
    ap.add_argument(
        "--sweep-config",
        action="append",
        default=[],
        metavar="JSON",
        help="sweep these configs instead of the built-in grid (JSON object, or @FILE holding a "
        "JSON list of them; repeatable)",
    )
    ap.add_argument(
        "--sweep-only", action="store_true", help="stop after the sweep (no bench or proofs)"
    )
    ap.add_argument(
        "--sweep-budget",
        type=float,
        default=SWEEP_BUDGET_S,
        metavar="S",
        help=f"seconds the sweep may take; later configs are skipped (default {SWEEP_BUDGET_S})",
    )
    args = ap.parse_args()
    if args.sweep_config or args.sweep_only:
        args.sweep = True
    if not torch.cuda.is_available():
        print("no GPU: nothing to benchmark")
        return 2
    import triton

    dev = torch.device("cuda", torch.cuda.current_device())
    torch.backends.cuda.matmul.allow_tf32 = False
    mods = {s: load_template(s) for s in SCHEMES}
    gemm = mods["gemm"]
    props = torch.cuda.get_device_properties(dev)
    env = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": torch.cuda.get_device_name(dev),
        "arch": gemm.device_arch(dev),
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "triton": triton.__version__,
        "python": platform.python_version(),
        "shipped_config": gemm.resolve_config(dev),
    }
    print(json.dumps(env), flush=True)
    result: dict[str, Any] = {"env": env}
    t0 = time.time()
    out_dir = Path(args.out) if args.out else None

    def save() -> None:
        # After every section, so a run cut off by its time limit still leaves its numbers.
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "patch_embed.json").write_text(json.dumps(result, indent=1, default=str))

    print("== host overhead (before anything else)", flush=True)
    result["overhead_first"] = host_overhead(mods, dev)
    for name, us in result["overhead_first"].items():
        print(f"  {name:<42} {us:8.1f} us/call")

    print("== correctness", flush=True)
    corr = check_correctness(mods, dev, args.quick)
    bad = [r for r in corr if not r["ok"]]
    result["correctness"] = corr
    worst: dict[str, float] = {}
    for r in corr:
        key = f"{r['impl']} {r['dtype']}"
        worst[key] = max(worst.get(key, 0.0), r["rel_err"] if r["rel_err"] == r["rel_err"] else 9)
    for key, val in sorted(worst.items()):
        print(f"  worst rel err {key:<32} {val:.2e}")
    print(f"  {len(corr) - len(bad)}/{len(corr)} checks passed ({time.time() - t0:.0f}s)")
    for r in bad[:20]:
        print("  FAIL", r)
    save()

    extra: list[tuple[str, dict]] = []
    for text in args.config:
        cfg = {**gemm.PATCH_EMBED_CONFIGS["default"]["any"], **json.loads(text)}
        extra.append((f"[{cfg_name(cfg)}]", cfg))
    if args.sweep:
        print("== sweep", flush=True)
        configs: list[dict[str, Any]] = []
        for text in args.sweep_config:
            if text.startswith("@"):
                configs.extend(json.loads(Path(text[1:]).read_text()))
            else:
                configs.append(json.loads(text))
        sweep = run_sweep(gemm, dev, configs, args.sweep_budget)
        result["sweep"] = sweep
        good = [r for r in sweep if r["geo_gratio"] > 0]
        for r in good[:2]:
            if r["config"] != env["shipped_config"]:
                extra.append((f"[{r['name']}]", r["config"]))
        ptr_rows = [r for r in good if not r["config"].get("tma")]
        if ptr_rows and all(
            ptr_rows[0]["config"] != cfg for cfg in [env["shipped_config"]] + [c for _, c in extra]
        ):
            extra.append((f"[{ptr_rows[0]['name']}]", ptr_rows[0]["config"]))
        result["sweep_best"] = good[0]["config"] if good else None
        save()
        if args.sweep_only:
            print("== sweep (best first)")
            print(sweep_table(sweep))
            if out_dir is not None:
                (out_dir / "sweep.md").write_text(sweep_table(sweep) + "\n")
            return 0
    print("== bench", flush=True)
    rows = run_bench(mods, dev, extra, args.quick)
    result["bench"] = rows
    save()

    print("== proofs", flush=True)
    proofs = prove(mods, dev)
    result["proofs"] = proofs
    save()
    summary = {
        k: v
        for k, v in proofs.items()
        if k.endswith(("_ok", "_conv_events", "_errs")) and not k.startswith("profiler_nn")
    }
    print(json.dumps(summary, default=str))
    print(
        "  nn.Conv3d conv events (detector sanity):", proofs["profiler_nn_conv3d_conv_events"][:6]
    )
    for k, v in proofs.items():
        if k.endswith("_error"):
            print(f"  {k}: {v[-600:]}")

    print("== host overhead (after the profiler and torch.compile)", flush=True)
    result["overhead_after_proofs"] = host_overhead(mods, dev)
    for name, us in result["overhead_after_proofs"].items():
        print(f"  {name:<42} {us:8.1f} us/call")
    result["wall_s"] = time.time() - t0
    save()

    save()
    if out_dir is not None:
        out = out_dir
        md = [
            f"# patch-embed benchmark, {env['date']}",
            f"{env['device']} ({env['arch']}, {env['sms']} SMs), torch {env['torch']}, "
            f"triton {env['triton']}, bf16, K={K}, N={N}",
            "",
            md_table(rows),
        ]
        (out / "patch_embed.md").write_text("\n".join(md) + "\n")
        if args.sweep:
            (out / "sweep.md").write_text(sweep_table(result["sweep"]) + "\n")
    if args.sweep:
        print("== sweep (best first)")
        print(sweep_table(result["sweep"][:8]))
    print(
        f"== {env['device']} torch {env['torch']} triton {env['triton']}  "
        f"correctness {len(corr) - len(bad)}/{len(corr)}  wall {result['wall_s']:.0f}s"
    )
    print(md_table(rows))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
