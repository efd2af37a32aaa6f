"""MinerU's table models on AMD's ONNX Runtime providers (issue 42, item 2).

MinerU runs its three table models (slanet-plus, the wired-table UNet, the PP-LCNet table
classifier) in ONNX Runtime. It asks for ``CUDAExecutionProvider`` at most, so on AMD they run
on the CPU even where onnxruntime-migraphx or onnxruntime-rocm is installed. MIGraphX runs
the UNet about 20x and the classifier about 12x faster than the CPU, bit-exact
(AIwork4me/MinerU-ROCm, docs/hardware-matrix.md); slanet-plus crashes MIGraphX
(AMDMIGraphX#5078) and keeps what MinerU asked for.

Where MinerU makes a table model's session (read from every wheel, 2.0.0-4.0.12):

- 4.0.5-4.0.12: ``table_ort_session`` in ``mineru/model/runtime/onnx.py`` makes every table
  session.
- 2.7.0-4.0.4: the UNet's in ``OrtInferSession.__init__``
  (``mineru/model/table/rec/unet_table/utils.py``); 2.7.0-4.0.0a5: the classifier's in
  ``PaddleTableClsModel.__init__`` (``mineru/model/table/cls/paddle_table_cls.py``;
  4.0.0a6-4.0.4 make it with ``ort_session``, CPU for every ONNX model, left alone).
- Before 2.7: none of these files.

The rewrite wraps the first ``InferenceSession(model, ...)`` call of that function in
``_rocmfix_table_session``, a function it adds after the module's imports: it asks for
MIGraphX, then ROCm (those the installed onnxruntime lists), then what MinerU asked for; it
logs which providers each model got; anything that goes wrong in it is MinerU's own call.
``MINERU_TABLE_DEVICE=cpu`` (or ``cuda``) keeps MinerU's choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import libcst as cst

from rocmfix.errors import AnchorNotFoundError
from rocmfix.patch import Classification, CodeShape, MinerUUse, Patch, TargetContext
from rocmfix.rewrite import add_helper, calls, find_class, find_function, find_method

HELPER = "_rocmfix_table_session"
SESSION = "InferenceSession"
AMD_PROVIDERS = ("MIGraphXExecutionProvider", "ROCMExecutionProvider")
# The onnxruntime builds that list one of them (each one's get_available_providers(),
# tests/test_mineru_tables.py); all of them install into the same onnxruntime/ folder.
AMD_BUILDS = ("onnxruntime-migraphx", "onnxruntime-rocm")
NO_AMD_BUILD = f"no {' or '.join(AMD_BUILDS)} is installed: the CPU runs MinerU's tables either way"

# Runs in the user's interpreter, inside MinerU's module: standard library and onnxruntime
# only, and every failure of its own is MinerU's stock call.
_CODE = '''
# rocmfix: tables ask for MIGraphX, then ROCm, where onnxruntime lists them (issue 42)
def _rocmfix_table_session(session_type, model_path, *args, **kwargs):
    """MinerU's table session with the AMD providers first; slanet-plus keeps MinerU's
    (it crashes MIGraphX: AMDMIGraphX#5078). Any failure here is MinerU's own call."""
    stock = kwargs.get("providers")
    asked = stock
    name = str(model_path)
    try:
        import os
        import onnxruntime

        name = os.path.basename(name)
        setting = os.environ.get("MINERU_TABLE_DEVICE", "").strip().lower()
        if "slanet" not in name.lower() and setting not in ("cpu", "cuda"):
            rest = list(stock) if stock else ["CPUExecutionProvider"]
            have = [p if isinstance(p, str) else p[0] for p in rest]
            available = onnxruntime.get_available_providers()
            amd = ["MIGraphXExecutionProvider", "ROCMExecutionProvider"]
            first = [p for p in amd if p in available and p not in have]
            asked = first + rest if first else stock
    except Exception:
        asked = stock
    try:
        from loguru import logger as log
    except Exception:
        import logging

        log = logging.getLogger("rocmfix")
    if asked is stock:
        session = session_type(model_path, *args, **kwargs)
    else:
        try:
            session = session_type(model_path, *args, **dict(kwargs, providers=asked))
        except Exception as exc:
            log.warning("rocmfix: table model %s: %s failed (%s); MinerU's own providers"
                        % (name, asked[0], exc))
            session = session_type(model_path, *args, **kwargs)
    try:
        log.info("rocmfix: table model %s runs on %s" % (name, session.get_providers()))
    except Exception:
        pass
    return session
'''


@dataclass(frozen=True)
class Site:
    """Where one MinerU layout makes a table session: a function, or ``Class.method``."""

    scope: str
    what: str


def _scope(module: cst.Module, scope: str) -> cst.FunctionDef | None:
    owner, _, name = scope.rpartition(".")
    if owner:
        cls = find_class(module, owner)
        return find_method(cls, name) if cls is not None else None
    return find_function(module, name)


def _session_call(function: cst.FunctionDef) -> cst.Call | None:
    """The first ``InferenceSession(model, ...)`` call with the model passed first."""
    for call in calls(function, SESSION):
        args = call.args
        if args and args[0].keyword is None and not any(a.star for a in args):
            return call
    return None


def _amd_note(ctx: TargetContext) -> str | None:
    found = [f"{name} {ctx.versions[name]}" for name in AMD_BUILDS if name in ctx.versions]
    if not found:
        return None
    return f"{', '.join(found)} installed: its MIGraphX/ROCm provider can run the tables"


def classify(site: Site, module: cst.Module, ctx: TargetContext) -> Classification:
    function = _scope(module, site.scope)
    if function is not None and calls(function, HELPER):
        if find_function(module, HELPER) is not None:
            return Classification(CodeShape.PATCHED, f"{site.scope} asks for MIGraphX/ROCm")
        return Classification(CodeShape.UNKNOWN, f"calls {HELPER} but does not define it")
    note = _amd_note(ctx)
    if note is None:
        # One wording for every site, so that status and apply say it once.
        return Classification(CodeShape.FIXED_UPSTREAM, NO_AMD_BUILD)
    if function is None:
        return Classification(
            CodeShape.FIXED_UPSTREAM,
            f"has no {site.scope}: this MinerU makes its table sessions elsewhere",
        )
    call = _session_call(function)
    if call is None:
        through = " (it calls table_ort_session)" if calls(function, "table_ort_session") else ""
        return Classification(
            CodeShape.FIXED_UPSTREAM, f"makes no InferenceSession of its own{through}"
        )
    code = module.code_for_node(function)
    if any(provider in code for provider in AMD_PROVIDERS):
        return Classification(
            CodeShape.FIXED_UPSTREAM, f"{site.scope} already asks for an AMD provider"
        )
    return Classification(
        CodeShape.NEEDS_PATCH,
        f"{site.scope} asks for CUDA or the CPU only: on AMD the CPU runs {site.what}",
        (note,),
    )


def transform(site: Site, module: cst.Module) -> cst.Module:
    function = _scope(module, site.scope)
    call = _session_call(function) if function is not None else None
    if call is None or find_function(module, HELPER) is not None:
        raise AnchorNotFoundError(f"no InferenceSession(model, ...) call in {site.scope}")
    # The session type goes first, laid out as the model argument was (its own line in a call
    # written one argument a line).
    comma = call.args[0].comma
    if not isinstance(comma, cst.Comma):
        comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    first = cst.Arg(call.func, comma=comma)
    new = module.deep_replace(
        call, call.with_changes(func=cst.Name(HELPER), args=[first, *call.args])
    )
    assert isinstance(new, cst.Module)
    return add_helper(new, _CODE)


# (patch id, file, site, releases that have it)
FILES = (
    (
        "mineru-table-session",
        "mineru/model/runtime/onnx.py",
        Site("table_ort_session", "the table models"),
        "4.0.5-4.0.12: table_ort_session, every table model's session",
    ),
    (
        "mineru-table-unet",
        "mineru/model/table/rec/unet_table/utils.py",
        Site("OrtInferSession.__init__", "the wired-table UNet"),
        "2.7.0-4.0.4: OrtInferSession makes the UNet's session",
    ),
    (
        "mineru-table-cls",
        "mineru/model/table/cls/paddle_table_cls.py",
        Site("PaddleTableClsModel.__init__", "the table classifier"),
        "2.7.0-4.0.0a5: PaddleTableClsModel makes the classifier's session",
    ),
)

PATCHES = tuple(
    Patch(
        id=patch_id,
        summary="Run MinerU's table models on MIGraphX/ROCm where onnxruntime has them",
        distribution="mineru",
        package="mineru",
        path=path,
        classify=partial(classify, site),
        transform=partial(transform, site),
        missing_reason="mineru {version} has no " + path,
        known=(known, "slanet-plus keeps MinerU's providers (AMDMIGraphX#5078)"),
        mineru=MinerUUse(f"{site.what} (ONNX)", own=True),
    )
    for patch_id, path, site, known in FILES
)
