"""What the three vllm patch-embed patches share: the Conv3d-as-GEMM rewrite.

Every Qwen-VL vision tower in vllm embeds patches with a Conv3d whose kernel equals its
stride (2, 14, 14): really a GEMM of the flattened patches with the flattened weight. MIOpen
has no fast kernel for it and spends seconds a call (seed 000; pytorch#146998). The rewrite
replaces the one ``self.proj(x)`` call in ``forward`` with
``triton_conv3d_patchify(x, self.proj.weight, self.proj.bias)`` from a module dropped beside
the file, and leaves ``__init__`` (and so checkpoint loading) alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst
from packaging.version import InvalidVersion, Version

from rocmfix.errors import AnchorNotFoundError
from rocmfix.patch import Classification, Patch, Scheme, Shape, TargetContext, Template
from rocmfix.rewrite import (
    call_name,
    calls,
    dotted,
    find_class,
    find_method,
    insert_after_last_import,
    marker_line,
    module_has_marker,
    nodes,
    replace_class,
    replace_method,
    statement,
)

KERNELS = "qwen2_vl_vision_kernels"
FUNCTION = "triton_conv3d_patchify"
DROP = f"vllm/model_executor/models/{KERNELS}.py"

SCHEMES = (
    Scheme(
        "gemm",
        "Triton GEMM over the flattened patches",
        (Template("patch_embed_gemm.py", DROP),),
        needs_triton=True,
    ),
    Scheme(
        "direct",
        "Triton, one program per output element; a slow parity oracle",
        (Template("patch_embed_direct.py", DROP),),
        needs_triton=True,
    ),
    Scheme(
        "linear",
        "F.linear on the flattened patches: the vendor BLAS, no Triton",
        (Template("patch_embed_linear.py", DROP),),
    ),
)


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


def _kwarg(call: cst.Call, name: str) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg.value
    return None


def _torch_condition(vllm: str) -> tuple[str, tuple[int, ...], tuple[int, ...] | None]:
    """When Conv3dLayer.forward_cuda takes its matmul path, by vllm release (a hint only:
    the condition lives in vllm/model_executor/layers/conv.py, see shared notes)."""
    try:
        release = Version(vllm).release
    except InvalidVersion:
        release = (0, 11, 1)
    if release >= (0, 19):
        return "torch >= 2.9", (2, 9, 0), None
    if release >= (0, 14):
        return "torch 2.9.0 or 2.9.1", (2, 9, 0), (2, 9, 2)
    return "torch 2.9.0 exactly", (2, 9, 0), (2, 9, 1)


def _eager_takes_matmul(ctx: TargetContext) -> tuple[bool | None, str]:
    condition, low, high = _torch_condition(ctx.version)
    if ctx.torch is None:
        return None, f"eager mode runs a matmul only with {condition}; no torch found here"
    try:
        torch = Version(ctx.torch.version)
    except InvalidVersion:
        return None, f"eager mode runs a matmul only with {condition}; torch {ctx.torch.version}?"
    # A pre-release such as 2.9.0.dev2025 sorts below 2.9.0, as vllm's own check does.
    ok = torch >= Version(".".join(map(str, low))) and (
        high is None or torch < Version(".".join(map(str, high)))
    )
    return ok, f"eager mode runs a matmul only with {condition}; this is torch {torch}"


def _classify(
    module: cst.Module, ctx: TargetContext, class_name: str, family: str
) -> Classification:
    cls = find_class(module, class_name)
    if cls is None:
        return Classification(Shape.UNKNOWN, f"no class {class_name}")
    init, forward = find_method(cls, "__init__"), find_method(cls, "forward")
    if init is None or forward is None:
        return Classification(Shape.UNKNOWN, f"{class_name} has no __init__/forward")
    ours = calls(forward, FUNCTION)
    proj_calls = [c for c in nodes(forward, cst.Call) if call_name(c) == "self.proj"]
    if ours and not proj_calls:
        if module_has_marker(module):
            return Classification(Shape.PATCHED, f"{FUNCTION} replaces the Conv3d")
        return Classification(
            Shape.UNKNOWN, f"{FUNCTION} was put in by hand (the forum recipe, not rocmfix)"
        )
    constructor = _proj_constructor(init)
    kind = call_name(constructor) or ""
    if kind.endswith("Linear"):
        return Classification(
            Shape.FIXED_UPSTREAM, f"proj is a {kind} already (vllm#27418): a GEMM upstream"
        )
    if constructor is None or not (kind.endswith("Conv3d") or kind.endswith("Conv3dLayer")):
        return Classification(Shape.UNKNOWN, f"{class_name}.proj is not a Conv3d ({kind or '?'})")
    kernel, stride = _kwarg(constructor, "kernel_size"), _kwarg(constructor, "stride")
    if (
        kernel is None
        or stride is None
        or module.code_for_node(kernel) != module.code_for_node(stride)
    ):
        return Classification(Shape.UNKNOWN, "the Conv3d's stride is not its kernel size")
    if len(proj_calls) != 1:
        return Classification(
            Shape.UNKNOWN, f"forward calls self.proj {len(proj_calls)} times, not once"
        )
    if kind.endswith("Conv3dLayer"):
        matmul, why = _eager_takes_matmul(ctx)
        notes = (
            "vllm's default compiled mode already runs Conv3dLayer as a matmul "
            "(custom ops are off under inductor)",
            f"eager mode (enforce_eager) or custom_ops all/+conv3d calls F.conv3d, "
            f"MIOpen on ROCm, unless the torch check passes: {why}",
            "compilation_config={'custom_ops': ['-conv3d']} is the zero-patch workaround",
        )
        if matmul:
            return Classification(
                Shape.FIXED_UPSTREAM,
                f"Conv3dLayer runs a matmul in every mode here ({why})",
                notes,
            )
        return Classification(
            Shape.NEEDS_PATCH,
            f"{family}: Conv3dLayer still calls F.conv3d in eager mode; the patch makes it a "
            "GEMM in every mode",
            notes,
        )
    return Classification(
        Shape.NEEDS_PATCH,
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


def _transform(module: cst.Module, class_name: str) -> cst.Module:
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
    imported = statement(module, f"from .{KERNELS} import {FUNCTION}\n")
    imported = imported.with_changes(
        leading_lines=[marker_line(f"{KERNELS} was dropped here by rocmfix; revert removes it")]
    )
    return insert_after_last_import(module, imported)


def patch_embed_patch(
    *, id: str, file: str, class_name: str, family: str, missing_reason: str, known: Sequence[str]
) -> Patch:
    def classify(module: cst.Module, ctx: TargetContext) -> Classification:
        return _classify(module, ctx, class_name, family)

    def transform(module: cst.Module, scheme: str | None) -> cst.Module:
        return _transform(module, class_name)

    return Patch(
        id=id,
        summary=f"Run {class_name}'s Conv3d as a GEMM instead of MIOpen's slow conv",
        distribution="vllm",
        package="vllm",
        path=f"vllm/model_executor/models/{file}",
        classify=classify,
        transform=transform,
        missing_reason=missing_reason,
        schemes=SCHEMES,
        known=tuple(known),
        needs_rocm=True,
    )
