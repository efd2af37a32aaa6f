"""libcst helpers shared by the patch modules.

Every rewrite marks what it adds with a ``# rocmfix:`` comment, so a classification can
tell rocmfix's own edit from an upstream fix or a hand edit that looks alike.

Shapes are matched on the CST's nodes directly rather than through ``libcst.matchers``:
importing that generated module alone takes ~0.3 s, more than the rest of ``status``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import libcst as cst

from .errors import AnchorNotFoundError

N = TypeVar("N", bound=cst.CSTNode)

MARKER = "# rocmfix:"


def marker_line(text: str) -> cst.EmptyLine:
    return cst.EmptyLine(comment=cst.Comment(f"{MARKER} {text}"))


def has_marker(lines: Sequence[cst.EmptyLine]) -> bool:
    return any(line.comment is not None and line.comment.value.startswith(MARKER) for line in lines)


def dotted(node: cst.CSTNode | None) -> str | None:
    """``self.proj.weight`` for an Attribute chain of Names, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        owner = dotted(node.value)
        return None if owner is None else f"{owner}.{node.attr.value}"
    return None


def call_name(node: cst.CSTNode | None) -> str | None:
    """The dotted name a Call calls (``self.proj`` for ``self.proj(x)``), else None."""
    return dotted(node.func) if isinstance(node, cst.Call) else None


class _Collect(cst.CSTVisitor):
    def __init__(self, kind: type[cst.CSTNode]) -> None:
        self.kind = kind
        self.found: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, self.kind):
            self.found.append(node)
        return True


def nodes(tree: cst.CSTNode, kind: type[N]) -> list[N]:
    """Every node of ``kind`` below ``tree``, in source order."""
    collector = _Collect(kind)
    tree.visit(collector)
    return [node for node in collector.found if isinstance(node, kind)]


def calls(tree: cst.CSTNode, name: str) -> list[cst.Call]:
    """Every call whose callee's dotted name is ``name`` or ends in ``.name``."""
    return [
        call
        for call in nodes(tree, cst.Call)
        if (found := call_name(call)) is not None and (found == name or found.endswith(f".{name}"))
    ]


def module_has_marker(module: cst.Module) -> bool:
    return any(comment.value.startswith(MARKER) for comment in nodes(module, cst.Comment))


Statement = cst.SimpleStatementLine | cst.BaseCompoundStatement


def statement(module: cst.Module, code: str) -> Statement:
    """Parse ``code`` with the target's own indentation and newline style."""
    return cst.parse_statement(code, config=module.config_for_parsing)


def expression(module: cst.Module, code: str) -> cst.BaseExpression:
    return cst.parse_expression(code, config=module.config_for_parsing)


def find_class(module: cst.Module, name: str) -> cst.ClassDef | None:
    for node in module.body:
        if isinstance(node, cst.ClassDef) and node.name.value == name:
            return node
    return None


def find_method(cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
    body = cls.body
    if not isinstance(body, cst.IndentedBlock):
        return None
    for node in body.body:
        if isinstance(node, cst.FunctionDef) and node.name.value == name:
            return node
    return None


def _is_import(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.SimpleStatementLine) and any(
        isinstance(small, cst.Import | cst.ImportFrom) for small in node.body
    )


def insert_after_last_import(module: cst.Module, new: Statement) -> cst.Module:
    """Add ``new`` after the last top-level import, wherever the import block ends.

    vllm's import block moves between releases (``torch.nn.functional`` left it in 0.13),
    so the anchor is the block's end, never a line number or a particular import.
    """
    body = list(module.body)
    # Imports after the first definition are late imports, not the module's import block.
    first_def = next(
        (i for i, node in enumerate(body) if isinstance(node, cst.ClassDef | cst.FunctionDef)),
        len(body),
    )
    last = max((i for i, node in enumerate(body[:first_def]) if _is_import(node)), default=None)
    if last is None:
        raise AnchorNotFoundError("no top-level import to insert after")
    body.insert(last + 1, new)
    return module.with_changes(body=body)


def replace_class(module: cst.Module, old: cst.ClassDef, new: cst.ClassDef) -> cst.Module:
    return module.with_changes(body=[new if node is old else node for node in module.body])


def replace_method(cls: cst.ClassDef, old: cst.FunctionDef, new: cst.FunctionDef) -> cst.ClassDef:
    body = cls.body
    assert isinstance(body, cst.IndentedBlock)
    return cls.with_changes(
        body=body.with_changes(body=[new if node is old else node for node in body.body])
    )
