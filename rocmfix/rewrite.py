"""libcst helpers shared by the patch modules.

Every rewrite marks what it adds with a ``# rocmfix:`` comment, so a classification can
tell rocmfix's own edit from an upstream fix or a hand edit that looks alike.

Shapes are matched on the CST's nodes directly rather than through ``libcst.matchers``:
importing that generated module alone takes ~0.3 s, more than the rest of ``status``.
"""

from __future__ import annotations

import ast
import posixpath
from collections.abc import Sequence
from functools import lru_cache
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


def kwarg(call: cst.Call, name: str) -> cst.BaseExpression | None:
    """The value of ``call``'s keyword argument ``name``, else None."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg.value
    return None


def relative_import(source: str, module: str) -> str:
    """How the file at ``source`` imports the module file at ``module``, relatively
    (``..rocmfix_patch_embed`` from ``transformers/models/qwen2_vl/modeling_qwen2_vl.py``)."""
    here = posixpath.dirname(source).split("/")
    there = module.removesuffix(".py").split("/")
    shared = 0
    while shared < min(len(here), len(there) - 1) and here[shared] == there[shared]:
        shared += 1
    if shared == 0:
        raise ValueError(f"{module} is not in the package of {source}")
    return "." * (len(here) - shared + 1) + ".".join(there[shared:])


# How deep a syntax tree libcst is given. Its parser, visitors and code generator recurse
# about three Python frames per level and reach the interpreter's recursion limit near 400
# (a 400-term sum, valid Python); real modeling code nests 20-30 levels.
MAX_DEPTH = 200


class TooDeepError(ValueError):
    """Valid Python that nests deeper than rocmfix reads: the file is ``unsupported``."""

    def __init__(self, depth: int | None) -> None:
        super().__init__(
            f"its code nests more than {MAX_DEPTH} levels deep"
            + (f" ({depth}+)" if depth is not None else "")
            + ", deeper than rocmfix reads"
        )


# What :func:`parse` raises for a file that is not Python rocmfix reads.
UNREADABLE = (cst.ParserSyntaxError, UnicodeDecodeError, LookupError, TooDeepError)


def _check_depth(tree: ast.AST) -> None:
    # Iterative: the tree being measured is the one too deep to recurse over.
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise TooDeepError(depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _ast(data: bytes) -> ast.Module | None:
    """The standard library's tree of ``data`` (None: syntax it does not know, which libcst
    then reports); TooDeepError where it is too deep to read at all."""
    try:
        return ast.parse(data)
    except (SyntaxError, ValueError):
        return None
    except (RecursionError, MemoryError):
        raise TooDeepError(None) from None


# A run classifies the same files many times (each patch that reads a file, the plan's
# re-classification, apply's second plan under the lock): parse each bytes once and share
# the tree, which libcst never changes. Bounded: a run reads a few dozen files.
@lru_cache(maxsize=64)
def parse(data: bytes) -> cst.Module:
    """``cst.parse_module(data)``, bounded: code nested deeper than :data:`MAX_DEPTH` is
    refused with :class:`TooDeepError` in milliseconds, where libcst
    would raise RecursionError, or run for minutes first."""
    tree = _ast(data)
    if tree is not None:
        _check_depth(tree)
    try:
        return cst.parse_module(data)
    except RecursionError:
        raise TooDeepError(None) from None


@lru_cache(maxsize=64)
def focused(data: bytes, class_name: str) -> cst.Module:
    """The top-level class ``class_name`` of ``data`` and rocmfix's marker comments, as a
    module of its own: what a classification that looks at one class needs.

    A vision tower's modeling file is 30-60 KB, and libcst takes ~80 ms to parse one; the
    standard library's parser finds the class's lines in a tenth of that. Where it cannot
    (syntax it does not know), the whole file is parsed as usual.
    """
    tree = _ast(data)
    if tree is None:
        return parse(data)
    lines = data.splitlines(keepends=True)
    markers = [line.lstrip() for line in lines if line.lstrip().startswith(MARKER.encode())]
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            _check_depth(node)
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            body = lines[first : node.end_lineno]
            if body and not body[-1].endswith((b"\n", b"\r")):
                body[-1] += b"\n"
            return cst.parse_module(b"".join([*markers, *body]))
    return cst.parse_module(b"".join(markers))


class _Collect(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.found.append(node)
        return True


@lru_cache(maxsize=256)
def _walk(tree: cst.CSTNode) -> tuple[cst.CSTNode, ...]:
    # Nodes hash by identity and the cache holds the tree, so an entry never goes stale.
    collector = _Collect()
    tree.visit(collector)
    return tuple(collector.found)


def nodes(tree: cst.CSTNode, kind: type[N]) -> list[N]:
    """Every node of ``kind`` below ``tree``, in source order."""
    return [node for node in _walk(tree) if isinstance(node, kind)]


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


def find_function(module: cst.Module, name: str) -> cst.FunctionDef | None:
    """The module-level function ``name``; None where the module defines none."""
    for node in module.body:
        if isinstance(node, cst.FunctionDef) and node.name.value == name:
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


def add_helper(module: cst.Module, code: str) -> cst.Module:
    """Add the function ``code`` defines, after a blank line, below the module's imports."""
    helper = statement(module, code.lstrip("\n"))
    helper = helper.with_changes(leading_lines=[cst.EmptyLine(), *helper.leading_lines])
    return insert_after_last_import(module, helper)


def import_dropped(
    module: cst.Module, code: str, dropped: str, *, blank: bool = True
) -> cst.Module:
    """``module`` with ``code`` (the ``try``/``except`` that imports from a file rocmfix
    dropped, named ``dropped`` in its marker) after its imports, a blank line first."""
    imported = statement(module, code)
    marker = marker_line(f"{dropped} was dropped here by rocmfix; revert removes it")
    lines = [cst.EmptyLine(), marker] if blank else [marker]
    return insert_after_last_import(module, imported.with_changes(leading_lines=lines))


def replace_class(module: cst.Module, old: cst.ClassDef, new: cst.ClassDef) -> cst.Module:
    return module.with_changes(body=[new if node is old else node for node in module.body])


def replace_method(cls: cst.ClassDef, old: cst.FunctionDef, new: cst.FunctionDef) -> cst.ClassDef:
    body = cls.body
    assert isinstance(body, cst.IndentedBlock)
    return cls.with_changes(
        body=body.with_changes(body=[new if node is old else node for node in body.body])
    )
