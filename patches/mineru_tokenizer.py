"""mineru-vl-utils: survive vllm >= 0.11, whose tokenizer has no ``get_lora_tokenizer()``.

vllm#24078 removed the tokenizer group, so on every vllm >= 0.11.0 (and ROCm source builds
after it) ``VllmAsyncEngineVlmClient.__init__`` dies with AttributeError. mineru-vl-utils
0.1.14 guards the call with ``hasattr``; 0.1.1 to 0.1.13 do not, which is harmless where the
installed vllm's tokenizer group still defines the method (read from vllm's code, as a ROCm
build's version string says little). The rewrite wraps each
unguarded ``X = Y.get_lora_tokenizer()`` in ``try/except AttributeError: X = Y``.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from rocmfix.errors import AnchorNotFoundError
from rocmfix.patch import Classification, CodeShape, MinerUUse, Patch, TargetContext
from rocmfix.rewrite import UNREADABLE, call_name, dotted, has_marker, marker_line, nodes, parse

_METHOD = "get_lora_tokenizer"
_MARKER_TEXT = "vllm >= 0.11 has no get_lora_tokenizer() (vllm#24078); use the tokenizer itself"


def _is_call(node: cst.CSTNode | None) -> bool:
    name = call_name(node)
    return (
        isinstance(node, cst.Call)
        and not node.args
        and name is not None
        and name.endswith(f".{_METHOD}")
    )


def _unguarded_assign(node: cst.SimpleStatementLine) -> cst.Assign | None:
    """``X = Y.get_lora_tokenizer()`` as a whole statement, else None."""
    if len(node.body) != 1:
        return None
    assign = node.body[0]
    if isinstance(assign, cst.Assign) and len(assign.targets) == 1 and _is_call(assign.value):
        return assign
    return None


def _try_guard(node: cst.Try) -> str:
    catches = any(dotted(h.type) == "AttributeError" for h in node.handlers)
    if not catches:
        return ""
    return "ours" if has_marker(node.leading_lines) else "try"


def _if_guard(node: cst.If) -> str:
    test = node.test
    if (
        isinstance(test, cst.Call)
        and dotted(test.func) == "hasattr"
        and len(test.args) == 2
        and isinstance(test.args[1].value, cst.SimpleString)
        and test.args[1].value.evaluated_value == _METHOD
    ):
        return "hasattr"
    return ""


@dataclass
class _Call:
    guard: str  # "none", "hasattr", "try", "ours"
    statement: bool  # the call is a whole ``X = Y.get_lora_tokenizer()`` statement


class _Guard(cst.CSTTransformer):
    """Every get_lora_tokenizer() call, with the innermost guard around it (what classify
    reads), and each unguarded ``X = Y.get_lora_tokenizer()`` statement wrapped in
    ``try/except AttributeError: X = Y`` (what transform writes)."""

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        # The enclosing statements that guard a call (empty string: no guard).
        self.stack: list[str] = []
        self.calls: list[_Call] = []
        self.rewritten = 0
        self._statement = False

    @property
    def innermost(self) -> str:
        return next((g for g in reversed(self.stack) if g), "none")

    def visit_Try(self, node: cst.Try) -> None:
        self.stack.append(_try_guard(node))

    def leave_Try(self, original_node: cst.Try, updated_node: cst.Try) -> cst.Try:
        self.stack.pop()
        return updated_node

    def visit_If(self, node: cst.If) -> None:
        self.stack.append(_if_guard(node))

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        self.stack.pop()
        return updated_node

    def visit_Call(self, node: cst.Call) -> None:
        if _is_call(node):
            self.calls.append(_Call(guard=self.innermost, statement=self._statement))

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._statement = _unguarded_assign(node) is not None

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement:
        assign = _unguarded_assign(updated_node)
        if assign is None or self.innermost != "none":
            return updated_node
        call = assign.value
        assert isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
        target = self.module.code_for_node(assign.targets[0].target)
        owner = self.module.code_for_node(call.func.value)
        fallback = cst.parse_statement(
            f"{target} = {owner}\n", config=self.module.config_for_parsing
        )
        self.rewritten += 1
        return cst.Try(
            body=cst.IndentedBlock(body=[updated_node.with_changes(leading_lines=[])]),
            handlers=[
                cst.ExceptHandler(
                    type=cst.Name("AttributeError"),
                    body=cst.IndentedBlock(body=[fallback]),
                )
            ],
            leading_lines=[*updated_node.leading_lines, marker_line(_MARKER_TEXT)],
        )


# Where vllm's tokenizer group (the object whose get_lora_tokenizer() the client calls) has
# lived: one module until vllm#24078 removed it in 0.11, a package before that.
TOKENIZER_GROUP = (
    "vllm:vllm/transformers_utils/tokenizer_group.py",
    "vllm:vllm/transformers_utils/tokenizer_group/tokenizer_group.py",
    "vllm:vllm/transformers_utils/tokenizer_group/base_tokenizer_group.py",
)


def _vllm_has_method(ctx: TargetContext) -> str | None:
    """The vllm file that still defines get_lora_tokenizer(), read from the installed vllm;
    None when none does (or vllm is not installed)."""
    for rel in TOKENIZER_GROUP:
        data = ctx.related.get(rel)
        if data is None:
            continue
        try:
            module = parse(data)
        except UNREADABLE:
            continue
        if any(f.name.value == _METHOD for f in nodes(module, cst.FunctionDef)):
            return rel.split(":", 1)[1]
    return None


def _vllm_note(ctx: TargetContext) -> tuple[str, ...]:
    installed = ctx.versions.get("vllm")
    if installed is None:
        return ("vllm is not installed here; the crash needs vllm >= 0.11",)
    return (
        f"vllm {installed} is installed and defines no get_lora_tokenizer() (read from its "
        "code): without the patch the VLM client crashes",
    )


def classify(module: cst.Module, ctx: TargetContext) -> Classification:
    finder = _Guard(module)
    module.visit(finder)
    calls = finder.calls
    if not calls:
        return Classification(CodeShape.FIXED_UPSTREAM, "never calls get_lora_tokenizer()")
    guards = {call.guard for call in calls}
    if guards == {"ours"}:
        return Classification(CodeShape.PATCHED, "rocmfix's try/except guard is in place")
    if guards <= {"hasattr", "try", "ours"}:
        how = (
            "guards the call with hasattr() (upstream fix, mineru-vl-utils 0.1.14+)"
            if "hasattr" in guards
            else "already guards the call with try/except AttributeError (a hand edit)"
        )
        return Classification(CodeShape.FIXED_UPSTREAM, how)
    if all(call.statement for call in calls if call.guard == "none"):
        defined = _vllm_has_method(ctx)
        if defined is not None:
            return Classification(
                CodeShape.FIXED_UPSTREAM,
                f"calls tokenizer.get_lora_tokenizer() unguarded, which vllm "
                f"{ctx.versions.get('vllm')} still defines ({defined}): harmless here; "
                "vllm >= 0.11 would crash it",
            )
        return Classification(
            CodeShape.NEEDS_PATCH,
            "calls tokenizer.get_lora_tokenizer() unguarded; vllm >= 0.11 raises AttributeError",
            _vllm_note(ctx),
        )
    return Classification(
        CodeShape.UNKNOWN, "calls get_lora_tokenizer() in a form rocmfix does not know"
    )


def transform(module: cst.Module) -> cst.Module:
    guard = _Guard(module)
    new = module.visit(guard)
    if not guard.rewritten:
        raise AnchorNotFoundError("no unguarded `X = Y.get_lora_tokenizer()` statement")
    return new


PATCH = Patch(
    id="mineru-tokenizer",
    summary="Fall back to the plain tokenizer when vllm has no get_lora_tokenizer()",
    distribution="mineru-vl-utils",
    package="mineru_vl_utils",
    path="mineru_vl_utils/vlm_client/vllm_async_engine_client.py",
    classify=classify,
    transform=transform,
    missing_reason="mineru-vl-utils {version} has no vllm async engine client",
    known=(
        "0.1.0: no async engine client (not needed)",
        "0.1.1-0.1.13: unguarded call (needed where the installed vllm's code defines no "
        "get_lora_tokenizer(): vllm >= 0.11)",
        "0.1.14 and later: hasattr guard upstream (not needed)",
    ),
    related=TOKENIZER_GROUP,
    mineru=MinerUUse(
        "its vllm-async-engine backend",
        imports=("mineru_vl_utils.vlm_client.vllm_async_engine_client",),
        strings=("vllm-async-engine",),
    ),
)
