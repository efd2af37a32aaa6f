"""MinerU's PaddleOCR predictors, PP-DocLayoutV2 and PP-FormulaNet's encoder, replayed as
CUDA/HIP graphs per input shape.

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

PP-DocLayoutV2 (MinerU 3.0+ layout): ``LAYOUT_PATCH`` makes transformers'
``modeling_pp_doclayout_v2.py`` capturable (its host values kept on the device) and routes its
backbone's call; ``MINERU_LAYOUT`` routes MinerU's call of the whole detector. PP-FormulaNet's
encoder: ``FORMULA_PATCH`` (its decoder is autoregressive and stays eager).

Graphs are no ROCm gap: the patch applies on any torch (a CPU input runs the stock call).
MinerU is AGPL-3.0: rocmfix patches the user's installed files and ships none of their code.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from functools import partial
from typing import Any

import libcst as cst

from rocmfix.errors import AnchorNotFoundError
from rocmfix.ops import Scheme
from rocmfix.patch import Classification, CodeShape, MinerUUse, Patch, TargetContext
from rocmfix.rewrite import (
    call_name,
    calls,
    dotted,
    expression,
    find_class,
    import_dropped,
    kwarg,
    marker_line,
    module_has_marker,
    nodes,
    relative_import,
    statement,
)

RUNNER = "rocmfix_graphs.py"
LOCAL = "_rocmfix_graph_forward"
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


@dataclass(frozen=True)
class Caller:
    """Which calls a file's rewrite routes: ``<target> = <callee>(...)`` (or
    ``<callee>(...).<attribute>``) statements, in class ``scope`` only where one is named;
    ``owner`` names the class that makes them, for the reason status shows."""

    owner: str
    callee: str = "self.net"
    scope: str | None = None
    # A distribution the environment must hold: a library's model is replayed for MinerU's
    # use of it, not for every user of the library.
    beside: str | None = None


LINE = cst.SimpleStatementLine


def _site(line: cst.CSTNode, callee: str) -> cst.Call | None:
    """The call of ``<target> = <callee>(...)`` or ``<target> = <callee>(...).attr``."""
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return None
    assign = line.body[0]
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return None
    value = assign.value
    call = value.value if isinstance(value, cst.Attribute) else value
    if not isinstance(call, cst.Call) or call_name(call) != callee:
        return None
    return call


def _sites(caller: Caller, module: cst.Module) -> set[cst.SimpleStatementLine]:
    """The statements the rewrite routes (:class:`_Route`), from the tree's one walk: each
    ``<target> = <callee>(...)`` of the caller's class itself (not of a class inside it), or
    of the whole module where the caller names no class."""
    lines = nodes(module, LINE)
    if caller.scope is not None:
        classes = [cls for cls in nodes(module, cst.ClassDef) if cls.name.value == caller.scope]
        inner = {n for cls in classes for c in nodes(cls, cst.ClassDef)[1:] for n in nodes(c, LINE)}
        lines = [line for cls in classes for line in nodes(cls, LINE) if line not in inner]
    return {line for line in lines if _site(line, caller.callee) is not None}


def classify(caller: Caller, module: cst.Module, ctx: TargetContext) -> Classification:
    callee = caller.callee
    if calls(module, LOCAL):
        if module_has_marker(module):
            return Classification(CodeShape.PATCHED, f"{callee}(...) goes through {RUNNER}")
        return Classification(CodeShape.UNKNOWN, f"{LOCAL} is there, but not from rocmfix")
    if caller.beside is not None and caller.beside not in ctx.versions:
        return Classification(
            CodeShape.FIXED_UPSTREAM,
            f"no {caller.beside} here: rocmfix replays {caller.owner}'s call for "
            f"{caller.beside} only",
        )
    found = len(_sites(caller, module))
    if found:
        times = "once" if found == 1 else f"{found} times"
        return Classification(
            CodeShape.NEEDS_PATCH,
            f"{caller.owner} calls {callee}(...) {times}: a graph replay per input shape "
            "removes the launch and Python cost",
        )
    if caller.scope is not None and find_class(module, caller.scope) is None:
        return Classification(CodeShape.FIXED_UPSTREAM, f"this version has no {caller.scope}")
    if [c for c in calls(module, callee.rsplit(".", 1)[-1]) if call_name(c) == callee]:
        return Classification(
            CodeShape.UNKNOWN, f"{callee}(...) is called, but not as `x = {callee}(...)`"
        )
    return Classification(CodeShape.FIXED_UPSTREAM, f"this version never calls {callee}(...)")


class _Route(cst.CSTTransformer):
    """Every statement :func:`_sites` finds, guarded by the runner's import (what transform
    writes, and classify counts)."""

    def __init__(self, caller: Caller, module: cst.Module, bucket: str) -> None:
        self.caller = caller
        self.module = module
        self.bucket = bucket
        self.sites = _sites(caller, module)
        self.routed = 0

    def leave_SimpleStatementLine(
        self, old: cst.SimpleStatementLine, new: cst.SimpleStatementLine
    ) -> cst.BaseStatement:
        call = _site(new, self.caller.callee) if old in self.sites else None
        if call is None:
            return new
        assign = new.body[0]
        assert isinstance(assign, cst.Assign)
        told = expression(self.module, f"f({self.bucket})")
        bucket = list(told.args) if self.bucket and isinstance(told, cst.Call) else []
        graphed: cst.BaseExpression = call.with_changes(
            func=cst.Name(LOCAL), args=[cst.Arg(value=call.func), *call.args, *bucket]
        )
        value = assign.value
        if isinstance(value, cst.Attribute):
            graphed = value.with_changes(value=graphed)
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


CONSTANT = "_rocmfix_graph_constant"
HOST_WHY = "the host value kept on the device (rocmfix_graphs.constant): a graph can read it"


def _host_scalar(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Integer | cst.Name) or dotted(node) is not None


class _HostValues(cst.CSTTransformer):
    """Host values a forward copies into device tensors, made device tensors once instead
    (``rocmfix_graphs.constant``), in the classes ``scopes`` names. A copy from the host waits
    for it, which a capture refuses. Two shapes, the ones PP-DocLayoutV2's forward has:

    - ``torch.tensor(self.config.<name>, ...)``: a config list, sent to the device per call;
    - ``t[i, j] = <name or constant>``, every index an integer or a tensor (no slice): a
      0-dim view (``copy_`` from the host) or ``index_put_`` (which copies its value to the
      device). A slice makes it a fill and a single boolean mask a masked fill, which do not
      wait: those stay.
    """

    def __init__(self, module: cst.Module, scopes: tuple[str, ...]) -> None:
        self.module = module
        self.scopes = scopes
        self.classes: list[str] = []
        self.kept = 0
        self._before = 0

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.append(node.name.value)

    def leave_ClassDef(self, old: cst.ClassDef, new: cst.ClassDef) -> cst.ClassDef:
        self.classes.pop()
        return new

    def _on(self) -> bool:
        return bool(self.classes) and self.classes[-1] in self.scopes

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._before = self.kept

    def leave_Call(self, old: cst.Call, new: cst.Call) -> cst.Call:
        first = new.args[0] if new.args else None
        if not self._on() or call_name(new) != "torch.tensor" or first is None:
            return new
        if first.keyword is not None or not (dotted(first.value) or "").startswith("self.config."):
            return new
        self.kept += 1
        return new.with_changes(func=cst.Name(CONSTANT))

    def leave_Assign(self, old: cst.Assign, new: cst.Assign) -> cst.Assign:
        target = new.targets[0].target if len(new.targets) == 1 else None
        if not self._on() or not isinstance(target, cst.Subscript):
            return new
        tensor = dotted(target.value)
        elements = [e.slice for e in target.slice]
        if tensor is None or len(elements) < 2 or not _host_scalar(new.value):
            return new
        for element in elements:
            if not isinstance(element, cst.Index) or dotted(element.value) == "None":
                return new
            if isinstance(element.value, cst.Ellipsis):
                return new
        self.kept += 1
        value = self.module.code_for_node(new.value)
        kept = f"{CONSTANT}({value}, dtype={tensor}.dtype, device={tensor}.device)"
        return new.with_changes(value=expression(self.module, kept))

    def leave_SimpleStatementLine(
        self, old: cst.SimpleStatementLine, new: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        if self.kept == self._before:
            return new
        return new.with_changes(leading_lines=[*new.leading_lines, marker_line(HOST_WHY)])


def transform(
    caller: Caller, path: str, scopes: tuple[str, ...], module: cst.Module, bucket: str = ""
) -> cst.Module:
    """Route the caller's statements through the runner dropped beside ``path`` (passing it
    the ``bucket`` argument, ``name=value``, where one is given) and, in the classes
    ``scopes`` names, keep host values on the device (:class:`_HostValues`)."""
    if calls(module, LOCAL):
        raise AnchorNotFoundError(f"{LOCAL} is already called")
    router = _Route(caller, module, bucket)
    routed = module.visit(router)
    if not router.routed:
        raise AnchorNotFoundError(f"no `x = {caller.callee}(...)` statement")
    runner = relative_import(path, _runner_path(path))
    host = _HostValues(module, scopes)
    routed = routed.visit(host)
    # The stock torch.tensor where the runner is missing: the same values, as stock makes them.
    fallback = f"    from torch import tensor as {CONSTANT}\n" if host.kept else ""
    also = f", constant as {CONSTANT}" if host.kept else ""
    return import_dropped(
        routed,
        f"try:\n    from {runner} import forward as {LOCAL}{also}\n"
        # OSError too: a runner file another user cannot read must not break the import.
        f"except (ImportError, OSError):\n    {LOCAL} = None\n{fallback}",
        runner.lstrip("."),
    )


def _runner_path(path: str) -> str:
    return posixpath.join(posixpath.dirname(path), RUNNER)


def _graphs(
    patch_id: str, path: str, caller: Caller, scopes: tuple[str, ...] = (), **fields: Any
) -> Patch:
    """A patch that routes ``caller``'s statements of ``path`` through the runner it drops
    beside that file."""
    distribution = fields.pop("distribution", "mineru")
    return Patch(
        id=patch_id,
        distribution=distribution,
        package=distribution,
        path=path,
        classify=partial(classify, caller),
        transform=partial(transform, caller, path, scopes),
        kernel_module=_runner_path(path),
        runner=RUNNER,
        **fields,
    )


def _patch(prefix: str, folder: str, releases: str, model: str, cls_name: str, what: str) -> Patch:
    path, caller = f"{folder}/predict_{model}.py", Caller(cls_name)
    exact = partial(transform, caller, path, ())
    bucket = BUCKETS.get(model)
    return _graphs(
        f"{prefix}-{model}-graphs",
        path,
        caller,
        settings=(
            ((EXACT, exact), (bucket[1], partial(transform, caller, path, (), bucket=bucket[0])))
            if bucket
            else ()
        ),
        summary=f"Replay predict_{model}.py's forward as CUDA/HIP graphs",
        # One wording for all nine, so that status and apply group them on one line.
        missing_reason=MISSING,
        known=(f"{cls_name}: <target> = self.net(...)",),
        mineru=MinerUUse(what, own=True, small_model=True),
    )


# The bucket schemes (issue 41): shapes that repeat, so that graphs replay, at the cost of
# exactness; docs/performance-graphs.md measures what each does to the text with real weights.
# rec: MinerU pads each batch of lines to its widest line, so rec sees a new width nearly
# every batch. The runner pads the width with zeros (what MinerU pads with) up to a multiple
# of BUCKET and returns the whole output (MinerU's CTC decoder reads any length). 320: MinerU's
# narrowest batch (most batches) stays as it is, and its widest, 2560, makes 8 widths in all,
# the runner's graphs a model (bench/shape_repeat.py weighed 64 to 512).
# det: MinerU 4 gives det each layout block's crop, a shape of its own nearly every call. The
# runner pads both sides, repeating the crop's white edge, up to multiples of BUCKET (the long
# side is at most 960: 9 shapes) and cuts DB's maps back to the crop's size before MinerU
# scales its boxes.
BUCKET = 320
EXACT = Scheme("exact", "a graph per input shape, as MinerU pads it (exact)", "exact", "")
BUCKETS = {
    "rec": (
        f"rocmfix_width_bucket={BUCKET}",
        Scheme(
            "bucket",
            f"rec's batch width padded up to a multiple of {BUCKET}: fewer shapes, more "
            "replays, not bit for bit (docs/performance-graphs.md)",
            f"width bucket {BUCKET}",
            "",
        ),
    ),
    "det": (
        f"rocmfix_size_bucket={BUCKET}",
        Scheme(
            "bucket",
            f"det's crop padded up to multiples of {BUCKET}, its maps cut back: fewer shapes, "
            "more replays, not bit for bit (docs/performance-graphs.md)",
            f"size bucket {BUCKET}",
            "",
        ),
    ),
}

OCR = tuple(_patch(*layout, *row) for layout in LAYOUTS for row in FILES)

# PP-DocLayoutV2 (MinerU 3.0+ layout). Its forward copies host values into device tensors
# (``spatial_shapes[level, 0] = height`` in PPDocLayoutV2Model, ``torch.tensor(self.config.
# class_order, ...)`` in the detector, ``input_ids[rows, end] = self.config.end_token_id`` in
# the reading-order head), which a capture refuses; the rewrite keeps those values on the
# device (``_HostValues``), so that MinerU's call of the whole detector can be replayed
# (``MINERU_LAYOUT``). The HGNetV2 backbone, which ``PPDocLayoutV2ConvEncoder.forward`` calls
# as ``self.model(pixel_values).feature_maps``, goes through the runner too: inside the whole
# detector's graph it runs as it is; where that capture fails, it is replayed on its own.
LAYOUT = "transformers/models/pp_doclayout_v2"
LAYOUT_HOST = (
    "PPDocLayoutV2Model",
    "PPDocLayoutV2ForObjectDetection",
    "PPDocLayoutV2ReadingOrder",
)
BACKBONE = Caller(
    "PPDocLayoutV2ConvEncoder", "self.model", scope="PPDocLayoutV2ConvEncoder", beside="mineru"
)
LAYOUT_PATCH = _graphs(
    "transformers-pp-doclayout-v2-graphs",
    f"{LAYOUT}/modeling_pp_doclayout_v2.py",
    BACKBONE,
    LAYOUT_HOST,
    summary="Make PP-DocLayoutV2 capturable; replay its backbone as CUDA/HIP graphs",
    distribution="transformers",
    missing_reason="transformers {version} has no PP-DocLayoutV2 model",
    known=("PPDocLayoutV2ConvEncoder: <target> = self.model(...).feature_maps",),
    mineru=MinerUUse(
        "PP-DocLayoutV2 layout, every tier",
        imports=("transformers.models.pp_doclayout_v2",),
        names=("PPDocLayoutV2ForObjectDetection",),
        small_model=True,
    ),
)

# transformers' eager attention masks (masking_utils.eager_mask, 5.3.0-5.20.1) make their 0
# as ``torch.tensor(0.0, device=mask.device, dtype=dtype)``: a copy from the host per mask,
# which a capture refuses ("Cannot copy between CPU and CUDA tensors during CUDA graph capture
# unless the CPU tensor is pinned"). PP-DocLayoutV2's reading-order head runs eager attention
# only (up to 5.23; 5.24 adds SDPA) and builds that mask every forward, so MinerU's capture of
# the whole detector failed there (an H100, transformers 5.17.0). 5.20.2 makes it on the device
# (``torch.zeros(())``); the rewrite does the same for these releases: ``torch.full((), v,
# ...)``, the same number and dtype, no copy. Beside MinerU only, as the detector's rewrite.
MASKS_PATH = "transformers/masking_utils.py"
MASK_WHY = "the mask's constant made on the device, not copied from the host: a graph can hold it"


def _host_number(call: cst.Call) -> bool:
    """``torch.tensor(<number>, ..., device=...)``: a number sent to a device per call."""
    first = call.args[0] if call.args else None
    if call_name(call) != "torch.tensor" or first is None or first.keyword is not None:
        return False
    value = first.value
    if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus):
        value = value.expression
    return isinstance(value, cst.Float | cst.Integer) and kwarg(call, "device") is not None


class _DeviceNumbers(cst.CSTTransformer):
    def __init__(self) -> None:
        self.made = 0
        self._before = 0

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._before = self.made

    def leave_Call(self, old: cst.Call, new: cst.Call) -> cst.Call:
        if not _host_number(new):
            return new
        self.made += 1
        shape = cst.Arg(cst.Tuple([]))
        return new.with_changes(func=cst.parse_expression("torch.full"), args=[shape, *new.args])

    def leave_SimpleStatementLine(
        self, old: cst.SimpleStatementLine, new: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        if self.made == self._before:
            return new
        return new.with_changes(leading_lines=[*new.leading_lines, marker_line(MASK_WHY)])


def classify_masks(module: cst.Module, ctx: TargetContext) -> Classification:
    if module_has_marker(module):
        return Classification(CodeShape.PATCHED, "its masks make their constants on the device")
    if "mineru" not in ctx.versions:
        return Classification(
            CodeShape.FIXED_UPSTREAM,
            "no mineru here: rocmfix makes PP-DocLayoutV2 capturable for mineru only",
        )
    found = len([c for c in calls(module, "tensor") if _host_number(c)])
    if not found:
        return Classification(CodeShape.FIXED_UPSTREAM, "eager_mask makes no host copy")
    return Classification(
        CodeShape.NEEDS_PATCH,
        f"{found} torch.tensor(<number>, device=...) in its masks: a copy from the host per "
        "mask, which PP-DocLayoutV2's graph capture refuses (its reading order's eager mask)",
    )


def transform_masks(module: cst.Module) -> cst.Module:
    made = _DeviceNumbers()
    out = module.visit(made)
    if not made.made:
        raise AnchorNotFoundError("no torch.tensor(<number>, device=...) in the masks")
    return out


MASKS_PATCH = Patch(
    id="transformers-eager-mask-graphs",
    summary="Make transformers' eager masks capturable (PP-DocLayoutV2's reading order)",
    distribution="transformers",
    package="transformers",
    path=MASKS_PATH,
    classify=classify_masks,
    transform=transform_masks,
    missing_reason="transformers {version} has no masking_utils.py",
    known=(
        "5.3.0-5.20.1: eager_mask's torch.tensor(0.0, device=...) (needed)",
        "5.20.2 and later: torch.zeros((), device=...) upstream (not needed)",
    ),
    mineru=LAYOUT_PATCH.mineru,
)

# MinerU's own call of the whole detector, ``outputs = self.model(pixel_values=...)`` in
# PPDocLayoutV2LayoutModel.batch_predict (under torch.no_grad(), one 800x800 size). Replayed
# only where the transformers file above keeps its host values on the device; else the
# capture fails once, says so, and the detector runs eager (its backbone replayed).
DETECTOR = Caller("PPDocLayoutV2LayoutModel", "self.model", scope="PPDocLayoutV2LayoutModel")
MINERU_LAYOUT = _graphs(
    "mineru-layout-graphs",
    "mineru/model/layout/pp_doclayoutv2.py",
    DETECTOR,
    summary="Replay PP-DocLayoutV2 (MinerU's layout) as CUDA/HIP graphs",
    missing_reason="mineru {version} runs its layout model from another file",
    known=("PPDocLayoutV2LayoutModel: <target> = self.model(...)",),
    mineru=MinerUUse(
        "PP-DocLayoutV2 layout (the whole detector), every tier", own=True, small_model=True
    ),
)

# PP-FormulaNet's encoder (MinerU 4.0.x formula recognition): ``x = self.backbone(x)`` in
# BaseModel.forward, the one place the encoder (PPHGNetV2_B6_Formula for plus-M) is called; its
# output, an OrderedDict of the flattened feature map, is rebuilt as it was made. The decoder
# is autoregressive (a token a step, stopping on the data, up to 2560): it stays eager. The
# encoder's own file (rec_pphgnetv2.py) is ``mineru-ocr-hgnetv2``'s: one patch per file. The
# line is every PaddleOCR model's: where det, rec and cls replay whole, their backbone runs
# inside that graph; where one runs eager (a shape past the caps), its backbone is replayed.
ENCODER = Caller("BaseModel", "self.backbone", scope="BaseModel")
FORMULA_PATCH = _graphs(
    "mineru-formula-encoder-graphs",
    "mineru/model/_internal/pytorchocr/modeling/architectures/base_model.py",
    ENCODER,
    summary="Replay PP-FormulaNet's encoder (BaseModel's backbone call) as CUDA/HIP graphs",
    missing_reason="mineru {version} keeps its PaddleOCR models in another folder (4.0.x's)",
    known=("BaseModel: <target> = self.backbone(...)",),
    mineru=MinerUUse(
        "PP-FormulaNet's encoder (and every PaddleOCR model's backbone call)",
        own=True,
        small_model=True,
    ),
)
PATCHES = (*OCR, LAYOUT_PATCH, MASKS_PATCH, MINERU_LAYOUT, FORMULA_PATCH)
