"""Production lines (rocmfix/, patches/, templates/ ``*.py``) by the promise each piece serves:
the table of docs/architecture.md's "Where the lines go (issue 40)". Not a test: a count.

    python bench/line_account.py

A module that serves one promise counts whole (``WHOLE``); a mixed one is split by the line
ranges of its functions and classes (``MIXED``: estimates, the rest of the module to its main
use). A module in neither is printed as unmapped: give it a row before trusting the total.
"""

from __future__ import annotations

import collections
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PLUMBING, STATUS, APPLY, SAFETY = "shared plumbing", "status", "apply/revert/dry-run", "safety"
DOCTOR, TUNE, KERNELS, ENV, PROFILE = "doctor", "tune", "kernels", "env", "profile"
WORKER, TRITON = "worker transport", "Triton support modules"
PE, DW, DIL, CT, PW, VIT = (
    "op: patch embed",
    "op: depthwise conv",
    "op: dilated conv",
    "op: transposed conv",
    "op: 1x1 conv",
    "op: vit attention",
)
ROUTING, TOKENIZER, TABLES, GRAPHS = (
    "conv routing (shared)",
    "MinerU tokenizer guard",
    "MinerU tables",
    "MinerU graphs",
)

WHOLE = {
    PLUMBING: "rocmfix/__init__.py rocmfix/__main__.py rocmfix/_resources.py rocmfix/errors.py "
    "rocmfix/crashlog.py rocmfix/render/__init__.py rocmfix/render/console.py "
    "rocmfix/render/help_hooks.py rocmfix/guest/probe.py rocmfix/ops/__init__.py "
    "rocmfix/ops/base.py rocmfix/registry.py patches/__init__.py templates/__init__.py",
    STATUS: "rocmfix/render/status.py rocmfix/checks.py rocmfix/system.py",
    APPLY: "rocmfix/write/__init__.py rocmfix/write/commands.py rocmfix/write/plan.py "
    "rocmfix/write/verdicts.py rocmfix/write/transaction.py rocmfix/render/run.py "
    "rocmfix/diffing.py rocmfix/patch.py rocmfix/rewrite.py rocmfix/mineru.py",
    SAFETY: "rocmfix/fsops.py rocmfix/state.py rocmfix/manifest.py rocmfix/supervise.py",
    DOCTOR: "rocmfix/doctor.py rocmfix/render/doctor.py rocmfix/guest/doctor.py "
    "rocmfix/guest/confirm.py rocmfix/measured.py rocmfix/guest/timing.py",
    TUNE: "rocmfix/tune.py rocmfix/guest/tune.py rocmfix/tuned_file.py rocmfix/render/tune.py",
    KERNELS: "rocmfix/kernels.py rocmfix/guest/check.py rocmfix/guest/aot.py "
    "rocmfix/render/kernels.py",
    ENV: "rocmfix/exports.py",
    PROFILE: "rocmfix/profile/__init__.py rocmfix/profile/analyse.py rocmfix/profile/collect.py "
    "rocmfix/profile/launch.py rocmfix/profile/model.py rocmfix/profile/replay.py "
    "rocmfix/guest/profile_shim.py rocmfix/render/profile.py rocmfix/guest/harness/call.py",
    WORKER: "rocmfix/worker.py rocmfix/guest/worker.py rocmfix/guest/context.py "
    "rocmfix/guest/__init__.py rocmfix/guest/templates.py rocmfix/guest/harness/__init__.py "
    "rocmfix/guest/harness/base.py",
    TRITON: "templates/rocmfix_triton.py templates/rocmfix_custom_op.py "
    "templates/rocmfix_kernel_config.py templates/rocmfix_kernel_support.py",
    PE: "rocmfix/ops/patch_embed.py rocmfix/guest/harness/patch_embed.py "
    "templates/patch_embed_gemm.py templates/patch_embed_kernels.py "
    "templates/patch_embed_linear.py patches/_patch_embed.py patches/_conv3d_layer.py "
    "patches/vllm_vision.py patches/transformers_vision.py patches/sglang_vision.py "
    "patches/lmdeploy_vision.py",
    DW: "rocmfix/ops/depthwise_conv.py rocmfix/guest/harness/depthwise_conv.py "
    "templates/depthwise_conv_triton.py templates/depthwise_conv_kernels.py "
    "templates/depthwise_conv_vendor.py patches/transformers_hgnet.py",
    DIL: "rocmfix/ops/dilated_conv.py rocmfix/guest/harness/dilated_conv.py "
    "templates/dilated_conv_triton.py templates/dilated_conv_kernels.py "
    "templates/dilated_conv_config.py templates/dilated_conv_phase.py "
    "patches/doclayout_dilated_conv.py",
    CT: "rocmfix/ops/conv_transpose.py rocmfix/guest/harness/conv_transpose.py "
    "templates/conv_transpose_linear.py",
    PW: "rocmfix/ops/pointwise_conv.py rocmfix/guest/harness/pointwise_conv.py "
    "templates/pointwise_conv_gemm.py patches/doclayout_conv.py",
    VIT: "rocmfix/ops/vit_attention.py rocmfix/guest/harness/vit_attention.py "
    "patches/mineru_vit_attention.py",
    ROUTING: "patches/_conv_sites.py patches/mineru_pytorchocr.py",
    TOKENIZER: "patches/mineru_tokenizer.py",
    TABLES: "patches/mineru_tables.py",
    GRAPHS: "patches/mineru_graphs.py templates/rocmfix_graphs.py",
}

