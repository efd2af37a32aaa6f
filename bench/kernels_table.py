"""What the compiler makes of every kernel rocmfix ships, for each GPU and Triton version:
docs/amd-kernels.md. Not a test: the test suite runs the same check with its own Triton
(tests/test_kernels_aot.py) and checks that this page covers every row it finds.

    python bench/kernels_table.py [--python PY]... [--out docs/amd-kernels.md]
    python bench/kernels_table.py --only-op depthwise-conv   # one op's rows, this Triton

Each ``--python`` is an interpreter with torch and a Triton (a venv per Triton version: ROCm's
torch wheels pin pytorch-triton-rocm, whose compiler is the PyPI triton of the same version);
the first one's numbers fill the main columns, every one adds a registers/spills column.
Without ``--python``: rocmfix's own interpreter.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rocmfix.render.console import config_text  # noqa: E402  # the CLI's own words

Row = tuple[str, str, str, str, str]  # op/scheme, kernel, dtype, shape, arch


def check(python: str, ops: list[str] | None = None) -> dict[str, Any]:
    # The shipped configs alone: no tuned file, no overrides from this shell.
    env = {k: v for k, v in os.environ.items() if not k.endswith("_CONFIG")}
    with tempfile.TemporaryDirectory() as tmp:
        env["ROCMFIX_TUNED_FILE"] = os.path.join(tmp, "none.json")
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "rocmfix",
                "kernels",
                "--json",
                "--python",
                python,
                *[arg for name in ops or () for arg in ("--op", name)],
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            check=False,
        )
    if done.returncode not in (0, 1):
        raise SystemExit(f"rocmfix kernels failed for {python}:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def key(c: dict[str, Any]) -> Row:
    return (f"{c['op']} {c['scheme']}", c["kernel"], c["dtype"], c["shape_label"], c["arch"])


def cell(c: dict[str, Any] | None) -> str:
    if c is None:
        return "-"
    if c["registers"] is None:
        return "**" + "; ".join(c["problems"])[:60] + "**"
    text = f"{c['registers']} / {c['spills']}"
    return text if c["ok"] else f"**{text}** ({'; '.join(c['problems'])[:60]})"


def line(c: dict[str, Any], by_version: list[dict[Row, dict[str, Any]]]) -> str:
    """One check as a row of the table; a version's cell is "-" where it was not compiled."""
    row = key(c)
    shared = f"{c['shared_bytes'] / 1024:.0f}/{c['shared_limit_bytes'] // 1024} KiB"
    matrix = (
        f"{c['matrix_instruction']} x{c['matrix_count']}"
        if c["matrix_instruction"]
        else ("FMA" if c["operands"] else "-")
    )
    return (
        f"| {row[0]} | `{row[1]}` | {row[2]} | {row[3]} | {row[4]} "
        f"| {config_text(c['config'])} "
        f"| {c['registers']} | {c['spills']} | {shared} "
        f"| {c['waves_per_simd'] if c['waves_per_simd'] is not None else '-'} | {matrix} | "
        + " | ".join(cell(v.get(row)) for v in by_version)
        + " |"
    )


def splice(text: str, op: str, doc: dict[str, Any]) -> str:
    """``text`` (the page) with ``op``'s rows replaced by ``doc``'s, in the page's columns:
    the Triton versions ``doc`` was not compiled with read "-" (regenerating only the rows of
    a new op, where the full sweep over every Triton is slow)."""
    lines = text.splitlines()
    header = next(i for i, t in enumerate(lines) if t.startswith("| op / scheme"))
    versions = [h.strip()[len("Triton ") :] for h in lines[header].split("|")
                if h.strip().startswith("Triton ")]  # fmt: skip
    found = {key(c): c for c in doc["checks"]}
    by_version = [found if v == doc["triton"] else {} for v in versions]
    end = header + 2
    while end < len(lines) and lines[end].startswith("| "):
        end += 1
    kept = [t for t in lines[header + 2 : end] if not t.startswith(f"| {op} ")]
    rows = [line(c, by_version) for c in doc["checks"] if c["op"] == op]
    return "\n".join([*lines[: header + 2], *kept, *rows, *lines[end:]]) + "\n"


