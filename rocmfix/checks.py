"""Known conflicts in a target environment, found from its metadata alone.

The recipe rocmfix replaces (seed 000, sections 5 and 6) assumes a ROCm build of torch with
pytorch-triton-rocm and warns about flash-attn's Triton backend; users get these wrong as
often as the patches. Each check reads what the probe reported; none imports anything. The
code doctor runs to confirm a trap (:class:`Confirm`) is data here, run only by doctor.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from .environment import Environment
from .mineru import MinerU
from .ops import OPS
from .system import ONNXRUNTIME_BUILDS

TRITON_DISTRIBUTIONS = ("triton", "pytorch-triton-rocm")
FLASH_ATTN_TRITON_AMD = "flash_attn/flash_attn_triton_amd"


@dataclass(frozen=True)
class EnvWarning:
    code: str
    message: str
    advice: str
    # What doctor found running a trap's confirmation (:class:`Confirm`): its state
    # (confirmed, not confirmed, not checkable) and one line of evidence.
    confirmed: tuple[str, str] | None = None


def is_rocm(env: Environment) -> bool:
    return env.torch is not None and bool(env.torch.hip)


def has_triton(env: Environment) -> bool:
    return any(name in env.installed for name in TRITON_DISTRIBUTIONS)


def torch_build(env: Environment) -> str:
    assert env.torch is not None
    if env.torch.hip:
        return f"ROCm {env.torch.hip}"
    return f"CUDA {env.torch.cuda}" if env.torch.cuda else "CPU-only"


def _torch_pin(env: Environment) -> Requirement | None:
    vllm = env.installed.get("vllm")
    if vllm is None:
        return None
    for raw in vllm.requires:
        try:
            requirement = Requirement(raw)
        except InvalidRequirement:
            continue
        if requirement.name == "torch" and requirement.specifier and not requirement.marker:
            return requirement
    return None


def _mixed(env: Environment) -> list[EnvWarning]:
    out: list[EnvWarning] = []
    torch, vllm = env.installed.get("torch"), env.installed.get("vllm")
    if torch is None or vllm is None:
        return out
    pin = _torch_pin(env)
    try:
        installed = Version(torch.version)
    except InvalidVersion:
        installed = None
    if pin is not None and installed is not None and not pin.specifier.contains(installed, True):
        out.append(
            EnvWarning(
                "mixed-torch",
                f"vllm {vllm.version} was built for torch {pin.specifier}, but torch "
                f"{torch.version} is installed: vllm's compiled ops may not load",
                "install the vllm build that matches your torch (on ROCm: a source build "
                "against your ROCm torch, or the rocm/vllm image)",
            )
        )
    if torch.location != vllm.location:
        out.append(
            EnvWarning(
                "mixed-site",
                f"vllm is installed in {vllm.location} but torch in {torch.location}: "
                "two environments are mixed (user site-packages or PYTHONPATH?)",
                "install both into the same environment",
            )
        )
    return out


def environment_warnings(env: Environment) -> tuple[EnvWarning, ...]:
    out: list[EnvWarning] = []
    torch = env.torch
    if torch is not None and not torch.hip:
        out.append(
            EnvWarning(
                "torch-not-rocm",
                f"torch {torch.version} is a {torch_build(env)} build: the kernel patches "
                "are meant for ROCm, whose MIOpen lacks these convolutions",
                "there is nothing to fix on this stack; `rocmfix apply --force` patches "
                "anyway (that is how rocmfix tests its kernels on NVIDIA)",
            )
        )
    present = [name for name in TRITON_DISTRIBUTIONS if name in env.installed]
    if len(present) == 2:
        versions = ", ".join(f"{name} {env.installed[name].version}" for name in present)
        out.append(
            EnvWarning(
                "triton-shadowed",
                f"both {versions} are installed; each provides the `triton` package, so one "
                "silently shadows the other",
                "keep the one your torch was built with (ROCm torch: pytorch-triton-rocm), "
                "e.g. `pip uninstall triton`",
            )
        )
    if torch is not None and not present:
        out.append(
            EnvWarning(
                "triton-missing",
                "no Triton in this environment: the Triton schemes "
                f"({', '.join(_triton_schemes())}) cannot run their kernels",
                f"use {_fallbacks()} (vendor libraries, no Triton), or install the Triton "
                "your torch was built with",
            )
        )
    flash = env.installed.get("flash-attn")
    if is_rocm(env) and flash is not None and flash.exists.get(FLASH_ATTN_TRITON_AMD):
        out.append(
            EnvWarning(
                "flash-attn-triton",
                f"flash-attn {flash.version} with its Triton AMD backend is installed: the "
                "recipe found it breaks vllm on ROCm",
                "`pip uninstall flash-attn`; vllm brings its own ROCm attention backends",
            )
        )
    out.extend(_mixed(env))
    out.extend(traps(env))
    out.extend(
        EnvWarning(
            "probe",
            note,
            "rocmfix carried on without it; this says why something may be missing",
        )
        for note in env.notes
    )
    return tuple(out)


def _triton_schemes() -> list[str]:
    return list(dict.fromkeys(s.name for op in OPS for s in op.schemes if s.needs_triton))


def _fallbacks() -> str:
    """The no-Triton scheme of each op, as the commands that pick them."""
    by_scheme: dict[str, list[str]] = {}
    for op in OPS:
        if op.fallback is not None:
            by_scheme.setdefault(op.fallback, []).append(op.name)
    return " or ".join(
        f"`rocmfix apply --scheme {scheme}` ({', '.join(names)})"
        for scheme, names in by_scheme.items()
    )


CONFIRMED, NOT_CONFIRMED, NOT_CHECKABLE = "confirmed", "not confirmed", "not checkable"


@dataclass(frozen=True)
class Confirm:
    """What ``doctor`` runs to confirm a trap the metadata shows: ``code``, in the target
    interpreter, in a child of its own (an import it makes may abort the process), from
    ``/``, bounded in time (:mod:`rocmfix.guest.confirm`). Its one line (what ``code``
    printed, ``raised TYPE: MESSAGE`` or ``died of SIGNAL``) confirms the trap where it
    matches ``confirms``, clears it where it matches ``clears``, else leaves it not checkable."""

    code: str
    confirms: str
    clears: str

    def judge(self, answered: bool, line: str) -> tuple[str, str]:
        """The state and its evidence, from the child's line (``answered`` False: it could
        not run the code at all, and ``line`` says why)."""
        if answered and re.search(self.confirms, line):
            return CONFIRMED, line
        if answered and re.search(self.clears, line):
            return NOT_CONFIRMED, line
        return NOT_CHECKABLE, line


# The engine traps that end a first run on ROCm (issue 42): one row each, the evidence the
# probe's answer shows (one line; None where it shows none), the one line that fixes it, and
# where code must run to be sure, the confirmation doctor runs. Each fix fits an 80-column
# terminal under its four-column indent.
@dataclass(frozen=True)
class Trap:
    code: str
    evidence: Callable[[Environment], str | None]
    fix: str
    confirm: Confirm | None = None


# Architectures ROCm 7.x ships kernels for, where an override only swaps in another's.
NATIVE_GFX = frozenset(
    ("gfx908", "gfx90a", "gfx942", "gfx950", "gfx1030", "gfx1100", "gfx1101", "gfx1102",
     "gfx1150", "gfx1151", "gfx1200", "gfx1201")
)  # fmt: skip


def _rocm_torch(env: Environment) -> str:
    assert env.torch is not None
    return f"torch {env.torch.version} (ROCm {env.torch.hip})"


def _cuda_vllm(env: Environment) -> str | None:
    vllm, system = env.installed.get("vllm"), env.system
    if not is_rocm(env) or vllm is None or system.lists("vllm", "vllm/_rocm_C."):
        return None
    if not system.lists("vllm", "vllm/_C."):
        return None
    return (
        f"vllm {vllm.version} is a CUDA build (its RECORD has vllm/_C, no vllm/_rocm_C) "
        f"beside {_rocm_torch(env)}: 'Device string must not be empty' (MinerU#4655)"
    )


def _no_amdsmi(env: Environment) -> str | None:
    vllm = env.installed.get("vllm")
    if not is_rocm(env) or vllm is None or env.system.modules.get("amdsmi", True):
        return None
    return (
        f"vllm {vllm.version} finds ROCm through amdsmi, which this environment cannot "
        "import: its platform will not resolve to ROCm (vllm#41585)"
    )


def _no_kfd(env: Environment) -> str | None:
    vllm, devices = env.installed.get("vllm"), env.system.devices
    if not is_rocm(env) or vllm is None or devices.get("/dev/kfd", True):
        return None
    return (
        "no /dev/kfd here: amdsmi enumerates no GPU, so vllm's platform will not "
        "resolve to ROCm (vllm#46110; a container started without the device?)"
    )


def _override(env: Environment) -> str | None:
    value = env.system.env.get("HSA_OVERRIDE_GFX_VERSION")
    parts = (value or "").split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts) or not env.system.gfx:
        return None
    major, minor, step = map(int, parts)
    if minor > 15 or step > 15:
        return None
    wanted = f"gfx{major}{minor:x}{step:x}"
    for own in env.system.gfx:
        if own == wanted:
            continue
        if own[3:-2] != str(major):
            return (
                f"HSA_OVERRIDE_GFX_VERSION={value} asks for {wanted} on a {own}: across "
                "majors, which ROCm rejects since rocm-systems#5686"
            )
        if own in NATIVE_GFX:
            return (
                f"HSA_OVERRIDE_GFX_VERSION={value} runs {wanted}'s kernels on a {own}, "
                "which ROCm supports natively"
            )
    return None


def _dlpack(env: Environment) -> str | None:
    ext = env.installed.get("torch-c-dlpack-ext")
    addons = env.system.listings.get("torch-c-dlpack-ext", ())
    if not is_rocm(env) or ext is None or any("rocm" in a or "hip" in a for a in addons):
        return None
    cuda = [a.rsplit("/", 1)[-1] for a in addons if "cuda" in a]
    if not cuda:
        return None
    return (
        f"torch-c-dlpack-ext {ext.version} ships CUDA and CPU addons only ({cuda[-1]}), "
        f"beside {_rocm_torch(env)}: it loads the CUDA one and aborts vllm's import"
    )


def _turbomind(env: Environment) -> str | None:
    lmdeploy, mineru = env.installed.get("lmdeploy"), env.mineru
    if not is_rocm(env) or lmdeploy is None or mineru is None:
        return None
    if "turbomind" not in mineru.found.strings or not env.system.platform.startswith("win"):
        return None
    if env.system.env.get("MINERU_LMDEPLOY_BACKEND", "").strip():
        return None
    return (
        f"mineru {mineru.version} picks lmdeploy's turbomind on Windows whenever "
        f"torch.cuda.is_available(), as ROCm's torch says: turbomind is CUDA-only"
    )


def _onnx_shadowed(env: Environment) -> str | None:
    owner = env.system.onnxruntime
    if owner is None or len(owner.claimants) < 2:
        return None
    claim = " and ".join(f"{n} {env.versions.get(n, '?')}" for n in owner.claimants)
    every = "both" if len(owner.claimants) == 2 else "all"
    return (
        f"{claim} {every} install into onnxruntime/, and the last install won: its files are "
        f"{owner.package or 'unknown'}'s (RapidTable#32)"
    )


# The three vllm traps end the same way: vllm's platform does not resolve to ROCm.
VLLM_PLATFORM = Confirm(
    """
