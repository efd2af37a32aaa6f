"""The VLM's vision tower on vLLM's Triton attention, through MinerU's per-device engine
settings (issue 42, item 1).

vLLM's ``platforms/rocm.py::get_vit_attn_backend`` falls back to ``TORCH_SDPA`` on RDNA
(gfx11/gfx12) unless flash-attn's Triton-AMD backend is installed and enabled, and SDPA runs
its math path there (:mod:`rocmfix.ops.vit_attention`). vLLM takes the tower's backend as an
engine argument, ``mm_encoder_attn_backend`` (``--mm-encoder-attn-backend``); MinerU passes
per-device engine settings from ``_get_device_config`` (keyed by ``MINERU_VLLM_DEVICE``,
which ROCm users leave unset, so it gives them none) through ``mod_kwargs_by_device_type``,
which adds each one only where the user's own arguments lack it. So the least invasive
route is MinerU's file, not vLLM's selector: the rewrite wraps the value
``_get_device_config`` returns in ``_rocmfix_vit_attention``, which on a ROCm torch adds
``mm_encoder_attn_backend="TRITON_ATTN"``. The user's own backend argument, and
``FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE`` (their choice of flash-attn's Triton path), win.

Where MinerU has the function (read from the wheels): 4.0.x ``mineru/model/vlm/engine_utils.py``,
2.7.6-3.4.x ``mineru/backend/vlm/utils.py``. What decides, read from the installed vLLM's code,
never its version label: its ``EngineArgs`` has ``mm_encoder_attn_backend`` (0.11.2 on), its
ROCm platform lists ``TRITON_ATTN`` among the tower's backends (0.18 on; 0.13-0.14 do not), and
its own choice still ends in ``TORCH_SDPA``. And it is applied only where ``rocmfix doctor``
measured ``triton-attn`` faster than vLLM's stock choice on this GPU (``Patch.realizes``).
"""

from __future__ import annotations

import libcst as cst

from rocmfix import rewrite
from rocmfix.errors import AnchorNotFoundError
from rocmfix.ops import vit_attention
from rocmfix.patch import Classification, CodeShape, MinerUUse, Patch, TargetContext

HELPER = "_rocmfix_vit_attention"
FUNCTION = "_get_device_config"
ROCM_PY = "vllm:vllm/platforms/rocm.py"
ARG_UTILS = "vllm:vllm/engine/arg_utils.py"
BACKEND = vit_attention.TRITON_BACKEND

# Runs in the user's interpreter, inside MinerU's module: standard library and torch only,
# and any failure of its own leaves MinerU's settings as they were.
_CODE = f'''
# rocmfix: the vision tower's attention on vLLM's {BACKEND} (issue 42)
def {HELPER}(config):
    """MinerU's per-device vLLM settings with mm_encoder_attn_backend={BACKEND}, which
    `rocmfix doctor` measured faster than vLLM's own choice (TORCH_SDPA) on this GPU. The
    user's own backend argument and FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE win; off ROCm
    nothing changes. `rocmfix revert` removes this."""
    try:
        import os

        import torch

        flash_triton = os.environ.get("FLASH_ATTENTION_TRITON_AMD_ENABLE", "")
        if getattr(torch.version, "hip", None) and flash_triton.upper() != "TRUE":
            config = dict(config or {{}})
            config.setdefault("mm_encoder_attn_backend", "{BACKEND}")
    except Exception:
        pass
    return config
'''


def _returns(function: cst.FunctionDef) -> list[cst.Return]:
    return [r for r in rewrite.nodes(function, cst.Return) if r.value is not None]