def render(docs: list[dict[str, Any]]) -> str:
    main = docs[0]
    versions = [d["triton"] for d in docs]
    by_version = [{key(c): c for c in d["checks"]} for d in docs]
    today = datetime.date.today().isoformat()
    lines = [
        "# The kernels as compiled for each GPU",
        "",
        f"Generated {today} by `python bench/kernels_table.py` on {platform.machine()} "
        f"Linux without a GPU (`rocmfix kernels`: Triton compiles for AMD and NVIDIA ahead of "
        f"time). Main columns: Triton {main['triton']}; the last columns give registers / "
        "spilled registers per Triton version. Every row is the config that GPU would run "
        "(the templates' own resolution, no tuned file), at MinerU's shapes.",
        "",
        "regs: VGPRs per lane (AMD) or registers per thread (NVIDIA). LDS: shared memory per "
        "workgroup over the GPU's limit. waves: waves per SIMD the registers allow (AMD). "
        "matrix: the matrix instruction the dot compiled to (v_wmma on RDNA3/4, v_mfma on "
        "CDNA, mma/wgmma on Hopper) and how many; FMA where the dtype has none on that GPU.",
        "",
        "| op / scheme | kernel | dtype | shape | arch | config | regs | spills | LDS "
        "| waves | matrix | " + " | ".join(f"Triton {v}" for v in versions) + " |",
        "|" + "---|" * (11 + len(versions)),
    ]
    lines += [line(c, by_version) for c in main["checks"]]
    bad = {v: [c for c in d["checks"] if not c["ok"]] for v, d in zip(versions, docs, strict=True)}
    lines += ["", "## Findings", ""]
    for version, rows in bad.items():
        if not rows:
            lines.append(
                f"- Triton {version}: every compile is clean (no spills, LDS within limits, "
                "matrix instructions where the dtype has them)."
            )
        for c in rows:
            lines.append(
                f"- Triton {version}: {c['op']} {c['scheme']} {c['dtype']} on {c['arch']}: "
                + "; ".join(c["problems"])
            )
    lines += ["", NOTES.strip()]
    return "\n".join(lines) + "\n"


NOTES = """
## What the table settles, and what it does not

- **fp32 patch embed on RDNA** shipped as `default`'s 64x64x32 tile on 4 warps: 256 VGPRs,
  about 105 spilled, 288 bytes of scratch per lane on gfx1100 and gfx1201 with every Triton
  version here. RDNA has no fp32 matrix instruction, so the 64x64 fp32 accumulator sits in
  VGPRs; 8 warps halve it per lane (170-ish VGPRs, 8 waves, no spills). gfx1100 and gfx1201
  now carry that `fp32` entry. vllm and transformers run the tower in bf16, so this is the
  path of an fp32 checkpoint or a CPU-offloaded tower, not MinerU2.5's default.
- **gfx1201, gfx90a, gfx950** have no 16-bit entries of their own: the `default` tiles compile
  for them without spills, with WMMA/MFMA, at 4-7 waves per SIMD. Per-arch tiles for them
  would be guesses until someone runs `rocmfix tune` on one; `tune` now rejects any candidate
  that spills or overflows LDS there before timing it.
- **The dilated conv in fp32 on RDNA** (what MinerU 2.x's DocLayout-YOLO runs: the model is
  fp32) compiles to FMA: WMMA on gfx11/gfx12 takes f16/bf16/int8 operands only, no fp32 or
  TF32. CDNA has fp32 MFMA (gfx90a/gfx942/gfx950) and gfx942 also xf32. A bf16 compute path
  for the conv (cast in, fp32 accumulate, cast out) would reach WMMA on RDNA; its kernel
  error against fp64 equals cuDNN's bf16 error (1.7e-3, docs/performance-dilated-conv.md),
  but its effect on the detections needs the released DocLayout-YOLO weights, which this
  machine cannot download (bench/doclayout_model.py measures top-k agreement with random
  weights only). Until that is measured on real pages, rocmfix does not offer it.
- **sm_90, dilated conv, TF32, 96 channels** (`c96_k5_tf32`: 128x128x32, TMA) spilled 38
  registers on 4 warps under Triton 3.6.0 and 3.7.1 (torch 2.10-2.13), not under 3.5.1 or
  3.8.0. It runs on 8 warps now: no spills on any version here, and 0.84x cuDNN at worst
  against 4 warps' 0.82x on an H200 with Triton 3.6 (docs/performance-dilated-conv.md).
- **gfx1201 and `num_stages` >= 2**: Triton's AMD pipeliner crashes on some kernels at
  `num_stages=4` (triton#9815) and on RDNA4 at >= 2 in 3.6.0 builds (SageAttention#365). The
  kernels here compile at their shipped stage counts on every version above; the check runs
  in CI on the test extra's Triton, and `rocmfix kernels --python` runs it on a user's own.
"""