from vllm.platforms import current_platform as p
print("vllm's platform resolves to %s (device type %r)" % (type(p).__name__, p.device_type))
""",
    confirms="^vllm's platform resolves to (?!RocmPlatform)",
    clears="RocmPlatform",
)
# The extension picks its addon by torch.cuda.is_available(), which a ROCm torch says yes to;
# loading the CUDA one there fails, or aborts the process.
DLPACK = Confirm(
    """
import torch
addon = "CUDA" if torch.cuda.is_available() else "CPU"
try:
    import torch_c_dlpack_ext
    said = "loaded"
except OSError as exc:
    said = "%s: %s" % (type(exc).__name__, exc)
print("torch_c_dlpack_ext picks its %s addon: %s" % (addon, said))
""",
    confirms="^died of|CUDA addon: (?!loaded$)",
    clears="CPU addon|CUDA addon: loaded$",
)
# MinerU's own condition for turbomind on Windows: what torch says of CUDA.
CUDA_AVAILABLE = Confirm(
    "import torch\nprint('torch.cuda.is_available() is %s' % torch.cuda.is_available())",
    confirms="is True$",
    clears="is False$",
)

TRAPS: tuple[Trap, ...] = (
    Trap(
        "vllm-cuda-build",
        _cuda_vllm,
        "install a ROCm build of vllm (the rocm/vllm image)",
        VLLM_PLATFORM,
    ),
    Trap(
        "rocm-platform",
        _no_amdsmi,
        "pip install /opt/rocm/share/amd_smi (the amdsmi of your ROCm)",
        VLLM_PLATFORM,
    ),
    Trap(
        "no-gpu-device",
        _no_kfd,
        "start the container with --device=/dev/kfd --device=/dev/dri",
        VLLM_PLATFORM,
    ),
    Trap("gfx-override", _override, "unset HSA_OVERRIDE_GFX_VERSION"),
    Trap("dlpack-cuda", _dlpack, "pip uninstall torch-c-dlpack-ext", DLPACK),
    Trap("turbomind-rocm", _turbomind, "set MINERU_LMDEPLOY_BACKEND=pytorch", CUDA_AVAILABLE),
    Trap(
        "onnxruntime-shadowed",
        _onnx_shadowed,
        "pip uninstall every onnxruntime build, then install the one you want",
    ),
)


def traps(env: Environment) -> list[EnvWarning]:
    """The rows of :data:`TRAPS` this environment shows."""
    found = ((trap, trap.evidence(env)) for trap in TRAPS)
    return [EnvWarning(trap.code, seen, trap.fix) for trap, seen in found if seen is not None]


# Where each of MinerU's models runs here (issue 42, item 4): read from MinerU's code (what
# its small models need, which engines it names) and from what the probe found installed.
# (distribution, what MinerU's code names it by) in MinerU 4's "auto" order on a Linux GPU.
ENGINES = (("vllm", "vllm"), ("lmdeploy", "lmdeploy"), ("mineru-llama-cpp", "mineru_llama_cpp"))
TABLE_PATCHES = "mineru-table-"
AMD_ONNXRUNTIME = ("onnxruntime-migraphx", "onnxruntime-rocm")
SMALL, TABLES = "layout, OCR, formulas", "tables"


@dataclass(frozen=True)
class Placement:
    """One group of MinerU's models, where it runs here, and what would change that."""

    models: str
    where: str
    todo: str | None = None


