"""Which targets the MinerU in an environment runs, read from MinerU's own code.

MinerU's releases change which packages they run: 3.0 dropped DocLayout-YOLO, 2.5 added the
vllm and transformers VLM backends, 4.x loads through mineru-vl-utils. rocmfix never imports
MinerU (or anything else it inspects); it reads MinerU's source files with :mod:`ast` and
looks for the evidence each patch declares (:class:`~rocmfix.patch.MinerUUse`). Files that do
not contain any of the evidence's words are not parsed at all.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from . import fsops
from .patch import MinerUUse, Patch

DISTRIBUTION = "mineru"


@dataclass(frozen=True)
class Found:
    """The evidence found in MinerU's code: imported modules, imported names, strings."""

    imports: frozenset[str]
    names: frozenset[str]
    strings: frozenset[str]

    def shows(self, use: MinerUUse) -> str | None:
        """What in MinerU's code shows that it runs the target, else None."""
        for module in use.imports:
            if any(m == module or m.startswith(module + ".") for m in self.imports):
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


def scan(roots: Iterable[Path], patches: Iterable[Patch]) -> Found:
    """Read MinerU's package under ``roots`` for the evidence ``patches`` declare."""
    uses = [p.mineru for p in patches if p.mineru is not None]
    strings = frozenset(s for u in uses for s in u.strings)
    needles = {w.split(".")[0].encode() for u in uses for w in (*u.imports, *u.names)}
    needles |= {s.encode() for s in strings}
    found: dict[str, set[str]] = {"imports": set(), "names": set(), "strings": set()}
    for path in _files(roots):
        try:
            data = fsops.read_regular(path)
        except (fsops.NotRegularError, OSError):
            continue
        if not data or not any(n in data for n in needles):
            continue
        try:
            tree = ast.parse(data)
        except (SyntaxError, ValueError):
            continue
        _collect(tree, strings, found)
    return Found(
        frozenset(found["imports"]), frozenset(found["names"]), frozenset(found["strings"])
    )


@dataclass(frozen=True)
class MinerU:
    """The MinerU installed in an environment, and what its code was found to use."""

    version: str
    found: Found


def read(version: str, roots: Iterable[Path], patches: Iterable[Patch]) -> MinerU:
    return MinerU(version, scan(roots, patches))
