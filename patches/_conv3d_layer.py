"""When vllm's ``Conv3dLayer`` runs a matmul in eager mode, read from ``conv.py`` itself.

From vllm 0.11.1 the Qwen-VL patch embeds build ``Conv3dLayer``
(``vllm/model_executor/layers/conv.py``). Its ``forward_cuda``, which ROCm runs too (there is
no ``forward_hip``), takes the matmul path only under a torch-version gate, and that gate
changed three times (shared notes, targets.md section 1.2)::

    if self.enable_linear and is_torch_equal("2.9.0"):                          # 0.11.1-0.13
    if self.enable_linear and (is_torch_equal("2.9.0") or is_torch_equal("2.9.1")):  # 0.14-0.18
    if self.enable_linear and is_torch_equal_or_newer("2.9.0"):                 # 0.19-

ROCm builds carry version labels that do not track their code, so the gate is read from the
file and evaluated with vllm's own comparisons (``vllm/utils/torch_utils.py``):
``is_torch_equal(t)`` is ``parse(t) <= v < parse(t + ".1")``, so ``2.9.0+rocm6.4`` passes;
``is_torch_equal_or_newer(t)`` is ``v >= parse(t)``, so ``2.10.0.dev…`` passes and
``2.9.0.dev…`` or ``2.9.0a0+git…`` (pre-releases) do not.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from packaging.version import InvalidVersion, Version

from rocmfix.rewrite import call_name, dotted, find_class, find_method, nodes

CONV_PY = "vllm/model_executor/layers/conv.py"


@dataclass(frozen=True)
class Gate:
    """``kind``: ``equal`` (any of ``versions``), ``newer`` (>= the one version), ``always``,
    ``never`` (no matmul branch), ``unknown`` (a shape rocmfix does not know: ``code`` says
    what it is), ``missing`` (no ``Conv3dLayer.forward_cuda`` in conv.py), ``absent`` (no
    conv.py at all)."""

    kind: str
    versions: tuple[str, ...] = ()
    code: str = ""

    def describe(self) -> str:
        if self.kind == "equal":
            return "torch " + " or ".join(self.versions) + " (is_torch_equal)"
        if self.kind == "newer":
            return f"torch >= {self.versions[0]} (is_torch_equal_or_newer)"
        if self.kind == "always":
            return "every torch (no version gate)"
        if self.kind == "never":
            return "no torch: forward_cuda always calls F.conv3d"
        if self.kind == "missing":
            return "conv.py has no Conv3dLayer.forward_cuda"
        if self.kind == "absent":
            return "no torch: this vllm has no layers/conv.py"
        return f"a gate rocmfix does not know: {self.code}"

    def admits(self, torch: str) -> bool | None:
        """Whether eager mode runs the matmul with this torch; None when it cannot tell."""
        if self.kind == "always":
            return True
        if self.kind == "never":
            return False
        if self.kind not in ("equal", "newer"):
            return None
        try:
            have = Version(torch)
            wanted = [Version(v) for v in self.versions]
        except InvalidVersion:
            return None
        if self.kind == "newer":
            return have >= wanted[0]
        return any(v <= have < Version(f"{v}.1") for v in wanted)


def _version_call(node: cst.BaseExpression, name: str) -> str | None:
    """The string argument of ``name("X.Y.Z")``, else None."""
    if (
        isinstance(node, cst.Call)
        and call_name(node) == name
        and len(node.args) == 1
        and isinstance(node.args[0].value, cst.SimpleString)
    ):
        value = node.args[0].value.evaluated_value
        return value if isinstance(value, str) else None
    return None


def _equal_any(node: cst.BaseExpression) -> tuple[str, ...] | None:
    """``is_torch_equal("A") or is_torch_equal("B") ...`` as ("A", "B", ...)."""
    if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.Or):
        left, right = _equal_any(node.left), _equal_any(node.right)
        return None if left is None or right is None else (*left, *right)
    one = _version_call(node, "is_torch_equal")
    return (one,) if one is not None else None


def _torch_gate(node: cst.BaseExpression, module: cst.Module) -> Gate:
    newer = _version_call(node, "is_torch_equal_or_newer")
    if newer is not None:
        return Gate("newer", (newer,))
    equal = _equal_any(node)
    if equal is not None:
        return Gate("equal", equal)
    return Gate("unknown", code=module.code_for_node(node))


def _conjuncts(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.And):
        return [*_conjuncts(node.left), *_conjuncts(node.right)]
    return [node]


def read_gate(source: bytes | None) -> Gate:
    if source is None:
        return Gate("absent")
    try:
        module = cst.parse_module(source)
    except (cst.ParserSyntaxError, UnicodeDecodeError, LookupError) as exc:
        return Gate("unknown", code=f"conv.py does not parse ({' '.join(str(exc).split())[:80]})")
    cls = find_class(module, "Conv3dLayer")
    forward = find_method(cls, "forward_cuda") if cls is not None else None
    if forward is None:
        return Gate("missing")
    mulmat = [c for c in nodes(forward, cst.Call) if call_name(c) == "self._forward_mulmat"]
    if not mulmat:
        return Gate("never")
    gates = [
        node
        for node in nodes(forward, cst.If)
        if any(dotted(c) == "self.enable_linear" for c in _conjuncts(node.test))
    ]
    if len(gates) != 1:
        if not gates and not nodes(forward, cst.If):
            return Gate("always")
        return Gate("unknown", code=f"{len(gates)} `if self.enable_linear ...` branches")
    torch_terms = [c for c in _conjuncts(gates[0].test) if dotted(c) != "self.enable_linear"]
    if not torch_terms:
        return Gate("always")
    if len(torch_terms) != 1:
        return Gate("unknown", code=module.code_for_node(gates[0].test))
    term = torch_terms[0]
    if isinstance(term, cst.BooleanOperation) and term.lpar:
        term = term.with_changes(lpar=[], rpar=[])
    return _torch_gate(term, module)
