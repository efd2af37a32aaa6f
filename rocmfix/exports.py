"""The environment variables the recipe asks for, as lines a shell can ``eval``.

Only what applies is printed: the AOTriton flag only for a ROCm build of torch where
``rocmfix doctor`` measured the vision tower's attention faster with it on this GPU arch and
build (:mod:`rocmfix.measured`; elsewhere a comment says why not), the model source only when
the user asks for one. Each line comes with its reason as a comment, so
``eval "$(rocmfix env)"`` is safe and ``rocmfix env`` alone explains itself.

The interpreter's path and torch's version come from the target environment, which may say
anything: they reach the output only inside comments, on one line, with every character a
shell or terminal could act on (control characters, line and paragraph separators) replaced.
The assignments' values are rocmfix's own, quoted for the shell all the same.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from . import measured
from .checks import is_rocm
from .environment import Environment
from .errors import printable
from .ops import vit_attention
from .ops.vit_attention import AOTRITON_ENV

SHELLS = ("bash", "zsh", "fish", "powershell")
# MinerU's model sources, each with what it means.
MODEL_SOURCES = {
    "modelscope": "MinerU downloads its models from ModelScope instead of Hugging Face",
    "huggingface": "MinerU downloads its models from Hugging Face (its default, pinned here)",
    "local": "MinerU loads its models from the local paths in its config file, downloading nothing",
}


@dataclass(frozen=True)
class Export:
    name: str
    value: str
    reason: str


def aotriton(env: Environment) -> measured.Reading | None:
    """What doctor measured of SDPA under the AOTriton flag here; None off ROCm."""
    if not is_rocm(env):
        return None
    archs = measured.gpu_archs(env.system)
    return measured.reading(vit_attention.OP, env.torch, None, archs, "sdpa-aotriton")


def _assign(shell: str, export: Export) -> str:
    if shell == "fish":
        return f"set -gx {export.name} {shlex.quote(export.value)}"
    if shell == "powershell":
        quoted = export.value.replace("'", "''")
        return f"$env:{export.name} = '{quoted}'"
    return f"export {export.name}={shlex.quote(export.value)}"


def script(env: Environment, shell: str, model_source: str | None = None) -> str:
    """Comment lines and assignments; every shell rocmfix supports reads ``#`` comments."""
    lines = [f"# rocmfix env for {printable(env.python.executable)}"]
    found: list[Export] = []
    flag = aotriton(env)
    if flag is not None and flag.faster:
        found.append(
            Export(
                AOTRITON_ENV,
                "1",
                "AOTriton's SDPA kernels, which ROCm torch keeps behind this flag on consumer "
                f"Radeon cards: {flag.reason}",
            )
        )
    elif flag is not None:
        lines.append(f"# not exported: {AOTRITON_ENV}: {printable(flag.reason)}")
    if model_source is not None:
        found.append(Export("MINERU_MODEL_SOURCE", model_source, MODEL_SOURCES[model_source]))
    if not found and flag is not None:
        lines.append("# nothing to export")
    elif not found:
        torch = (
            f"torch {printable(env.torch.version)} is not a ROCm build" if env.torch else "no torch"
        )
        lines.append(f"# nothing to export: {torch}")
    for export in found:
        lines.append(f"# {printable(export.reason)}")
        lines.append(_assign(shell, export))
    return "\n".join(lines) + "\n"