def _device(env: Environment) -> str:
    torch = env.torch
    if torch is None:
        return "nowhere: torch is not installed"
    if torch.hip:
        return f"torch on the GPU (ROCm {torch.hip})"
    if torch.cuda:
        return f"torch on the GPU (CUDA {torch.cuda})"
    return "torch on the CPU (a CPU-only torch)"


def _small(env: Environment, mineru: MinerU) -> Placement:
    needs = mineru.found.torch_needs
    missing = [n for n in needs or () if n not in env.installed]
    if missing:
        todo = f"pip install {' '.join(missing)} for torch, where rocmfix's patches work"
        return Placement(SMALL, "ONNX on the CPU", todo)
    return Placement(SMALL, _device(env))


def _tables(env: Environment, applied: Collection[str]) -> Placement:
    owner = env.system.onnxruntime
    if owner is None or owner.package is None:
        return Placement(TABLES, "nowhere: onnxruntime is not installed")
    build = f"{owner.package} {owner.version or ''}".rstrip()
    listed = ONNXRUNTIME_BUILDS.get(owner.package, ())
    amd = [p for p in listed if p.startswith(("MIGraphX", "ROCM"))]
    other = [n for n in owner.claimants if n != owner.package and n in AMD_ONNXRUNTIME]
    if amd and any(p.startswith(TABLE_PATCHES) for p in applied):
        return Placement(TABLES, f"{amd[0]} ({build}); slanet-plus on the CPU")
    if amd:
        return Placement(
            TABLES, f"the CPU: MinerU never asks {build} for {amd[0]}", "rocmfix apply"
        )
    if other:
        where = f"the CPU: onnxruntime/ holds {build}, not {other[0]}"
        return Placement(TABLES, where, f"pip install --force-reinstall {other[0]}")
    if "CUDAExecutionProvider" in listed:
        return Placement(TABLES, f"CUDA ({build}), where a GPU is visible")
    todo = "pip install onnxruntime-migraphx, then rocmfix apply"
    return Placement(TABLES, f"the CPU ({build} has no GPU provider)", todo)


def _vlm(env: Environment, mineru: MinerU) -> Placement:
    found = mineru.found
    named = [
        f"{dist} {env.installed[dist].version}"
        for dist, word in ENGINES
        if dist in env.installed and (word in found.strings or word in found.imports)
    ]
    if not named:
        return Placement("VLM", "no engine MinerU names is installed (vllm, lmdeploy, llama.cpp)")
    rest = f" (also: {', '.join(named[1:])})" if len(named) > 1 else ""
    # MinerU 4 picks an engine itself ("auto"); before it, the backend named with -b did.
    how = "MinerU's pick on a Linux GPU" if ENGINES[2][1] in found.strings else "its -b vlm-*"
    return Placement("VLM", f"{named[0]} ({how}){rest}")


def placements(env: Environment, applied: Collection[str]) -> tuple[Placement, ...]:
    """Where each group of the installed MinerU's models runs (none without a MinerU);
    ``applied``: the ids of the patches in place."""
    mineru = env.mineru
    if mineru is None:
        return ()
    return (_small(env, mineru), _tables(env, applied), _vlm(env, mineru))
