"""libcst helpers shared by the patch modules.

Every rewrite marks what it adds with a ``# rocmfix:`` comment, so a classification can
tell rocmfix's own edit from an upstream fix or a hand edit that looks alike.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst
import libcst.matchers as m

from .errors import AnchorNotFoundError

MARKER = "# rocmfix:"


def marker_line(text: str) -> cst.EmptyLine:
    return cst.EmptyLine(comment=cst.Comment(f"{MARKER} {text}"))


def has_marker(lines: Sequence[cst.EmptyLine]) -> bool:
    return any(line.comment is not None and line.comment.value.startswith(MARKER) for line in lines)


def module_has_marker(module: cst.Module) -> bool:
    return bool(m.findall(module, m.Comment(m.MatchIfTrue(lambda v: v.startswith(MARKER)))))


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


def contains(node: cst.CSTNode, matcher: m.BaseMatcherNode) -> bool:
    return bool(m.findall(node, matcher))


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
    last = max((index for index, node in enumerate(body) if _is_import(node)), default=None)
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