def vllm_choice(ctx: TargetContext) -> tuple[bool, str]:
    """Whether the installed vLLM takes the tower's backend as an engine argument, offers
    TRITON_ATTN for it on ROCm, and picks TORCH_SDPA itself on RDNA; and why not."""
    rocm, args = ctx.related.get(ROCM_PY), ctx.related.get(ARG_UTILS)
    version = ctx.versions.get("vllm")
    if version is None:
        return False, "no vllm here: MinerU's VLM runs another engine"
    for name, data in ((ROCM_PY, rocm), (ARG_UTILS, args)):
        if data is None:
            return False, f"vllm {version} has no {name.removeprefix('vllm:vllm/')}"
    assert rocm is not None and args is not None
    if b"mm_encoder_attn_backend" not in args:
        return False, f"vllm {version} takes no mm_encoder_attn_backend engine argument"
    try:
        platform = rewrite.parse(rocm)
    except rewrite.UNREADABLE:
        return False, "vllm's platforms/rocm.py does not parse"
    cls = rewrite.find_class(platform, "RocmPlatform")
    supported = rewrite.find_method(cls, "get_supported_vit_attn_backends") if cls else None
    chooser = rewrite.find_method(cls, "get_vit_attn_backend") if cls else None
    if supported is None or chooser is None:
        return False, f"vllm {version}'s ROCm platform chooses no vision-tower backend"
    offered = {
        str(rewrite.dotted(a)).rpartition(".")[2] for a in rewrite.nodes(supported, cst.Attribute)
    }
    if BACKEND not in offered:
        return False, f"vllm {version} offers no {BACKEND} for the vision tower on ROCm"
    last = _returns(chooser)[-1:] or None
    if last is None or not str(rewrite.dotted(last[0].value)).endswith(".TORCH_SDPA"):
        return False, f"vllm {version}'s own choice for the vision tower is no longer TORCH_SDPA"
    return True, (
        f"vllm {version} gives RDNA's vision tower TORCH_SDPA (its ROCm get_vit_attn_backend) "
        f"and MinerU passes no mm_encoder_attn_backend; {BACKEND} selects vLLM's Triton kernel"
    )


def classify(module: cst.Module, ctx: TargetContext) -> Classification:
    function = rewrite.find_function(module, FUNCTION)
    if function is not None and rewrite.calls(function, HELPER):
        if rewrite.find_function(module, HELPER) is not None:
            return Classification(CodeShape.PATCHED, f"{FUNCTION} selects {BACKEND} on ROCm")
        return Classification(CodeShape.UNKNOWN, f"calls {HELPER} but does not define it")
    if function is None or not _returns(function):
        return Classification(
            CodeShape.UNKNOWN, f"has no {FUNCTION} returning MinerU's per-device settings"
        )
    if "mm_encoder_attn_backend" in module.code_for_node(function):
        return Classification(
            CodeShape.FIXED_UPSTREAM, "MinerU already sets mm_encoder_attn_backend"
        )
    needed, reason = vllm_choice(ctx)
    if not needed:
        return Classification(CodeShape.FIXED_UPSTREAM, reason)
    return Classification(CodeShape.NEEDS_PATCH, reason)


class _Wrap(cst.CSTTransformer):
    def __init__(self, function: cst.FunctionDef) -> None:
        self.function = function

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return node is self.function  # a nested function's returns are its own

    def leave_Return(self, original_node: cst.Return, updated_node: cst.Return) -> cst.Return:
        if updated_node.value is None:
            return updated_node
        call = cst.Call(cst.Name(HELPER), [cst.Arg(updated_node.value)])
        return updated_node.with_changes(value=call)


def transform(module: cst.Module) -> cst.Module:
    function = rewrite.find_function(module, FUNCTION)
    if (
        function is None
        or not _returns(function)
        or rewrite.find_function(module, HELPER) is not None
    ):
        raise AnchorNotFoundError(f"no {FUNCTION} returning a value")
    wrapped = function.visit(_Wrap(function))
    assert isinstance(wrapped, cst.FunctionDef)
    new = module.with_changes(body=[wrapped if n is function else n for n in module.body])
    return rewrite.add_helper(new, _CODE)


def _patch(patch_id: str, path: str, known: str) -> Patch:
    return Patch(
        id=patch_id,
        summary=f"Run the VLM's vision-tower attention on vLLM's {BACKEND} where measured faster",
        distribution="mineru",
        package="mineru",
        path=path,
        classify=classify,
        transform=transform,
        missing_reason="mineru {version} has no " + path,
        op=vit_attention.OP,
        realizes="triton-attn",
        known=(known, "needs a vllm whose ROCm platform offers TRITON_ATTN (0.18 and later)"),
        related=(ROCM_PY, ARG_UTILS),
        mineru=MinerUUse("its vllm engines' settings (MinerU2.5's vision tower)", own=True),
    )


PATCHES = (
    _patch(
        "mineru-vit-attention",
        "mineru/model/vlm/engine_utils.py",
        "4.0.x: _get_device_config in model/vlm/engine_utils.py",
    ),
    _patch(
        "mineru-vit-attention-3",
        "mineru/backend/vlm/utils.py",
        "2.7.6-3.4.x: _get_device_config in backend/vlm/utils.py",
    ),
)
