"""Known conflicts in a target environment, found from its metadata alone.

The recipe rocmfix replaces (seed 000, sections 5 and 6) assumes a ROCm build of torch with
pytorch-triton-rocm and warns about flash-attn's Triton backend; users get these wrong as
often as the patches. Each check reads what the probe reported; none imports anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from .environment import Environment
from .ops import OPS

TRITON_DISTRIBUTIONS = ("triton", "pytorch-triton-rocm")
FLASH_ATTN_TRITON_AMD = "flash_attn/flash_attn_triton_amd"


@dataclass(frozen=True)
class EnvWarning:
    code: str
    message: str
    advice: str


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
