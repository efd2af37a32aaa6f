"""Routing a layer's conv (and the BatchNorm and activation after it) through a dropped entry.

The depthwise and transposed convs of PP-DocLayoutV2's HGNetV2, D-FINE and MinerU's PaddleOCR
ports all sit in a layer's ``forward`` as consecutive statements on one variable::

    hidden = self.convolution(x)
    hidden = self.normalization(hidden)
    hidden = self.activation(hidden)

or nested in one ``return self.act(self.bn(self.conv(x)))`` (DocLayout-YOLO's ``Conv``).
A :class:`Site` names such a run by its class and attributes; the rewrite keeps the run, as
the ``else`` of a guard that sends GPU inputs to the dropped entry with the same modules
(``entry(x, self.convolution, bn=self.normalization, act=self.activation)``). The entry
decides per call whether it handles the conv (depthwise, eval mode, a dtype it knows) and
runs the stock modules otherwise, so the guard only asks whether the module imported and the
input is on a GPU. Runs may sit in nested blocks (``if self.mode == ...:``); every run of a
site's attributes in its method is routed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import libcst as cst

from rocmfix import rewrite
from rocmfix.errors import AnchorNotFoundError
from rocmfix.ops import Op
from rocmfix.patch import Classification, CodeShape, Patch, TargetContext


@dataclass(frozen=True)
class Site:
    """``cls.method`` runs ``v = self.conv(x)``, then ``v = self.bn(v)`` and ``v = self.act(v)``
    where those are named; the entry gets what is named."""

    cls: str
    conv: str
    bn: str | None = None
    act: str | None = None
    method: str = "forward"

    @property
    def steps(self) -> list[str]:
        return [a for a in (self.conv, self.bn, self.act) if a]

    @property
    def run(self) -> str:
        return " → ".join(f"self.{a}" for a in self.steps)

    @property
    def label(self) -> str:
        return f"{self.cls}.{self.method} ({self.run})"


def local(op: Op) -> str:
    """The name a rewritten module imports ``op``'s entry as."""
    return f"_rocmfix_{op.function}"


@dataclass(frozen=True)
class Router:
    """One target file's sites and the op whose entry its rewrite imports."""

    path: str
    kernel_module: str
    op: Op
    sites: tuple[Site, ...]
    # Why GPU inputs go around the stock op, for the marker comment (one short line).
    why: str
    needs: str
    # Route only convs with groups > 1: the dense and 1x1 convs of the same layer class then
    # keep the stock call, without even the entry's checks (a layer's module may be a wrapper
    # with no ``groups``: it counts as 1).
    grouped: bool = False
    # More of the guard, an expression of ``{conv}`` (the layer's conv module), so that convs
    # the entry never takes keep the stock call.
    gate: str = ""

    @property
    def local(self) -> str:
        return local(self.op)


def patch(router: Router, **fields: Any) -> Patch:
    """The patch that routes ``router``'s sites; ``fields`` are the rest of its data."""
    return Patch(
        path=router.path,
        classify=partial(classify, router),
        transform=partial(transform, router),
        op=router.op,
        kernel_module=router.kernel_module,
        **fields,
    )


def routed(module: cst.Module, node: cst.CSTNode, name: str, says: str) -> Classification | None:
    """Where ``node`` calls ``name`` (an entry's :func:`local` name): rocmfix's rewrite (``says``
    what it does), or, without rocmfix's marker in the module, a hand edit; else None."""
    if not rewrite.calls(node, name):
        return None
    if rewrite.module_has_marker(module):
        return Classification(CodeShape.PATCHED, says)
    return Classification(CodeShape.UNKNOWN, f"{name} is there, but not from rocmfix")


def import_entry(module: cst.Module, path: str, kernel_module: str, op: Op) -> cst.Module:
    """``module`` with ``op``'s entry imported from the dropped kernel module after its
    imports, as :func:`local` (None where that import fails)."""
    kernels = rewrite.relative_import(path, kernel_module)
    return rewrite.import_dropped(
        module,
        f"try:\n    from {kernels} import {op.function} as {local(op)}\n"
        # Any Exception: a kernel file another user cannot read, a warning `-W error` turns
        # into one, a broken triton; none of them may break the model's import.
        f"except Exception:\n    {local(op)} = None\n",
        kernels.lstrip("."),
    )


def only_arg(call: cst.Call) -> cst.BaseExpression | None:
    """The one positional argument of ``call``, else None."""
    if len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
        return None
    return call.args[0].value


def _single_call(line: cst.CSTNode) -> tuple[str, str, str] | None:
    """(target, callee, argument) for ``target = callee(argument)``, the argument a name."""
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return None
    assign = line.body[0]
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return None
    target = assign.targets[0].target
    call = assign.value
    if not isinstance(target, cst.Name) or not isinstance(call, cst.Call):
        return None
    callee, arg = rewrite.dotted(call.func), only_arg(call)
    if callee is None or not isinstance(arg, cst.Name):
        return None
    return target.value, callee, arg.value


def _returned(line: cst.BaseStatement, steps: Sequence[str]) -> str | None:
    """The input's name where ``line`` is ``return self.act(self.bn(self.conv(x)))`` (the
    steps nested, the first innermost), else None."""
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return None
    node = line.body[0].value if isinstance(line.body[0], cst.Return) else None
    for attr in reversed(steps):
        if not (isinstance(node, cst.Call) and rewrite.dotted(node.func) == f"self.{attr}"):
            return None
        node = only_arg(node)
    return node.value if isinstance(node, cst.Name) else None


