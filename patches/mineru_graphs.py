"""MinerU's PaddleOCR predictors, replayed as CUDA/HIP graphs per input shape.

Once rocmfix's kernel routes make the slow ops fast, MinerU's small models are bound by
Python and kernel launches, not kernels: on an H100, PP-OCRv6 det tiny does 1.6-1.9 ms of GPU
work in a 4.5 ms eager forward, rec small 1.0 ms in 4-8 ms. The predictors call each model
in one place per path, ``X = self.net(inp)`` under ``torch.inference_mode()``; the rewrite
sends that call through the dropped runner (templates/rocmfix_graphs.py: a capture per input
shape after an eager warm-up, replays after, the stock call for anything else), keeping the
stock statement as the ``else`` of a guard on the runner having imported::

    if _rocmfix_graph_forward is not None:
        outputs = _rocmfix_graph_forward(self.net, inp)
    else:
        outputs = self.net(inp)

Every ``<target> = self.net(...)`` statement of the file is routed (predict_rec.py's CAN
branch passes a list: the runner takes nested tensors too); ``self.net.backbone(...)`` and
other calls stay. The predictors have the same shape in every MinerU release, under three
folders (read from the wheels 2.0.6-4.0.12): 4.0.x ``mineru/model/_internal/pytorchocr/infer/``,
2.6-3.x ``mineru/model/utils/tools/infer/``, 2.0-2.5
``mineru/model/ocr/paddleocr2pytorch/tools/infer/``. One patch per file and folder; a folder
the installed MinerU does not have reads ``not-needed``.

Graphs are no ROCm gap: the patch applies on any torch (a CPU input runs the stock call).
MinerU is AGPL-3.0: rocmfix patches the user's installed files and ships none of their code.
"""

from __future__ import annotations

from functools import partial

import libcst as cst

from rocmfix.errors import AnchorNotFoundError
from rocmfix.patch import Classification, CodeShape, MinerUUse, Patch, TargetContext
from rocmfix.rewrite import (
    call_name,
    calls,
    insert_after_last_import,
    marker_line,
    module_has_marker,
    relative_import,
    statement,
)

RUNNER = "rocmfix_graphs.py"
LOCAL = "_rocmfix_graph_forward"
CALLEE = "self.net"
WHY = "CUDA/HIP graph replay per input shape (rocmfix_graphs)"

# (patch id prefix, folder of the predictors, the MinerU releases that have it)
LAYOUTS = (
    ("mineru-ocr", "mineru/model/_internal/pytorchocr/infer", "4.0.x"),
    ("mineru-utils-ocr", "mineru/model/utils/tools/infer", "2.6-3.x"),
    ("mineru-paddle-ocr", "mineru/model/ocr/paddleocr2pytorch/tools/infer", "2.0-2.5"),
)
MISSING = (
    "mineru {version} keeps its OCR predictors in another folder (rocmfix reads "
    + ", ".join(f"{releases}'s" for _, _, releases in LAYOUTS)
    + ")"
)
# (model, predictor class, what MinerU runs it for)
FILES = (
    ("det", "TextDetector", "PP-OCR text detection (TextDetector): OCR, every tier"),
    ("rec", "TextRecognizer", "PP-OCR text recognition (TextRecognizer): OCR, every tier"),
    ("cls", "TextClassifier", "PP-OCR text-line orientation (TextClassifier): OCR"),
)


def _site(line: cst.CSTNode) -> cst.Call | None:
    """The call of ``<target> = self.net(...)``, else None."""
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return None
    assign = line.body[0]
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return None
    call = assign.value
    if not isinstance(call, cst.Call) or call_name(call) != CALLEE:
        return None
    return call


