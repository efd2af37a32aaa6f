"""What every patch-embed patch shares (vllm's and transformers' Qwen-VL vision towers): the
Conv3d-as-GEMM classification and rewrite.

Every Qwen-VL vision tower embeds patches with a Conv3d whose kernel equals its stride
(2, 14, 14): really a GEMM of the flattened patches with the flattened weight. The rewrite
replaces the one ``self.proj(x)`` call in the class's ``forward`` with
``triton_conv3d_patchify(x, self.proj.weight, self.proj.bias)`` from the op's kernel module,
dropped into the package, and leaves ``__init__`` (and so the parameters, the state-dict keys
and checkpoint loading) alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import libcst as cst

from rocmfix.errors import AnchorNotFoundError
from rocmfix.ops import PATCH_EMBED
from rocmfix.patch import Classification, CodeShape, MinerUUse, Patch, TargetContext
from rocmfix.rewrite import (
    call_name,
    calls,
    dotted,
    find_class,
    find_method,
    insert_after_last_import,
    kwarg,
    marker_line,
    module_has_marker,
    nodes,
    relative_import,
    replace_class,
    replace_method,
    statement,
)

FUNCTION = "triton_conv3d_patchify"
# MinerU's VLM (MinerU2.5, MinerU2.5-Pro) is a Qwen2-VL: other towers serve other models.
OTHER_MODELS = MinerUUse("MinerU's vision model is a Qwen2-VL; this file serves other models")
# Decides a Conv3dLayer (vllm >= 0.11.1) from the code of its package; see _vllm_conv_gate.
LayerVerdict = Callable[[TargetContext, str], Classification]


def _proj_constructor(init: cst.FunctionDef) -> cst.Call | None:
    for line in nodes(init, cst.SimpleStatementLine):
        for small in line.body:
            if (
                isinstance(small, cst.Assign)
                and len(small.targets) == 1
                and dotted(small.targets[0].target) == "self.proj"
                and isinstance(small.value, cst.Call)
            ):
                return small.value
    return None


def _conv_args(constructor: cst.Call) -> tuple[cst.BaseExpression | None, ...]:
    """(kernel_size, stride, padding) of a conv constructor, by keyword or position."""
    positional = [a.value for a in constructor.args if a.keyword is None]

    def arg(name: str, index: int) -> cst.BaseExpression | None:
        found = kwarg(constructor, name)
        if found is None and len(positional) > index:
            return positional[index]
        return found

    return arg("kernel_size", 2), arg("stride", 3), arg("padding", 4)


# What else a conv constructor may set, with the values that leave it the plain GEMM the
# kernel computes (dilation, groups: positions 5 and 6).
_PLAIN = {"dilation": ("1", "(1, 1, 1)"), "groups": ("1",), "padding_mode": ('"zeros"', "'zeros'")}


def _not_plain(module: cst.Module, constructor: cst.Call) -> str | None:
    """The first argument that makes the conv more than a patch GEMM, if any."""
    positional = [a.value for a in constructor.args if a.keyword is None]
    for index, name in ((5, "dilation"), (6, "groups"), (7, "bias"), (8, "padding_mode")):
        found = kwarg(constructor, name)
        if found is None and len(positional) > index:
            found = positional[index]
        if found is not None and name in _PLAIN and module.code_for_node(found) not in _PLAIN[name]:
            return f"{name}={module.code_for_node(found)}"
    return None


def _view_args(node: cst.BaseExpression) -> int | None:
    """The argument count of ``<expr>.view(...)`` or ``.reshape(...)``, else None."""
    if (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in ("view", "reshape")
    ):
        return len(node.args)
    return None


def _on_viewed_patches(forward: cst.FunctionDef, proj: cst.Call) -> bool:
    """Whether ``self.proj`` runs on the input viewed as ``[L, C, T, P, P]`` (possibly cast
    with ``.to(...)``) and its result is viewed back to ``[L, N]``: what makes it a GEMM of
    pre-cut patches, not a conv over a whole video."""
    arg = proj.args[0].value
    if (
        isinstance(arg, cst.Call)
        and isinstance(arg.func, cst.Attribute)
        and arg.func.attr.value == "to"
    ):
        arg = arg.func.value
    if not isinstance(arg, cst.Name):
        return False
    viewed = any(
        isinstance(small, cst.Assign)
        and any(dotted(t.target) == arg.value for t in small.targets)
        and _view_args(small.value) == 5
        for line in nodes(forward, cst.SimpleStatementLine)
        for small in line.body
    )
    flattened = any(
        isinstance(call.func, cst.Attribute) and call.func.value is proj and _view_args(call) == 2
        for call in nodes(forward, cst.Call)
    )
    return viewed and flattened


def classify(
    module: cst.Module,
    ctx: TargetContext,
    class_name: str,
    family: str,
    layer: LayerVerdict | None = None,
) -> Classification:
    cls = find_class(module, class_name)
    if cls is None:
        return Classification(CodeShape.UNKNOWN, f"no class {class_name}")
    init, forward = find_method(cls, "__init__"), find_method(cls, "forward")
    if init is None or forward is None:
        return Classification(CodeShape.UNKNOWN, f"{class_name} has no __init__/forward")
    ours = calls(forward, FUNCTION)
    proj_calls = [c for c in nodes(forward, cst.Call) if call_name(c) == "self.proj"]
    if ours and not proj_calls:
        if module_has_marker(module):
            return Classification(CodeShape.PATCHED, f"{FUNCTION} replaces the Conv3d")
        return Classification(
            CodeShape.UNKNOWN, f"{FUNCTION} was put in by hand (the forum recipe, not rocmfix)"
        )
    constructor = _proj_constructor(init)
    kind = call_name(constructor) or ""
    if kind.endswith("Linear"):
        return Classification(
            CodeShape.FIXED_UPSTREAM, f"{class_name}.proj is a {kind} already: a GEMM upstream"
        )
    if constructor is None or not (kind.endswith("Conv3d") or kind.endswith("Conv3dLayer")):
        return Classification(
            CodeShape.UNKNOWN, f"{class_name}.proj is not a Conv3d ({kind or '?'})"
        )
    kernel, stride, padding = _conv_args(constructor)
    if (
        kernel is None
        or stride is None
        or module.code_for_node(kernel) != module.code_for_node(stride)
    ):
        return Classification(CodeShape.UNKNOWN, "the Conv3d's stride is not its kernel size")
    if padding is not None and module.code_for_node(padding) not in ("0", "(0, 0, 0)"):
        return Classification(CodeShape.UNKNOWN, "the Conv3d is padded: not a plain patch GEMM")
    unusual = _not_plain(module, constructor)
    if unusual is not None:
        return Classification(CodeShape.UNKNOWN, f"the Conv3d sets {unusual}: not a plain GEMM")
    if len(proj_calls) != 1 or len(proj_calls[0].args) != 1:
        return Classification(
            CodeShape.UNKNOWN, f"forward calls self.proj {len(proj_calls)} times, not once on x"
        )
    if not _on_viewed_patches(forward, proj_calls[0]):
        return Classification(
            CodeShape.UNKNOWN,
            "forward does not run self.proj on patches viewed as [L, C, T, P, P] and back to "
            "[L, N]: not a plain patch GEMM",
        )
    if kind.endswith("Conv3dLayer"):
        if layer is None:
            return Classification(CodeShape.UNKNOWN, f"{kind} outside vllm")
        return layer(ctx, family)
    return Classification(
        CodeShape.NEEDS_PATCH,
        f"{family}: nn.Conv3d patch embed; MIOpen has no fast kernel for it (~12 s a call)",
    )


class _ReplaceProj(cst.CSTTransformer):
    def __init__(self, target: cst.Call) -> None:
        self.target = target

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node is not self.target:
            return updated_node
        return cst.Call(
            func=cst.Name(FUNCTION),
            args=[
                updated_node.args[0].with_changes(comma=cst.MaybeSentinel.DEFAULT),
                cst.Arg(cst.parse_expression("self.proj.weight")),
                cst.Arg(cst.parse_expression("self.proj.bias")),
            ],
        )


def transform(module: cst.Module, class_name: str, kernel_import: str) -> cst.Module:
    cls = find_class(module, class_name)
    forward = find_method(cls, "forward") if cls is not None else None
    if cls is None or forward is None:
        raise AnchorNotFoundError(f"no {class_name}.forward")
    targets = [c for c in nodes(forward, cst.Call) if call_name(c) == "self.proj"]
    if len(targets) != 1 or len(targets[0].args) != 1:
        raise AnchorNotFoundError(f"no single self.proj(x) call in {class_name}.forward")
    new_forward = forward.visit(_ReplaceProj(targets[0]))
    assert isinstance(new_forward, cst.FunctionDef)
    body = new_forward.body
    assert isinstance(body, cst.IndentedBlock)
    lines = list(body.body)
    first = next(i for i, line in enumerate(lines) if calls(line, FUNCTION))
    line = lines[first]
    assert isinstance(line, cst.SimpleStatementLine | cst.BaseCompoundStatement)
    lines[first] = line.with_changes(
        leading_lines=[
            *line.leading_lines,
            marker_line("Conv3d with kernel == stride is a GEMM; MIOpen has no fast kernel"),
        ]
    )
    new_forward = new_forward.with_changes(body=body.with_changes(body=lines))
    module = replace_class(module, cls, replace_method(cls, forward, new_forward))
    # Any Exception at the kernel's import (a file another user cannot read, a warning `-W
    # error` turns into one, a broken triton) leaves the stock op the rewritten call replaced:
    # self.proj, a Conv3d whose stride is its kernel, unpadded (what classify admits).
    imported = statement(
        module,
        f"try:\n    from {kernel_import} import {FUNCTION}\n"
        "except Exception:  # the kernel must never break the model's import: the stock op\n"
        f"    def {FUNCTION}(x, weight, bias=None):\n"
        "        import torch.nn.functional as F\n"
        "        return F.conv3d(x, weight, bias, stride=tuple(weight.shape[2:]))\n",
    )
    kernel = kernel_import.lstrip(".").rsplit(".", 1)[-1]
    imported = imported.with_changes(
        leading_lines=[marker_line(f"{kernel} was dropped here by rocmfix; revert removes it")]
    )
    return insert_after_last_import(module, imported)


def patch_embed_patch(
    *,
    id: str,
    distribution: str,
    package: str,
    path: str,
    kernel_module: str,
    class_name: str,
    family: str,
    missing_reason: str,
    known: Sequence[str],
    layer: LayerVerdict | None = None,
    related: Sequence[str] = (),
    mineru: MinerUUse | None = None,
) -> Patch:
    kernel_import = relative_import(path, kernel_module)

    def classify_file(module: cst.Module, ctx: TargetContext) -> Classification:
        return classify(module, ctx, class_name, family, layer)

    def transform_file(module: cst.Module) -> cst.Module:
        return transform(module, class_name, kernel_import)

    return Patch(
        id=id,
        summary=f"Run {class_name}'s Conv3d as a GEMM instead of MIOpen's slow conv",
        distribution=distribution,
        package=package,
        path=path,
        classify=classify_file,
        transform=transform_file,
        missing_reason=missing_reason,
        op=PATCH_EMBED,
        kernel_module=kernel_module,
        known=tuple(known),
        related=tuple(related),
        mineru=mineru,
        focus=class_name,
    )