def _run_at(lines: Sequence[cst.BaseStatement], i: int, site: Site) -> tuple[str, str, int] | None:
    """(target, input, lines) when ``lines[i:]`` starts with ``site``'s run, else None; the
    target is "" for a run nested in one ``return``."""
    steps = site.steps
    if (returned := _returned(lines[i], steps)) is not None:
        return "", returned, 1
    if i + len(steps) > len(lines):
        return None
    first = _single_call(lines[i])
    if first is None or first[1] != f"self.{site.conv}":
        return None
    target = first[0]
    for offset, attr in enumerate(steps[1:], start=1):
        if _single_call(lines[i + offset]) != (target, f"self.{attr}", target):
            return None
    return target, first[2], len(steps)


def _blocks(method: cst.FunctionDef) -> list[cst.IndentedBlock]:
    found: list[cst.IndentedBlock] = []

    class _Visit(cst.CSTVisitor):
        def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
            found.append(node)

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            # Nested functions are not the layer's forward.
            return node is method

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return False

    method.visit(_Visit())
    return found


def _found(module: cst.Module, site: Site) -> tuple[cst.ClassDef, cst.FunctionDef | None] | None:
    """``site``'s class, where the module has it and it uses ``self.<conv>`` at all (else None:
    a release whose class has no such module, DBHead before PP-OCRv6's ``conv_final``, has no
    such site), with its method where that runs the conv as rocmfix knows it (else None)."""
    cls = rewrite.find_class(module, site.cls)
    conv = f"self.{site.conv}"
    if cls is None or not any(
        rewrite.dotted(node) == conv for node in rewrite.nodes(cls, cst.Attribute)
    ):
        return None
    method = rewrite.find_method(cls, site.method)
    runs = method is not None and any(
        _run_at(block.body, i, site) for block in _blocks(method) for i in range(len(block.body))
    )
    return cls, (method if runs else None)


def classify(router: Router, module: cst.Module, ctx: TargetContext) -> Classification:
    says = f"GPU inputs go through {router.op.function}"
    if (ours := routed(module, module, router.local, says)) is not None:
        return ours
    present = []
    for site in router.sites:
        found = _found(module, site)
        if found is None:
            continue
        if found[1] is None:
            return Classification(
                CodeShape.UNKNOWN,
                f"{site.cls}.{site.method} does not run {site.run} as rocmfix knows it",
            )
        if site.cls not in present:
            present.append(site.cls)
    if not present:
        names = ", ".join(sorted({s.cls for s in router.sites}))
        return Classification(CodeShape.FIXED_UPSTREAM, f"this version has no {names}")
    return Classification(CodeShape.NEEDS_PATCH, f"{', '.join(present)}: {router.needs}")


def _guarded(
    module: cst.Module,
    router: Router,
    site: Site,
    run: list[cst.BaseStatement],
    io: tuple[str, str, int],
) -> cst.If:
    target, arg, _size = io
    extra = "".join(f", {k}=self.{v}" for k, v in (("bn", site.bn), ("act", site.act)) if v)
    gate = f' and getattr(self.{site.conv}, "groups", 1) > 1' if router.grouped else ""
    if router.gate:
        gate += " and " + router.gate.format(conv=f"self.{site.conv}")
    assign = f"{target} =" if target else "return"
    code = (
        f"if {router.local} is not None and {arg}.is_cuda{gate}:\n"
        f"    {assign} {router.local}({arg}, self.{site.conv}{extra})\n"
        "else:\n    pass\n"
    )
    guard = rewrite.statement(module, code)
    assert isinstance(guard, cst.If) and isinstance(guard.orelse, cst.Else)
    first = run[0]
    assert isinstance(first, cst.SimpleStatementLine)
    body = [*run]
    body[0] = first.with_changes(leading_lines=[])
    return guard.with_changes(
        leading_lines=[*first.leading_lines, rewrite.marker_line(router.why)],
        orelse=guard.orelse.with_changes(body=guard.orelse.body.with_changes(body=body)),
    )


def _route_method(
    module: cst.Module, router: Router, site: Site, method: cst.FunctionDef
) -> cst.FunctionDef:
    ours = {id(block) for block in _blocks(method)}  # the blocks _found reads, no others

    class _Swap(cst.CSTTransformer):
        def leave_IndentedBlock(
            self, old: cst.IndentedBlock, new: cst.IndentedBlock
        ) -> cst.IndentedBlock:
            if id(old) not in ours:
                return new
            lines = list(new.body)
            out: list[cst.BaseStatement] = []
            i = 0
            while i < len(lines):
                io = _run_at(lines, i, site)
                if io is None:
                    out.append(lines[i])
                    i += 1
                    continue
                size = io[2]
                out.append(_guarded(module, router, site, lines[i : i + size], io))
                i += size
            return new.with_changes(body=out)

    routed = method.visit(_Swap())
    assert isinstance(routed, cst.FunctionDef)
    return routed


def transform(router: Router, module: cst.Module) -> cst.Module:
    if rewrite.calls(module, router.local):
        raise AnchorNotFoundError(f"{router.local} is already called")
    routed_any = False
    for site in router.sites:
        found = _found(module, site)
        if found is None:
            continue
        cls, method = found
        if method is None:
            raise AnchorNotFoundError(f"no {site.label} run")
        new_method = _route_method(module, router, site, method)
        module = rewrite.replace_class(module, cls, rewrite.replace_method(cls, method, new_method))
        routed_any = True
    if not routed_any:
        raise AnchorNotFoundError(f"none of {', '.join(s.cls for s in router.sites)}")
    return import_entry(module, router.path, router.kernel_module, router.op)