class _Sites(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found = 0

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        self.found += _site(node) is not None
        return False


def _count(module: cst.Module) -> int:
    sites = _Sites()
    module.visit(sites)
    return sites.found


def classify(cls_name: str, module: cst.Module, ctx: TargetContext) -> Classification:
    if calls(module, LOCAL):
        if module_has_marker(module):
            return Classification(CodeShape.PATCHED, f"{CALLEE}(...) goes through {RUNNER}")
        return Classification(CodeShape.UNKNOWN, f"{LOCAL} is there, but not from rocmfix")
    found = _count(module)
    if found:
        times = "once" if found == 1 else f"{found} times"
        return Classification(
            CodeShape.NEEDS_PATCH,
            f"{cls_name} calls {CALLEE}(...) {times}: a graph replay per input shape "
            "removes the launch and Python cost",
        )
    if [c for c in calls(module, "net") if call_name(c) == CALLEE]:
        return Classification(
            CodeShape.UNKNOWN, f"{CALLEE}(...) is called, but not as `x = {CALLEE}(...)`"
        )
    return Classification(CodeShape.FIXED_UPSTREAM, f"this version never calls {CALLEE}(...)")


class _Route(cst.CSTTransformer):
    def __init__(self, module: cst.Module) -> None:
        self.module = module
        self.routed = 0

    def leave_SimpleStatementLine(
        self, old: cst.SimpleStatementLine, new: cst.SimpleStatementLine
    ) -> cst.BaseStatement:
        call = _site(new)
        if call is None:
            return new
        assign = new.body[0]
        assert isinstance(assign, cst.Assign)
        graphed = call.with_changes(
            func=cst.Name(LOCAL), args=[cst.Arg(value=call.func), *call.args]
        )
        guard = statement(self.module, f"if {LOCAL} is not None:\n    pass\nelse:\n    pass\n")
        assert isinstance(guard, cst.If) and isinstance(guard.orelse, cst.Else)
        routed = new.with_changes(body=[assign.with_changes(value=graphed)], leading_lines=[])
        stock = new.with_changes(leading_lines=[])
        self.routed += 1
        return guard.with_changes(
            leading_lines=[*new.leading_lines, marker_line(WHY)],
            body=guard.body.with_changes(body=[routed]),
            orelse=guard.orelse.with_changes(body=guard.orelse.body.with_changes(body=[stock])),
        )


def transform(path: str, kernel_module: str, module: cst.Module) -> cst.Module:
    if calls(module, LOCAL):
        raise AnchorNotFoundError(f"{LOCAL} is already called")
    router = _Route(module)
    routed = module.visit(router)
    if not router.routed:
        raise AnchorNotFoundError(f"no `x = {CALLEE}(...)` statement")
    runner = relative_import(path, kernel_module)
    imported = statement(
        module,
        f"try:\n    from {runner} import forward as {LOCAL}\n"
        # OSError too: a runner file another user cannot read must not break the import.
        f"except (ImportError, OSError):\n    {LOCAL} = None\n",
    )
    imported = imported.with_changes(
        leading_lines=[
            cst.EmptyLine(),
            marker_line(f"{runner.lstrip('.')} was dropped here by rocmfix; revert removes it"),
        ]
    )
    return insert_after_last_import(routed, imported)


def _patch(prefix: str, folder: str, releases: str, model: str, cls_name: str, what: str) -> Patch:
    path = f"{folder}/predict_{model}.py"
    kernel_module = f"{folder}/{RUNNER}"
    return Patch(
        id=f"{prefix}-{model}-graphs",
        summary=f"Replay predict_{model}.py's forward as CUDA/HIP graphs",
        distribution="mineru",
        package="mineru",
        path=path,
        classify=partial(classify, cls_name),
        transform=partial(transform, path, kernel_module),
        # One wording for all nine, so that status and apply group them on one line.
        missing_reason=MISSING,
        kernel_module=kernel_module,
        runner=RUNNER,
        known=(f"{cls_name}: <target> = {CALLEE}(...)",),
        mineru=MinerUUse(what, own=True, small_model=True),
    )


PATCHES = tuple(_patch(*layout, *row) for layout in LAYOUTS for row in FILES)
