"""The environment variables the recipe asks for, as lines a shell can ``eval``.

Only what applies is printed: the AOTriton flag only for a ROCm build of torch, the model
source only when the user asks for one. Each line comes with its reason as a comment, so
``eval "$(rocmfix env)"`` is safe and ``rocmfix env`` alone explains itself.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from .checks import is_rocm
from .environment import Environment

SHELLS = ("bash", "zsh", "fish", "powershell")
MODEL_SOURCES = ("modelscope", "huggingface", "local")


@dataclass(frozen=True)
class Export:
    name: str
    value: str
    reason: str


def exports(env: Environment, model_source: str | None = None) -> tuple[Export, ...]:
    out = []
    if is_rocm(env):
        out.append(
            Export(
                "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL",
                "1",
                "AOTriton flash attention for consumer Radeon cards; ROCm torch keeps it "
                "behind this flag",
            )
        )
    if model_source is not None:
        out.append(
            Export(
                "MINERU_MODEL_SOURCE",
                model_source,
                _SOURCES.get(model_source, f"MinerU's model source: {model_source}"),
            )
        )
    return tuple(out)


_SOURCES = {
    "huggingface": "MinerU downloads its models from Hugging Face (its default, pinned here)",
    "modelscope": "MinerU downloads its models from ModelScope instead of Hugging Face",
    "local": "MinerU loads its models from the local paths in its config file, downloading nothing",
}


def _assign(shell: str, export: Export) -> str:
    if shell == "fish":
        return f"set -gx {export.name} {shlex.quote(export.value)}"
    if shell == "powershell":
        quoted = export.value.replace("'", "''")
        return f"$env:{export.name} = '{quoted}'"
    return f"export {export.name}={shlex.quote(export.value)}"


def script(env: Environment, shell: str, model_source: str | None = None) -> str:
    """Comment lines and assignments; every shell rocmfix supports reads ``#`` comments."""
    found = exports(env, model_source)
    lines = [f"# rocmfix env for {env.python.executable}"]
    if not found:
        torch = f"torch {env.torch.version} is not a ROCm build" if env.torch else "no torch"
        lines.append(f"# nothing to export: {torch}")
    for export in found:
        lines.append(f"# {export.reason}")
        lines.append(_assign(shell, export))
    return "\n".join(lines) + "\n"
