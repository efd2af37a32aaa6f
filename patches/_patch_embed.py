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

from collections.abc import Callable, Iterable, Sequence

import libcst as cst

from rocmfix import rewrite
from rocmfix.errors import AnchorNotFoundError
from rocmfix.ops import PATCH_EMBED
from rocmfix.patch import Classification, CodeShape, MinerUUse, Patch, TargetContext

FUNCTION = PATCH_EMBED.function
MARKER = "Conv3d with kernel == stride is a GEMM; MIOpen has no fast kernel"
# MinerU's VLM (MinerU2.5, MinerU2.5-Pro) is a Qwen2-VL: other towers serve other models.
OTHER_MODELS = MinerUUse("MinerU's vision model is a Qwen2-VL; this file serves other models")
# Decides a Conv3dLayer (vllm >= 0.11.1) from the code of its package; see _conv3d_layer.
LayerVerdict = Callable[[TargetContext, str], Classification]


def _proj_constructor(init: cst.FunctionDef) -> cst.Call | None:
    for assign in rewrite.nodes(init, cst.Assign):
        if (
            len(assign.targets) == 1
            and rewrite.dotted(assign.targets[0].target) == "self.proj"
            and isinstance(assign.value, cst.Call)
        ):
            return assign.value
    return None


# A conv constructor's arguments after its two channel counts, in order.
_POSITIONS = ("kernel_size", "stride", "padding", "dilation", "groups", "bias", "padding_mode")
# What else a conv constructor may set, with the values that leave it the plain GEMM the
# kernel computes.
_PLAIN = {"dilation": ("1", "(1, 1, 1)"), "groups": ("1",), "padding_mode": ('"zeros"', "'zeros'")}


def _arg(constructor: cst.Call, name: str) -> cst.BaseExpression | None:
    """A conv constructor's argument ``name``, by keyword or position."""
    found = rewrite.kwarg(constructor, name)
    positional = [a.value for a in constructor.args if a.keyword is None]
    index = 2 + _POSITIONS.index(name)
    return positional[index] if found is None and len(positional) > index else found


def _not_plain(module: cst.Module, constructor: cst.Call) -> str | None:
    """The first argument that makes the conv more than a patch GEMM, if any."""
    for name, plain in _PLAIN.items():
        found = _arg(constructor, name)
        if found is not None and module.code_for_node(found) not in plain:
            return f"{name}={module.code_for_node(found)}"
    return None


def _proj_calls(forward: cst.FunctionDef) -> list[cst.Call]:
    return [c for c in rewrite.nodes(forward, cst.Call) if rewrite.call_name(c) == "self.proj"]


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
        and any(rewrite.dotted(t.target) == arg.value for t in small.targets)
        and _view_args(small.value) == 5
        for line in rewrite.nodes(forward, cst.SimpleStatementLine)
        for small in line.body
    )
    flattened = any(
        isinstance(call.func, cst.Attribute) and call.func.value is proj and _view_args(call) == 2
        for call in rewrite.nodes(forward, cst.Call)
    )
    return viewed and flattened


def classify(
    module: cst.Module,
    ctx: TargetContext,
    class_name: str,
    family: str,
    layer: LayerVerdict | None = None,
) -> Classification:
    cls = rewrite.find_class(module, class_name)
    if cls is None:
        return Classification(CodeShape.UNKNOWN, f"no class {class_name}")
    init, forward = rewrite.find_method(cls, "__init__"), rewrite.find_method(cls, "forward")
    if init is None or forward is None:
        return Classification(CodeShape.UNKNOWN, f"{class_name} has no __init__/forward")
    ours = rewrite.calls(forward, FUNCTION)
    proj_calls = _proj_calls(forward)
    if ours and not proj_calls:
        if rewrite.module_has_marker(module):
            return Classification(CodeShape.PATCHED, f"{FUNCTION} replaces the Conv3d")
        return Classification(
            CodeShape.UNKNOWN, f"{FUNCTION} was put in by hand (the forum recipe, not rocmfix)"
        )
    constructor = _proj_constructor(init)
    kind = rewrite.call_name(constructor) or ""
    if kind.endswith("Linear"):
        return Classification(
            CodeShape.FIXED_UPSTREAM, f"{class_name}.proj is a {kind} already: a GEMM upstream"
        )
    if constructor is None or not (kind.endswith("Conv3d") or kind.endswith("Conv3dLayer")):
        return Classification(
            CodeShape.UNKNOWN, f"{class_name}.proj is not a Conv3d ({kind or '?'})"
        )
    kernel, stride, padding = (_arg(constructor, n) for n in _POSITIONS[:3])
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


