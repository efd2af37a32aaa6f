"""DocLayout-YOLO: route the weight-shared dilated convs around MIOpen's naive kernel.

``DilatedBlock.dilated_conv`` runs ``act(bn(F.conv2d(x, w, padding=d*(k//2), dilation=d)))``
with one weight for every dilation. MIOpen has no fast solver for dilation > 1 and falls
back to a naive kernel (layout at 1.6 it/s instead of 15+ on a 7900 XTX). The rewrite adds a
guarded import of a dropped module and, for GPU inputs only, calls it with the block's ``bn``
and ``act``: the Triton kernel applies an eval-mode BatchNorm and SiLU as it stores (BN cannot
be folded into the weight, which every dilation shares; the phase split calls the modules
after its conv). CPU inputs take the stock line, unchanged.
"""

from __future__ import annotations

import libcst as cst

from rocmfix import rewrite
from rocmfix.errors import AnchorNotFoundError
from rocmfix.ops import DILATED_CONV
from rocmfix.patch import Classification, CodeShape, MinerUUse, Patch, TargetContext

from ._conv_sites import import_entry, local, only_arg, routed

CLASS = "DilatedBlock"
METHOD = "dilated_conv"
LOCAL = local(DILATED_CONV)
PATH = "doclayout_yolo/nn/modules/g2l_crm.py"
KERNELS = "doclayout_yolo/nn/modules/g2l_crm_triton.py"
WHY = "MIOpen runs dilation > 1 on a naive kernel; GPU inputs go around it"


def _conv_call(node: cst.CSTNode) -> cst.Call | None:
    """The one ``F.conv2d(x, weight, ..., padding=..., dilation=...)`` call, else None."""
    found = [
        c
        for c in rewrite.calls(node, "conv2d")
        if {a.keyword.value for a in c.args if a.keyword} >= {"padding", "dilation"}
        and len([a for a in c.args if a.keyword is None]) == 2
    ]
    return found[0] if len(found) == 1 else None


def _act_bn(
    line: cst.SimpleStatementLine, conv: cst.Call
) -> tuple[cst.Call, cst.BaseExpression, cst.BaseExpression] | None:
    """(the outer call, act, bn) where ``line`` is ``return act(bn(<conv>))`` with plain names
    or attributes for act and bn, else None."""
    ret = line.body[0]
    outer = ret.value if isinstance(ret, cst.Return) else None
    inner = only_arg(outer) if isinstance(outer, cst.Call) else None
    if not isinstance(inner, cst.Call) or only_arg(inner) is not conv:
        return None
    assert isinstance(outer, cst.Call)
    if rewrite.dotted(outer.func) is None or rewrite.dotted(inner.func) is None:
        return None
    return outer, outer.func, inner.func


def classify(module: cst.Module, ctx: TargetContext) -> Classification:
    cls = rewrite.find_class(module, CLASS)
    method = rewrite.find_method(cls, METHOD) if cls is not None else None
    if method is None:
        return Classification(CodeShape.UNKNOWN, f"no {CLASS}.{METHOD}")
    says = "GPU inputs bypass the dilated F.conv2d"
    if (ours := routed(module, method, LOCAL, says)) is not None:
        return ours
    if _conv_call(method) is None:
        return Classification(
            CodeShape.UNKNOWN,
            f"{METHOD} has no single F.conv2d(..., padding=, dilation=) call "
            "(a hand edit such as the forum's Triton hook?)",
        )
    return Classification(
        CodeShape.NEEDS_PATCH,
        "weight-shared dilated convs; MIOpen falls back to a naive kernel for dilation > 1",
    )


def transform(module: cst.Module) -> cst.Module:
    cls = rewrite.find_class(module, CLASS)
    method = rewrite.find_method(cls, METHOD) if cls is not None else None
    if cls is None or method is None:
        raise AnchorNotFoundError(f"no {CLASS}.{METHOD}")
    if rewrite.calls(method, LOCAL):
        raise AnchorNotFoundError(f"{METHOD} already calls {LOCAL}")
    body = method.body
    assert isinstance(body, cst.IndentedBlock)
    lines = list(body.body)
    index = next(
        (
            i
            for i, line in enumerate(lines)
            if isinstance(line, cst.SimpleStatementLine)
            and isinstance(line.body[0], cst.Return)
            and _conv_call(line) is not None
        ),
        None,
    )
    if index is None:
        raise AnchorNotFoundError(f"no `return ...F.conv2d(..., dilation=...)` in {METHOD}")
    original = lines[index]
    assert isinstance(original, cst.SimpleStatementLine)
    conv = _conv_call(original)
    assert conv is not None
    x, weight = (a.value for a in conv.args if a.keyword is None)
    code = module.code_for_node
    given = {a.keyword.value: code(a.value) for a in conv.args if a.keyword}  # both, by _conv_call
    call = f"{LOCAL}({code(x)}, {code(weight)}, {given['dilation']}, {given['padding']}"
    wrapped = _act_bn(original, conv)
    # `return act(bn(conv))`, as every release writes it: the dropped kernel gets both modules
    # and runs an eval-mode BatchNorm and SiLU in its store (it calls any other module
    # itself). Any other line keeps its wrapping and routes the conv alone.
    target: cst.BaseExpression = wrapped[0] if wrapped else conv
    replacement = cst.parse_expression(
        f"{call}, bn={code(wrapped[2])}, act={code(wrapped[1])})" if wrapped else f"{call})"
    )
    routed = original.deep_replace(target, replacement)
    assert isinstance(routed, cst.SimpleStatementLine)
    guard = rewrite.statement(module, f"if {LOCAL} is not None and {code(x)}.is_cuda:\n    pass\n")
    assert isinstance(guard, cst.If)
    guard = guard.with_changes(
        body=guard.body.with_changes(body=[routed.with_changes(leading_lines=[])]),
        leading_lines=[
            *original.leading_lines,
            rewrite.marker_line(WHY),
        ],
    )
    lines[index : index + 1] = [guard, original.with_changes(leading_lines=[])]
    new_method = method.with_changes(body=body.with_changes(body=lines))
    module = rewrite.replace_class(module, cls, rewrite.replace_method(cls, method, new_method))
    return import_entry(module, PATH, KERNELS, DILATED_CONV)


PATCH = Patch(
    id="doclayout-dilated-conv",
    summary="Run DilatedBlock's dilated convs without MIOpen's naive fallback",
    distribution="doclayout-yolo",
    package="doclayout_yolo",
    path=PATH,
    classify=classify,
    transform=transform,
    missing_reason="doclayout-yolo {version} has no g2l_crm.py",
    op=DILATED_CONV,
    kernel_module=KERNELS,
    known=("0.0.2b1, 0.0.3, 0.0.4: one byte-identical g2l_crm.py (needed on ROCm)",),
    # MinerU 2.x's pipeline backend; MinerU 3.0 replaced it with PP-DocLayoutV2.
    mineru=MinerUUse("its pipeline backend's layout model", imports=("doclayout_yolo",)),
)
