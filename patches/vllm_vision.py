"""vllm's Qwen-VL vision towers (MinerU2.5 runs on Qwen2-VL): the patch-embed Conv3d as a GEMM.

One row per target file. Up to 0.11.0 the class builds ``nn.Conv3d`` (MIOpen's slow path on
ROCm, always). From 0.11.1 it builds ``Conv3dLayer``, which is a matmul in vllm's default
compiled mode and in eager mode only when ``conv.py``'s torch gate admits the target's torch:
that gate is read from the file (:mod:`._conv3d_layer`), never from vllm's version label.
"""

from __future__ import annotations

from rocmfix.patch import Classification, CodeShape, MinerUUse, TargetContext

from ._conv3d_layer import CONV_PY, read_gate
from ._patch_embed import in_folder, patch_embed_patches

MODELS = "vllm/model_executor/models"
KERNELS = f"{MODELS}/qwen2_vl_vision_kernels.py"
CONV3D_LAYER = (
    "0.11.1 and later: Conv3dLayer (a matmul when compiled; in eager mode only when conv.py's "
    "torch gate admits the target's torch)"
)


def conv3d_layer(ctx: TargetContext, family: str) -> Classification:
    """A Conv3dLayer proj: needed when eager mode calls F.conv3d with this torch."""
    gate = read_gate(ctx.related.get(CONV_PY))
    torch = ctx.torch.version if ctx.torch is not None else None
    admits = gate.admits(torch) if torch is not None else None
    notes = (
        "vllm's default compiled mode already runs Conv3dLayer as a matmul "
        "(custom ops are off under inductor)",
        "eager mode (enforce_eager, what ROCm users of MinerU run) or custom_ops all/+conv3d "
        f"calls Conv3dLayer.forward_cuda, which runs a matmul only for {gate.describe} "
        "(read from conv.py), and F.conv3d (MIOpen on ROCm) otherwise",
        "compilation_config={'custom_ops': ['-conv3d']} is the zero-patch workaround",
    )
    if admits:
        return Classification(
            CodeShape.FIXED_UPSTREAM,
            f"Conv3dLayer runs a matmul in every mode with torch {torch}: conv.py's eager "
            f"gate admits {gate.describe}",
            notes,
        )
    if admits is False:
        why = f"with torch {torch} (conv.py's gate: {gate.describe})"
    elif torch is None:
        why = "and no torch was found here to check conv.py's gate against"
    else:
        why = f"unless {gate.describe} admits torch {torch}, which rocmfix cannot tell"
    return Classification(
        CodeShape.NEEDS_PATCH,
        f"{family}: Conv3dLayer calls F.conv3d in eager mode {why}; the patch makes it a GEMM "
        "in every mode",
        notes,
    )


MINERU = MinerUUse("its vllm backends load MinerU2.5, a Qwen2-VL", imports=("vllm",))
PLAIN = ("0.8.0-0.11.0: nn.Conv3d (needed on ROCm)", CONV3D_LAYER)
ROWS = (
    ("qwen2-vl", "qwen2_vl.py", "Qwen2VisionPatchEmbed", "Qwen2-VL (MinerU2.5)", PLAIN),
    ("qwen2.5-vl", "qwen2_5_vl.py", "Qwen2_5_VisionPatchEmbed", "Qwen2.5-VL", PLAIN),
)
QWEN3 = (
    "qwen3-vl",
    f"{MODELS}/qwen3_vl.py",
    "Qwen3_VisionPatchEmbed",
    "Qwen3-VL",
    "vllm {version} has no Qwen3-VL (it arrived in 0.11.0)",
    (
        "before 0.11.0: no qwen3_vl.py (not needed)",
        "0.11.0: nn.Conv3d with bias (needed on ROCm)",
        CONV3D_LAYER.replace("Conv3dLayer", "Conv3dLayer with bias", 1),
    ),
)

PATCHES = patch_embed_patches(
    "vllm", KERNELS, MINERU, [*in_folder("vllm", MODELS, ROWS), QWEN3], conv3d_layer, (CONV_PY,)
)
