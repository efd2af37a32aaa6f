"""Every patch's classification and rewrite, in-process, on small code written for these tests.

Each case is a source file under ``tests/golden/`` (never upstream code) with the verdict its
patch must reach and a word of the reason. A case that needs the patch also has a
``.patched.py`` beside it: the exact bytes the rewrite must produce, which must classify as
rocmfix's own, carry rocmfix's marker, compile, and not be rewritten a second time. The real
releases are tested through the CLI elsewhere; this is the layer that runs in a second.
``ROCMFIX_UPDATE_GOLDEN=1`` writes the ``.patched.py`` files anew (read the diff before you
commit it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
import pytest

from rocmfix import rewrite
from rocmfix._resources import patches_package
from rocmfix.errors import AnchorNotFoundError
from rocmfix.patch import CodeShape, Patch, TargetContext, TorchInfo
from rocmfix.registry import all_patches
from rocmfix.rewrite import MARKER

GOLDEN = Path(__file__).resolve().parent / "golden"
CONV_PY = "vllm/model_executor/layers/conv.py"
SGLANG_CONV = "sglang/srt/layers/conv.py"


# A transformers row for the golden file's class, built by the table's own helpers.
_TV = patches_package().transformers_vision
TRANSFORMERS = _TV.patch_embed_patches(
    "transformers",
    _TV.KERNELS,
    _TV.MINERU,
    _TV.rows([("golden", "golden_vl", "VisionPatchEmbed", "Golden-VL")]),
)[0]


def _patch(patch_id: str) -> Patch:
    if patch_id == TRANSFORMERS.id:
        return TRANSFORMERS
    return next(p for p in all_patches() if p.id == patch_id)


def _gate(name: str) -> dict[str, bytes | None]:
    return {CONV_PY: (GOLDEN / f"conv_gate_{name}.py").read_bytes()}


def _rocm(version: str) -> TorchInfo:
    return TorchInfo(version=version, hip="7.1.0", cuda=None)


@dataclass(frozen=True)
class Case:
    source: str
    patch: str
    shape: CodeShape
    says: str
    torch: TorchInfo | None = None
    related: Mapping[str, bytes | None] = field(default_factory=dict)
    versions: Mapping[str, str] = field(default_factory=dict)

    def context(self) -> TargetContext:
        return TargetContext(
            version="0", versions=self.versions, torch=self.torch, related=dict(self.related)
        )

    @property
    def id(self) -> str:
        torch = f"-torch{self.torch.version}" if self.torch else ""
        torch += "-" + "-".join(self.versions) if self.versions else ""
        gate = "-" + next(iter(self.related)).rsplit("/", 1)[-1] if self.related else ""
        return f"{self.patch}:{self.source}{torch}{gate}"


NEEDS, FIXED, UNKNOWN = CodeShape.NEEDS_PATCH, CodeShape.FIXED_UPSTREAM, CodeShape.UNKNOWN
VIT, VLLM = "mineru-vit-attention", {"vllm": "0.99.0"}


def _vllm(platform: str, args: str = "") -> dict[str, bytes | None]:
    """A vLLM's ROCm platform and engine arguments, as the vision-tower patch reads them."""
    return {
        "vllm:vllm/platforms/rocm.py": (GOLDEN / f"vit_platform_{platform}.py").read_bytes(),
        "vllm:vllm/engine/arg_utils.py": (GOLDEN / f"vit_engine_args{args}.py").read_bytes(),
    }


MIGRAPHX = {"onnxruntime-migraphx": "1.27.1"}
QWEN2 = "vllm-qwen2-vl"

