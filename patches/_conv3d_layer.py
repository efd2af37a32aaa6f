"""When vllm's and sglang's ``Conv3dLayer`` runs a matmul, read from ``conv.py`` itself.

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

sglang's ``Conv3dLayer`` (0.5.10 on) has no gate: its ``forward_cuda`` reaches
``self._forward_mulmat`` whenever kernel == stride.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst
from packaging.version import InvalidVersion, Version

from rocmfix.rewrite import UNREADABLE, call_name, dotted, find_class, find_method, nodes, parse

CONV_PY = "vllm/model_executor/layers/conv.py"


@dataclass(frozen=True)
class Gate:
    """What vllm's eager-mode gate admits, as ``describe`` says; ``test`` decides a torch
    version (it may raise InvalidVersion), None where rocmfix cannot tell."""

    describe: str
    test: Callable[[str], bool] | None = None

    def admits(self, torch: str) -> bool | None:
        """Whether eager mode runs the matmul with this torch; None when it cannot tell."""
        try:
            return None if self.test is None else self.test(torch)
        except InvalidVersion:
            return None


def forward_cuda(source: bytes) -> tuple[cst.Module, cst.FunctionDef | None]:
    """conv.py, with its ``Conv3dLayer.forward_cuda`` (what ROCm runs too: there is no
    ``forward_hip``), None where it has none; raises :data:`UNREADABLE`."""
    module = parse(source)
    cls = find_class(module, "Conv3dLayer")
    return module, (find_method(cls, "forward_cuda") if cls is not None else None)


def runs_mulmat(forward: cst.FunctionDef) -> bool:
    return any(call_name(c) == "self._forward_mulmat" for c in nodes(forward, cst.Call))


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


def _unknown(code: str) -> Gate:
    return Gate(f"a gate rocmfix does not know: {code}")


def _torch_gate(node: cst.BaseExpression, module: cst.Module) -> Gate:
    newer = _version_call(node, "is_torch_equal_or_newer")
    if newer is not None:
        return Gate(
            f"torch >= {newer} (is_torch_equal_or_newer)",
            lambda torch: Version(torch) >= Version(newer),
        )
    equal = _equal_any(node)
    if equal is not None:

        def admits(torch: str) -> bool:
            have, wanted = Version(torch), [Version(v) for v in equal]
            return any(v <= have < Version(f"{v}.1") for v in wanted)

        return Gate("torch " + " or ".join(equal) + " (is_torch_equal)", admits)
    return _unknown(module.code_for_node(node))


def _conjuncts(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.And):
        return [*_conjuncts(node.left), *_conjuncts(node.right)]
    return [node]


ALWAYS = Gate("every torch (no version gate)", lambda torch: True)


def read_gate(source: bytes | None) -> Gate:
    if source is None:
        return Gate("no torch: this vllm has no layers/conv.py")
    try:
        module, forward = forward_cuda(source)
    except UNREADABLE as exc:
        return _unknown(f"conv.py does not parse ({' '.join(str(exc).split())[:80]})")
    if forward is None:
        return Gate("conv.py has no Conv3dLayer.forward_cuda")
    if not runs_mulmat(forward):
        return Gate("no torch: forward_cuda always calls F.conv3d", lambda torch: False)
    gates = [
        node
        for node in nodes(forward, cst.If)
        if any(dotted(c) == "self.enable_linear" for c in _conjuncts(node.test))
    ]
    if len(gates) != 1:
        if not gates and not nodes(forward, cst.If):
            return ALWAYS
        return _unknown(f"{len(gates)} `if self.enable_linear ...` branches")
    torch_terms = [c for c in _conjuncts(gates[0].test) if dotted(c) != "self.enable_linear"]
    if not torch_terms:
        return ALWAYS
    if len(torch_terms) != 1:
        return _unknown(module.code_for_node(gates[0].test))
    term = torch_terms[0]
    if isinstance(term, cst.BooleanOperation) and term.lpar:
        term = term.with_changes(lpar=[], rpar=[])
    return _torch_gate(term, module)