# Mixed modules at 4cb5d5d: (promise, lines) from the ranges of their functions and classes.
MIXED: dict[str, tuple[list[tuple[str, int]], str]] = {
    # status, apply + revert, list, doctor_, tune_, kernels_, env_, profile_; the rest (imports,
    # _boundary, main) is plumbing.
    "rocmfix/cli.py": (
        [
            (STATUS, 43),
            (APPLY, 65),
            (DOCTOR, 33),
            (TUNE, 52),
            (KERNELS, 34),
            (ENV, 34),
            (PROFILE, 73),
        ],
        PLUMBING,
    ),
    # Verdict..StatusReport; ChangeKind..RunResult; Measurement..DoctorReport; KernelCheck,
    # KernelsReport; KernelResult, TuneReport.
    "rocmfix/results.py": (
        [(STATUS, 52), (APPLY, 54), (DOCTOR, 81), (KERNELS, 19), (TUNE, 41)],
        PLUMBING,
    ),
    # Call; Measured, Graphs; Plan, Tried, CandidateRow, Tuned, Resolved; Checked, CompileItem.
    "rocmfix/guest/protocol.py": (
        [(PROFILE, 21), (DOCTOR, 30), (TUNE, 56), (KERNELS, 43)],
        WORKER,
    ),
    # _Bad to _parse: the probe's answer validated as untrusted input.
    "rocmfix/environment.py": ([(SAFETY, 126)], PLUMBING),
}


def main() -> None:
    files = sorted(
        p.relative_to(ROOT).as_posix()
        for folder in ("rocmfix", "patches", "templates")
        for p in (ROOT / folder).rglob("*.py")
    )
    owner = {path: promise for promise, paths in WHOLE.items() for path in paths.split()}
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for path in files:
        lines = len((ROOT / path).read_text(encoding="utf-8").splitlines())
        total += lines
        if path in owner:
            counts[owner[path]] += lines
        elif path in MIXED:
            parts, rest = MIXED[path]
            for promise, n in parts:
                counts[promise] += n
            counts[rest] += lines - sum(n for _, n in parts)
        else:
            print(f"unmapped: {path} ({lines})")
    print("| promise | lines |\n|---|---:|")
    for promise, n in counts.most_common():
        print(f"| {promise} | {n:,} |")
    print(f"| **total** | **{total:,}** |")


if __name__ == "__main__":
    main()
