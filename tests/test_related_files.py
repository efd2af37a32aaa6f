"""A related file (another distribution's code a classification reads: vllm's tokenizer
group, its ROCm platform, its or sglang's conv.py) is as untrusted as the target itself. One
nested deeper than rocmfix reads raised RecursionError out of classify: status ended in
"a bug in rocmfix" instead of reading the file as one that does not parse."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from patches import mineru_tokenizer, mineru_vit_attention, sglang_vision, vllm_vision
from rocmfix import mineru
from rocmfix.patch import CodeShape, Patch, TargetContext, TorchInfo
from rocmfix.registry import all_patches

GOLDEN = Path(__file__).parent / "golden"
# Valid Python, far deeper than the interpreter's recursion limit lets libcst go.
DEEP = ("x = " + "-" * 2000 + "1\n").encode()
ROCM = TorchInfo("2.9.0", "7.0", None)


def _context(related: dict[str, bytes | None], vllm: str = "0.11.0") -> TargetContext:
    return TargetContext("0", {"vllm": vllm, "sglang": "0.5.10"}, ROCM, related)


def test_a_deep_tokenizer_group_reads_as_one_without_the_method() -> None:
    module = cst.parse_module((GOLDEN / "mineru_unguarded.py").read_bytes())
    ctx = _context({rel: DEEP for rel in mineru_tokenizer.TOKENIZER_GROUP})
    assert mineru_tokenizer.classify(module, ctx).shape is CodeShape.NEEDS_PATCH


def test_a_deep_rocm_platform_does_not_parse() -> None:
    ctx = _context(
        {
            mineru_vit_attention.ROCM_PY: DEEP,
            mineru_vit_attention.ARG_UTILS: b"mm_encoder_attn_backend",
        }
    )
    assert mineru_vit_attention.vllm_choice(ctx) == (
        False,
        "vllm's platforms/rocm.py does not parse",
    )


@pytest.mark.parametrize(
    ("patch", "golden"),
    [
        (vllm_vision.PATCHES[0], "vllm_conv3d_layer.py"),
        (sglang_vision.PATCHES[0], "sglang_conv3d_layer.py"),
    ],
)
def test_a_deep_conv_py_does_not_parse(patch: Patch, golden: str) -> None:
    module = patch.parse((GOLDEN / golden).read_bytes())
    found = patch.classify(module, _context({patch.related[0]: DEEP}, vllm="0.11.1"))
    # vllm's gate cannot be read (the patch is needed), sglang's layer is unknown.
    assert found.shape is (CodeShape.UNKNOWN if "sglang" in patch.id else CodeShape.NEEDS_PATCH)
    assert "does not parse" in found.reason + " ".join(found.notes)


def test_a_deep_file_of_minerus_is_skipped(tmp_path: Path) -> None:
    """MinerU's own files are read with ast: one nested too deep raised MemoryError (or
    RecursionError) out of the scan, before status could say anything."""
    package = tmp_path / "mineru"
    package.mkdir()
    (package / "deep.py").write_bytes(b"import vllm\nx = " + b"-" * 200_000 + b"1\n")
    (package / "plain.py").write_bytes(b"import lmdeploy\n")
    found = mineru.scan([tmp_path], all_patches())
    assert "lmdeploy" in found.imports and "vllm" not in found.imports