def transform(module: cst.Module, class_name: str, kernel_import: str) -> cst.Module:
    cls = rewrite.find_class(module, class_name)
    forward = rewrite.find_method(cls, "forward") if cls is not None else None
    if cls is None or forward is None:
        raise AnchorNotFoundError(f"no {class_name}.forward")
    targets = _proj_calls(forward)
    if len(targets) != 1 or len(targets[0].args) != 1:
        raise AnchorNotFoundError(f"no single self.proj(x) call in {class_name}.forward")
    proj = targets[0]
    args = [
        proj.args[0].with_changes(comma=cst.MaybeSentinel.DEFAULT),
        cst.Arg(cst.parse_expression("self.proj.weight")),
        cst.Arg(cst.parse_expression("self.proj.bias")),
    ]
    new_forward = forward.deep_replace(proj, cst.Call(func=cst.Name(FUNCTION), args=args))
    assert isinstance(new_forward, cst.FunctionDef)
    body = new_forward.body
    assert isinstance(body, cst.IndentedBlock)
    lines = list(body.body)
    first = next(i for i, line in enumerate(lines) if rewrite.calls(line, FUNCTION))
    line = lines[first]
    assert isinstance(line, cst.SimpleStatementLine | cst.BaseCompoundStatement)
    lines[first] = line.with_changes(
        leading_lines=[
            *line.leading_lines,
            rewrite.marker_line(MARKER),
        ]
    )
    new_forward = new_forward.with_changes(body=body.with_changes(body=lines))
    module = rewrite.replace_class(module, cls, rewrite.replace_method(cls, forward, new_forward))
    # Any Exception at the kernel's import (a file another user cannot read, a warning `-W
    # error` turns into one, a broken triton) leaves the stock op the rewritten call replaced:
    # self.proj, a Conv3d whose stride is its kernel, unpadded (what classify admits).
    return rewrite.import_dropped(
        module,
        f"try:\n    from {kernel_import} import {FUNCTION}\n"
        "except Exception:  # the kernel must never break the model's import: the stock op\n"
        f"    def {FUNCTION}(x, weight, bias=None):\n"
        "        import torch.nn.functional as F\n"
        "        return F.conv3d(x, weight, bias, stride=tuple(weight.shape[2:]))\n",
        kernel_import.lstrip(".").rsplit(".", 1)[-1],
        blank=False,
    )


# One target file: (patch id suffix, path, patch-embed class, family, missing reason, known);
# ``known`` may be empty: the plain nn.Conv3d this family builds.
Row = tuple[str, str, str, str, str, tuple[str, ...]]


def in_folder(
    distribution: str, folder: str, rows: Iterable[tuple[str, str, str, str, tuple[str, ...]]]
) -> list[Row]:
    """The rows of files directly in ``folder``, given as (id suffix, file, class, family,
    known)."""
    missing = f"{distribution} {{version}} has no "
    return [(s, f"{folder}/{file}", c, f, missing + file, k) for s, file, c, f, k in rows]


def patch_embed_patches(
    distribution: str,
    kernel_module: str,
    mineru: MinerUUse,
    rows: Iterable[Row],
    layer: LayerVerdict | None = None,
    related: Sequence[str] = (),
) -> tuple[Patch, ...]:
    """One distribution's patch-embed patches, one a row; the first row is MinerU's model
    (``mineru`` runs it), the others serve other models."""

    def patch(index: int, row: Row) -> Patch:
        suffix, path, class_name, family, missing_reason, known = row
        kernel_import = rewrite.relative_import(path, kernel_module)
        return Patch(
            id=f"{distribution}-{suffix}",
            summary=f"Run {class_name}'s Conv3d as a GEMM instead of MIOpen's slow conv",
            distribution=distribution,
            package=distribution,
            path=path,
            classify=lambda module, ctx: classify(module, ctx, class_name, family, layer),
            transform=lambda module: transform(module, class_name, kernel_import),
            missing_reason=missing_reason,
            op=PATCH_EMBED,
            kernel_module=kernel_module,
            known=known or (f"{class_name}: nn.Conv3d(kernel_size=k, stride=k) (needed on ROCm)",),
            related=tuple(related),
            mineru=mineru if index == 0 else OTHER_MODELS,
            focus=class_name,
        )

    return tuple(patch(i, row) for i, row in enumerate(rows))
