"""Nsight Compute counters for the patch-embed `gemm` kernel and cuBLAS on the same shape.

Re-runs itself under ``ncu`` (``--clock-control none``: the clocks the GPU picks under load)
and profiles one warm launch of each: the shipped `gemm` template's kernel and ``F.linear``.
Prints the counters behind docs/performance-patch-embed.md ("What limits the Triton GEMM"):
duration, SM clock, tensor-pipe activity, L2 throughput, bytes the SMs receive, and where the
`gemm` kernel's warps stall. With ``$OUT`` (or ``--out``) set, the raw ncu reports go there.

    python bench/patch_embed_ncu.py [--m 16384] [--ncu /usr/local/cuda/bin/ncu]
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

K, N = 1176, 1280
METRICS = (
    "gpu__time_duration.sum",
    "smsp__cycles_elapsed.avg.per_second",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_bytes.sum.per_second",
    "l1tex__m_xbar2l1tex_read_bytes.sum.per_second",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
)


def workload(m: int) -> None:
    """Two warm-up rounds, then the profiled round: F.linear, then the gemm kernel."""
    import torch
    import torch.nn.functional as F
    from patch_embed import load_template

    gemm = load_template("gemm")
    x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, N, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        F.linear(x, w)
        gemm.patchify_gemm(x, w, None, out=out)
    torch.cuda.synchronize()


def run_ncu(ncu: str, m: int, extra: list[str]) -> str:
    # Launches: 2 randn, then (F.linear, gemm) x 3; skipping 6 leaves the last round.
    cmd = [ncu, "--clock-control", "none", "--launch-skip", "6", "--launch-count", "2", *extra]
    cmd += [sys.executable, __file__, "--workload", "--m", str(m)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"ncu failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr}")
    return proc.stdout


def top_stalls(report: str, count: int = 6) -> list[tuple[float, str]]:
    lines = report.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"Address"'))
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    col = rows[0].index("Warp Stall Sampling (All Samples)")
    body = [r for r in rows[1:] if len(r) > col and r[col]]
    total = sum(float(r[col]) for r in body) or 1.0
    ranked = sorted(body, key=lambda r: -float(r[col]))[:count]
    return [(float(r[col]) / total, r[1].strip()) for r in ranked]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=16384, help="patches (rows of the GEMM)")
    ap.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for the raw reports")
    ap.add_argument("--workload", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.workload:
        workload(args.m)
        return 0
    if not Path(args.ncu).exists():
        print(f"no Nsight Compute at {args.ncu}: nothing to profile")
        return 2
    metrics = run_ncu(args.ncu, args.m, ["--metrics", ",".join(METRICS)])
    print(f"M = {args.m}, bf16, K = {K}, N = {N}")
    for line in metrics.splitlines():
        if "Context" in line or any(name in line for name in METRICS):
            print(line.rstrip())
    # SASS-level stall samples for the gemm kernel only (the second profiled launch).
    sass = run_ncu(
        args.ncu,
        args.m,
        ["--section", "SourceCounters", "--page", "source", "--csv", "--print-source", "sass"],
    )
    gemm_part = sass[sass.rfind('"Kernel Name"') :]
    print("where the gemm kernel's warps stall (share of all samples, SASS):")
    for share, instr in top_stalls(gemm_part):
        print(f"  {share:6.1%}  {instr}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"ncu_metrics_{args.m}.txt").write_text(metrics)
        (out / f"ncu_sass_{args.m}.csv").write_text(sass)
    return 0


if __name__ == "__main__":
    sys.exit(main())
