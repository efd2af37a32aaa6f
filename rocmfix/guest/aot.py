"""Compile a kernel launch for a GPU this machine does not have, and read what the compiler
made of it: registers, spills, scratch, shared memory (LDS), occupancy, matrix instructions.

Triton compiles for AMD without a GPU (from Triton 3.5 it links the code object in-process),
and for NVIDIA with ptxas. The launch is bound exactly as Triton's JIT binds a real one, with
the backend of the target: the same specialisation, constexprs and options. Triton's own
binding API is internal and moves between versions, so a version it does not fit is reported
as such, never guessed around.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import tempfile
from types import SimpleNamespace
from typing import Any

from .context import one_line

# The GPUs rocmfix ships configs for, or that users run MinerU on: (backend, warp size,
# compute capability for CUDA, LDS/shared memory per workgroup in bytes, VGPRs per SIMD lane
# for a wave's occupancy on AMD, the most waves a SIMD holds). `rocmfix kernels` checks these.
Target = tuple[str, int, int, int, int, int]
TARGETS: dict[str, Target] = {
    "gfx1100": ("hip", 32, 0, 65536, 1536, 16),  # RDNA3: RX 7900 XTX, W7900
    "gfx1201": ("hip", 32, 0, 65536, 1536, 16),  # RDNA4: RX 9070 XT
    "gfx90a": ("hip", 64, 0, 65536, 512, 8),  # CDNA2: MI210/MI250
    "gfx942": ("hip", 64, 0, 65536, 512, 8),  # CDNA3: MI300X
    "gfx950": ("hip", 64, 0, 163840, 512, 8),  # CDNA4: MI355X
    "sm_90": ("cuda", 32, 90, 232448, 0, 0),  # H100/H200
}
# Shared memory per block (opt-in maximum) of NVIDIA generations not in TARGETS.
_CUDA_SHARED = {80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448, 100: 232448,
                120: 101376}  # fmt: skip


def describe(arch: str) -> Target | None:
    """``arch``'s row, for the GPUs in TARGETS and, conservatively, for the rest of a family
    (the GPU ``doctor`` and ``tune`` run on may be any); None for one rocmfix cannot place."""
    arch = arch.split(":")[0]  # gfx90a:sramecc+:xnack- names the same chip
    if arch in TARGETS:
        return TARGETS[arch]
    amd = re.fullmatch(r"gfx(\d{2,3})[0-9a-f]", arch)
    if amd:
        family = int(amd.group(1))
        if family >= 100:  # RDNA: wave32, 1024 VGPRs per SIMD lane on the smaller dies
            return ("hip", 32, 0, 65536, 1024, 16)
        return ("hip", 64, 0, 65536, 512, 8)  # GCN/CDNA
    nvidia = re.fullmatch(r"sm_(\d+)a?", arch)
    if nvidia:
        cc = int(nvidia.group(1))
        return ("cuda", 32, cc, _CUDA_SHARED.get(cc, 49152), 0, 0)
    return None


def matrix(arch: str) -> dict[str, str]:
    """The matrix instruction ``arch`` has per operand class ("fp32": IEEE fp32, "tf32")."""
    arch = arch.split(":")[0]
    if re.match(r"gfx1[12]", arch):  # RDNA3, RDNA4
        return {"f16": "v_wmma"}
    if re.match(r"gfx9(08|0a|4|5)", arch):  # CDNA1-4; CDNA3 alone has xf32
        mfma = {"f16": "v_mfma", "fp32": "v_mfma"}
        return {**mfma, "tf32": "v_mfma"} if arch.startswith("gfx94") else mfma
    if re.fullmatch(r"sm_(8\d|9\d|1\d\d)a?", arch):
        return {"f16": "mma", "tf32": "mma"}
    return {}


def target(arch: str) -> Any:
    from triton.backends.compiler import GPUTarget

    row = describe(arch)
    if row is None:
        raise ValueError(f"no compile target known for {arch}")
    backend, warp, cc, *_ = row
    return GPUTarget(backend, cc if backend == "cuda" else arch.split(":")[0], warp)


def _field(text: str, key: str) -> int | None:
    found = re.search(re.escape(key) + r":\s*(\d+)", text)
    return int(found.group(1)) if found else None


def _compile(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any], arch: str) -> Any:
    """Bind and compile as Triton's JIT does for a launch, for ``arch``."""
    compiler = importlib.import_module("triton.compiler")
    jit = importlib.import_module("triton.runtime.jit")
    gpu = target(arch)
    backend = compiler.make_backend(gpu)
    binder = jit.create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(
        backend, kwargs, bound, specialization, options
    )
    source = compiler.ASTSource(kernel, signature, constexprs, attrs)
    return compiler.compile(source, target=gpu, options=options.__dict__)