CASES = [
    Case("vllm_conv3d", QWEN2, NEEDS, "nn.Conv3d patch embed"),
    Case("vllm_linear", QWEN2, FIXED, "is a nn.Linear already"),
    Case("vllm_stride", QWEN2, UNKNOWN, "stride is not its kernel size"),
    Case("vllm_padded", QWEN2, UNKNOWN, "padded"),
    Case("vllm_grouped", QWEN2, UNKNOWN, "sets groups=2"),
    Case("vllm_dilated", QWEN2, UNKNOWN, "sets dilation=(1, 2, 2)"),
    Case("vllm_twice", QWEN2, UNKNOWN, "calls self.proj 2 times"),
    Case("vllm_hand_edit", QWEN2, UNKNOWN, "put in by hand"),
    Case("vllm_renamed", QWEN2, UNKNOWN, "no class Qwen2VisionPatchEmbed"),
    # Conv3dLayer: decided by conv.py's gate against the target's torch, whatever the label.
    Case("vllm_conv3d_layer", QWEN2, NEEDS, "calls F.conv3d", _rocm("2.10.0"), _gate("equal")),
    Case("vllm_conv3d_layer", QWEN2, FIXED, "matmul in every mode", _rocm("2.9.0+rocm6.4"),
         _gate("equal")),
    Case("vllm_conv3d_layer", QWEN2, FIXED, "is_torch_equal", _rocm("2.9.1+rocm6.4"),
         _gate("either")),
    Case("vllm_conv3d_layer", QWEN2, FIXED, "torch >= 2.9.0", _rocm("2.10.0+rocm7.1"),
         _gate("newer")),
    Case("vllm_conv3d_layer", QWEN2, NEEDS, "torch 2.9.0.dev20250801", _rocm("2.9.0.dev20250801"),
         _gate("newer")),
    Case("vllm_conv3d_layer", QWEN2, NEEDS, "torch 2.9.0a0+git1234", _rocm("2.9.0a0+git1234"),
         _gate("newer")),
    Case("vllm_conv3d_layer", QWEN2, NEEDS, "always calls F.conv3d", _rocm("2.10.0"),
         _gate("never")),
    Case("vllm_conv3d_layer", QWEN2, FIXED, "every torch", _rocm("2.4.0"), _gate("always")),
    Case("vllm_conv3d_layer", QWEN2, NEEDS, "rocmfix cannot tell", _rocm("2.10.0"),
         _gate("unknown")),
    Case("vllm_conv3d_layer", QWEN2, NEEDS, "has no layers/conv.py", _rocm("2.10.0"),
         {CONV_PY: None}),
    Case("vllm_conv3d_layer", QWEN2, NEEDS, "conv.py has no Conv3dLayer", _rocm("2.10.0"),
         {CONV_PY: b"class Conv3dLayer:\n    pass\n"}),
    Case("vllm_conv3d_layer", QWEN2, NEEDS, "no torch was found", None, _gate("newer")),
    Case("transformers_patch_embed", TRANSFORMERS.id, NEEDS, "Golden-VL: nn.Conv3d patch embed"),
    Case("transformers_video", TRANSFORMERS.id, UNKNOWN, "not run self.proj on patches viewed"),
    Case("sglang_conv3d", "sglang-qwen2-vl", NEEDS, "nn.Conv3d patch embed"),
    Case("sglang_conv3d_layer", "sglang-qwen2-vl", FIXED, "unfold + F.linear",
         related={SGLANG_CONV: (GOLDEN / "sglang_conv_mulmat.py").read_bytes()}),
    Case("sglang_conv3d_layer", "sglang-qwen2-vl", UNKNOWN, "does not run _forward_mulmat",
         related={SGLANG_CONV: b"class Conv3dLayer:\n    def forward_cuda(self, x):\n"
                                b"        return x\n"}),
    Case("sglang_conv3d_layer", "sglang-qwen2-vl", UNKNOWN, "without sglang/srt/layers/conv.py",
         related={SGLANG_CONV: None}),
    Case("lmdeploy_patch_embed", "lmdeploy-qwen2-vl", NEEDS, "nn.Conv3d patch embed"),
    Case("doclayout_block", "doclayout-dilated-conv", NEEDS, "naive kernel"),
    Case("doclayout_block_scaled", "doclayout-dilated-conv", NEEDS, "naive kernel"),
    Case("doclayout_hand_hook", "doclayout-dilated-conv", UNKNOWN, "forum's Triton hook"),
    Case("doclayout_no_method", "doclayout-dilated-conv", UNKNOWN, "no DilatedBlock.dilated_conv"),
    Case("mineru_unguarded", "mineru-tokenizer", NEEDS, "unguarded"),
    Case("mineru_hasattr", "mineru-tokenizer", FIXED, "hasattr"),
    Case("mineru_try", "mineru-tokenizer", FIXED, "try/except AttributeError"),
    Case("mineru_absent", "mineru-tokenizer", FIXED, "never calls"),
    Case("mineru_inline", "mineru-tokenizer", UNKNOWN, "form rocmfix does not know"),
    # The table patches: an onnxruntime build with an AMD provider installed, or none.
    Case("tables_session", "mineru-table-session", NEEDS, "asks for CUDA or the CPU only",
         versions=MIGRAPHX),
    Case("tables_session", "mineru-table-session", FIXED, "no onnxruntime-migraphx or"),
    Case("tables_amd", "mineru-table-session", FIXED, "already asks for an AMD provider",
         versions=MIGRAPHX),
    Case("tables_class", "mineru-table-unet", NEEDS, "OrtInferSession.__init__ asks for CUDA",
         versions={"onnxruntime-rocm": "1.22.2.post3"}),
    Case("tables_delegates", "mineru-table-unet", FIXED, "(it calls table_ort_session)",
         versions=MIGRAPHX),
    Case("tables_class", "mineru-table-session", FIXED, "has no table_ort_session",
         versions=MIGRAPHX),
    # The vision tower's backend: what the installed vLLM's own code offers and picks.
    Case("vit_device_config", VIT, NEEDS, "gives RDNA's vision tower TORCH_SDPA",
         related=_vllm("sdpa"), versions=VLLM),
    Case("vit_device_config", VIT, FIXED, "offers no TRITON_ATTN", related=_vllm("no_triton"),
         versions=VLLM),
    Case("vit_device_config", VIT, FIXED, "no longer TORCH_SDPA", related=_vllm("triton"),
         versions=VLLM),
    Case("vit_device_config", VIT, FIXED, "takes no mm_encoder_attn_backend",
         related=_vllm("sdpa", "_old"), versions=VLLM),
    Case("vit_device_config", VIT, FIXED, "no vllm here"),
    Case("vit_device_config", VIT, FIXED, "vllm 0.99.0 has no platforms/rocm.py",
         versions=VLLM),
    Case("vit_device_config_set", VIT, FIXED, "already sets mm_encoder_attn_backend",
         related=_vllm("sdpa"), versions=VLLM),
    Case("vit_device_config_absent", VIT, UNKNOWN, "has no _get_device_config",
         related=_vllm("sdpa"), versions=VLLM),
]  # fmt: skip