MEMORY_OPS = ("global_load", "buffer_load", "global_store", "buffer_store", "ds_read", "ds_write")


def memory_section(op_name: str, archs: tuple[str, ...] = ("gfx1100", "gfx1201", "gfx90a",
                   "gfx942", "gfx950")) -> str:  # fmt: skip
    """The memory instructions of ``op_name``'s kernel per AMD arch, at its tune targets in
    their dtypes, compiled here as `rocmfix kernels` compiles them (its templates' shipped
    configs): what one program issues, vector widths included."""
    import re

    from rocmfix.guest import aot, context, templates
    from rocmfix.guest.harness import module as harness
    from rocmfix.ops import op

    context.import_torch()
    spec = op(op_name)
    kernel_module = templates.load(str(ROOT / "templates"), spec.kernel_template, fresh=True)
    kc = __import__(kernel_module.__package__ + ".rocmfix_kernel_config", fromlist=["x"])
    launch = harness(spec.harness).launch
    rows = [
        f"### {op_name}: memory instructions per program (AMD, Triton "
        f"{__import__('triton').__version__})",
        "",
        "| shape | dtype | arch | " + " | ".join(MEMORY_OPS) + " |",
        "|" + "---|" * (3 + len(MEMORY_OPS)),
    ]
    for target in spec.tune:
        for dtype in (target.gpu["dtype"],):
            for arch in archs:
                with kc.emulating(kc.Emulation(arch, True, 0, 132)):
                    kernel_module.clear_config_cache()
                    kernel, args, kwargs, _ = launch(kernel_module, dict(target.gpu), dtype)
                    code = aot._compile(kernel, args, kwargs, arch).asm["amdgcn"]
                counts = [len(re.findall(r"\b" + name + r"\w*", code)) for name in MEMORY_OPS]
                rows.append(f"| {spec.label(target.gpu)} | {dtype} | {arch} | "
                            + " | ".join(map(str, counts)) + " |")  # fmt: skip
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", action="append", default=[])
    parser.add_argument("--out", default=str(ROOT / "docs" / "amd-kernels.md"))
    parser.add_argument("--only-op", help="regenerate this op's rows of --out, nothing else")
    parser.add_argument("--memory", help="print this op's memory instructions per AMD arch")
    args = parser.parse_args()
    if args.memory:
        print(memory_section(args.memory))
        return
    if args.only_op:
        doc = check((args.python or [sys.executable])[0], [args.only_op])
        out = Path(args.out)
        out.write_text(splice(out.read_text(encoding="utf-8"), args.only_op, doc), encoding="utf-8")
        return
    docs = [check(p) for p in (args.python or [sys.executable])]
    text = render(docs)
    Path(args.out).write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