def _ptxas_path() -> str | None:
    """The ptxas Triton itself compiles with (its wheel ships one), else one on PATH."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        return str(get_ptxas(90).path)
    except Exception:  # noqa: BLE001 - the helper moved between Triton versions
        return os.environ.get("TRITON_PTXAS_PATH") or shutil.which("ptxas")


def _ptxas(ptx: str, arch: str) -> tuple[int | None, int, int]:
    """(registers, spilled bytes, stack bytes) from ``ptxas -v``."""
    ptxas = _ptxas_path()
    if ptxas is None:
        return None, 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(ptx)
        done = subprocess.run(
            [
                ptxas,
                "-v",
                "--gpu-name=" + ("sm_90a" if arch == "sm_90" else arch),
                path,
                "-o",
                os.path.join(tmp, "k.cubin"),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    text = done.stdout + done.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores", text)
    stack = re.search(r"(\d+) bytes stack frame", text)
    return (
        int(regs.group(1)) if regs else None,
        int(spill.group(1)) if spill else 0,
        int(stack.group(1)) if stack else 0,
    )


def check(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any], arch: str,
          operands: str) -> dict[str, Any]:  # fmt: skip
    """Compile one launch for ``arch``: what the compiler made of it, as fields of the
    ``protocol.Checked`` it goes into (where they are defined). ``operands`` is its operand
    class ("f16", "tf32", "fp32"), which decides whether a matrix instruction must appear."""
    row = describe(arch)
    if row is None:
        raise ValueError(f"no compile target known for {arch}")
    _, _, _, lds_limit, vgprs_per_simd, max_waves = row
    stats = SimpleNamespace(
        arch=arch, ok=True, error=None, problems=[], registers=None, spills=0,
        sgpr_spills=0, scratch=0, shared=0, shared_limit=lds_limit, waves=None, matrix=0,
        matrix_wanted=None,
    )  # fmt: skip
    try:
        compiled = _compile(kernel, args, kwargs, arch)
    except Exception as exc:  # noqa: BLE001 - a config this compiler refuses is the finding
        stats.ok = False
        stats.error = one_line(exc)
        stats.problems.append("does not compile: " + stats.error)
        return vars(stats)
    stats.shared = int(getattr(compiled.metadata, "shared", 0) or 0)
    stats.matrix_wanted = matrix(arch).get(operands)
    if "amdgcn" in compiled.asm:
        code = compiled.asm["amdgcn"]
        stats.registers = _field(code, ".vgpr_count")
        stats.spills = _field(code, ".vgpr_spill_count") or 0
        # SGPR spills land in spare VGPR lanes, not in memory: reported, not a failure.
        stats.sgpr_spills = _field(code, ".sgpr_spill_count") or 0
        stats.scratch = _field(code, ".private_segment_fixed_size") or 0
        if stats.registers:
            used = -(-stats.registers // 8) * 8  # VGPRs are allocated in blocks of 8
            stats.waves = min(max_waves, vgprs_per_simd // used)
        if stats.matrix_wanted:
            stats.matrix = len(re.findall(stats.matrix_wanted + r"\w*", code))
    else:
        ptx = compiled.asm.get("ptx", "")
        stats.registers, spilled, stats.scratch = _ptxas(ptx, arch)
        stats.spills = spilled // 4  # ptxas counts bytes; a register is 4
        if stats.matrix_wanted:
            stats.matrix = len(re.findall(r"\b(?:wgmma|mma)\.", ptx))
    if stats.registers is None:
        tool = "ptxas" if arch.startswith("sm_") else "the code object"
        stats.problems.append(f"register use unknown: {tool} did not say")
    if stats.spills or stats.scratch:
        stats.problems.append(
            f"spills registers ({stats.spills} spilled, {stats.scratch} bytes of scratch per lane)"
        )
    if stats.shared > lds_limit:
        stats.problems.append(
            f"needs {stats.shared} bytes of shared memory; {arch} has {lds_limit}"
        )
    if stats.matrix_wanted and not stats.matrix:
        stats.problems.append(f"no {stats.matrix_wanted} instruction: the dot runs on FMA units")
    stats.ok = not stats.problems
    return vars(stats)