def _module(name: str) -> cst.Module:
    return cst.parse_module((GOLDEN / f"{name}.py").read_bytes())


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_classify(case: Case) -> None:
    patch = _patch(case.patch)
    found = patch.classify(_module(case.source), case.context())
    assert found.shape is case.shape, found
    assert case.says in " ".join((found.reason, *found.notes)), found
    # What status reads (only the focus class, for speed) decides the same.
    data = (GOLDEN / f"{case.source}.py").read_bytes()
    assert patch.classify(patch.parse(data), case.context()) == found


REWRITES = sorted({(c.patch, c.source) for c in CASES if c.shape is NEEDS})


@pytest.mark.parametrize(("patch_id", "source"), REWRITES)
def test_rewrite(patch_id: str, source: str) -> None:
    patch = _patch(patch_id)
    before = _module(source)
    after = patch.transform(before).bytes
    golden = GOLDEN / f"{source}.patched.py"
    if os.environ.get("ROCMFIX_UPDATE_GOLDEN"):
        golden.write_bytes(after)
    assert after == golden.read_bytes()
    assert MARKER.encode() in after
    compile(after, str(golden), "exec")
    ctx = TargetContext(version="0", versions={}, torch=None, related=_gate("never"))
    again = patch.classify(cst.parse_module(after), ctx)
    assert again.shape is CodeShape.PATCHED, again
    assert patch.classify(patch.parse(after), ctx) == again
    # Nothing left to rewrite: a second pass refuses instead of patching twice.
    with pytest.raises(AnchorNotFoundError):
        patch.transform(cst.parse_module(after))
    # Every byte outside the rewritten statements is the original's.
    kept = [line for line in before.bytes.splitlines() if b"self.proj(" not in line]
    kept = [line for line in kept if b"get_lora_tokenizer" not in line and b"F.conv2d" not in line]
    kept = [line for line in kept if b"InferenceSession(" not in line]
    kept = [line for line in kept if b"return SETTINGS.get(" not in line]
    assert all(line in after.splitlines() for line in kept)


def test_a_run_parses_and_walks_each_file_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every patch that reads a file, and each plan of a run, shares one tree of its bytes."""
    parsed: list[bytes] = []
    real = cst.parse_module
    monkeypatch.setattr(cst, "parse_module", lambda data: parsed.append(data) or real(data))
    rewrite.parse.cache_clear()
    data = (GOLDEN / "vllm_conv3d.py").read_bytes()
    tree = rewrite.parse(data)
    assert rewrite.parse(bytes(bytearray(data))) is tree and parsed == [data]
    convs = rewrite.calls(tree, "proj")
    monkeypatch.setattr(rewrite._Collect, "on_visit", lambda *_: pytest.fail("walked twice"))
    assert rewrite.calls(tree, "proj") == convs and len(convs) == 1
