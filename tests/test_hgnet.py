"""transformers' HGNetV2 family (PP-DocLayoutV2's backbone) and the conv-site rewrite it shares
with MinerU's pytorchocr files: golden cases on small code written for these tests, then every
transformers release with hgnet_v2 from PyPI, and apply/revert through the real CLI."""

from __future__ import annotations

import os
from pathlib import Path

import libcst as cst
import pytest
from packaging.version import Version

from rocmfix.patch import CodeShape, Patch, TargetContext, TorchInfo
from rocmfix.registry import all_patches
from rocmfix.rewrite import MARKER

import releases
from conftest import InstalledEnv, fake_torch, files_under, install_release

GOLDEN = Path(__file__).resolve().parent / "golden"
HGNET = "transformers/models/hgnet_v2/modeling_hgnet_v2.py"
FIRST = "4.52.1"  # the first release on PyPI with hgnet_v2 (4.52.0 has no wheel there)
CTX = TargetContext(version="0", versions={}, torch=TorchInfo("2.9.1", "7.2.0", None))
NEEDS, FIXED, UNKNOWN = CodeShape.NEEDS_PATCH, CodeShape.FIXED_UPSTREAM, CodeShape.UNKNOWN


def patch(patch_id: str) -> Patch:
    return next(p for p in all_patches() if p.id == patch_id)


GOLDEN_CASES = [
    ("hgnet_layer", "transformers-hgnet-v2", NEEDS, "HGNetV2ConvLayer: depthwise"),
    ("hgnet_reordered", "transformers-hgnet-v2", UNKNOWN, "does not run self.convolution"),
    ("hgnet_absent", "transformers-hgnet-v2", FIXED, "has no HGNetV2ConvLayer"),
    ("hgnet_hand_edit", "transformers-hgnet-v2", UNKNOWN, "not from rocmfix"),
    ("ocr_lcnet", "mineru-ocr-lcnetv4", NEEDS, "PPLCNetV4DepthwiseSeparableConvLayer"),
    ("ocr_lightsvtr", "mineru-ocr-lightsvtr", NEEDS, "LightSVTRConvLayer: a 1x7 depthwise"),
    ("ocr_lightsvtr", "mineru-utils-ocr-lightsvtr", NEEDS, "LightSVTRConvLayer"),
    ("ocr_lcnet", "mineru-ocr-lightsvtr", FIXED, "has no LightSVTRConvLayer"),
    ("ocr_db_head", "mineru-ocr-db-head", NEEDS, "DBHead, Head: 2x2 stride-2"),
    ("ocr_db_head", "mineru-utils-ocr-db-head", NEEDS, "transposed"),
]


@pytest.mark.parametrize(("source", "patch_id", "shape", "says"), GOLDEN_CASES)
def test_golden(source: str, patch_id: str, shape: CodeShape, says: str) -> None:
    p = patch(patch_id)
    data = (GOLDEN / f"{source}.py").read_bytes()
    found = p.classify(p.parse(data), CTX)
    assert found.shape is shape, found
    assert says in found.reason
    if shape is not NEEDS:
        return
    patched = p.transform(cst.parse_module(data)).code
    expected = GOLDEN / f"{source}.{patch_id.split('-', 1)[0]}.patched.py"
    if os.environ.get("ROCMFIX_UPDATE_GOLDEN"):
        expected.write_text(patched)
    assert patched == expected.read_text()
    assert MARKER in patched
    compile(patched, source, "exec")
    again = p.classify(p.parse(patched.encode()), CTX)
    assert again.shape is CodeShape.PATCHED, again
    with pytest.raises(Exception, match="already called"):
        p.transform(cst.parse_module(patched))


def test_golden_routes_only_the_named_runs() -> None:
    """The rewrite keeps every statement it routes as the stock path, and routes nothing else:
    the head's BatchNorm after conv2 stays where it is."""
    p = patch("mineru-ocr-db-head")
    patched = p.transform(cst.parse_module((GOLDEN / "ocr_db_head.py").read_bytes())).code
    assert patched.count("_rocmfix_conv_transpose2d(") == 3
    assert patched.count("x = self.conv_bn2(x)") == 1
    for stock in ("x = self.conv2(x)", "x = self.conv3(x)", "maps = self.conv_final(x)"):
        assert patched.count(stock) == 1


def _hgnet_releases() -> list[str]:
    return [
        v
        for v in releases.releases("transformers")
        if Version(v) >= Version(FIRST) and Version(v).pre is None
    ]


def test_every_release_with_hgnet_needs_it() -> None:
    """Every final release from the first with hgnet_v2 to the pinned one: the layer's shape is
    recognised, the rewrite compiles and reads as rocmfix's own; the release before has none."""
    assert not releases.wheel_members("transformers", "4.51.3", [HGNET])[HGNET]
    p = patch("transformers-hgnet-v2")
    seen = set()
    for version in _hgnet_releases():
        data = releases.wheel_members("transformers", version, [HGNET])[HGNET]
        assert data is not None, version
        found = p.classify(p.parse(data), CTX)
        assert found.shape is NEEDS, (version, found)
        patched = p.transform(cst.parse_module(data)).code
        compile(patched, f"{version}/{HGNET}", "exec")
        assert p.classify(p.parse(patched.encode()), CTX).shape is CodeShape.PATCHED
        seen.add(version)
    assert {FIRST, releases.PINNED["transformers"]} <= seen


@pytest.mark.parametrize("version", [FIRST, "4.57.6", "5.10.1", releases.PINNED["transformers"]])
def test_apply_and_revert_through_the_cli(transformers_env, version: str) -> None:  # type: ignore[no-untyped-def]
    env: InstalledEnv = transformers_env(version, torch="2.9.1+rocm7.2", hip="7.2.0")
    hgnet = env.site / HGNET
    before = files_under(env.site)
    # Named with --only: applied whatever was (not) measured on this machine.
    result = env.cli("apply", "--only", "transformers-hgnet-v2", "--scheme", "channels-last")
    assert result.returncode == 0, result.stderr
    assert "transformers-hgnet-v2: applied" in result.stderr
    text = hgnet.read_text()
    assert "from ..rocmfix_depthwise_conv import depthwise_conv2d" in text
    assert (env.site / "transformers/models/rocmfix_depthwise_conv.py").is_file()
    assert env.status("transformers-hgnet-v2")["verdict"] == "applied"
    result = env.cli("revert")
    assert result.returncode == 0, result.stderr
    assert files_under(env.site) == before


def test_not_needed_on_a_cuda_torch(transformers_env) -> None:  # type: ignore[no-untyped-def]
    env: InstalledEnv = transformers_env(releases.PINNED["transformers"])
    fake_torch(env.site, "2.9.1+cu128", cuda="12.8")
    found = env.status("transformers-hgnet-v2")
    assert found["verdict"] == "not-needed"
    assert "is a CUDA build" in found["reason"] or "cuda" in found["reason"].lower()


LAYOUT = r"""
from transformers import PPDocLayoutV2Config, PPDocLayoutV2ForObjectDetection


def models():
    config = PPDocLayoutV2Config()
    config.class_thresholds = [0.5] * config.num_labels
    config.class_order = list(range(config.num_labels))
    # A 64x64 page has 84 anchors, fewer than the default 300 queries; the backbone, whose
    # depthwise convs are the point, is the default config's HGNetV2-L.
    config.num_queries = 16
    torch.manual_seed(0)
    model = PPDocLayoutV2ForObjectDetection(config)
    # transformers' init (std 0.02) shrinks the backbone's activations tenfold a layer, to
    # 1e-20 at the last stage: the head then sees nothing and any conv would match. He init
    # keeps them near 1, and the backbone's feature maps are compared, not only the head's.
    for m in model.model.backbone.modules():
        if isinstance(m, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
    yield "layout", WithBackbone(model), {"pixel_values": torch.randn(1, 3, 64, 64)}


class WithBackbone(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model, self.feats = model, []
        model.model.backbone.register_forward_hook(lambda _m, _a, out: self.feats.append(out))

    def forward(self, **inputs):
        self.feats.clear()
        return [self.model(**inputs), list(self.feats)]


compare(models())
"""


@pytest.mark.network
def test_pp_doclayout_v2_matches_stock(tmp_path: Path) -> None:
    """PP-DocLayoutV2 from transformers' default config (random weights, no hub) in the newest
    transformers, patched through the CLI: the routed forward runs its 27 depthwise convs in
    the Triton kernel (interpreter) and matches stock. transformers 5 needs a newer
    huggingface-hub and tokenizers than the test environment's: they are fetched too."""
    from test_mineru_ocr import fake_dist, run_model

    version = releases.PINNED["transformers"]
    env = install_release(tmp_path / "env", "transformers", version, HGNET)
    fake_torch(env.site, "2.9.1+rocm7.2", hip="7.2.0")
    fake_dist(env.site, "triton", "3.8.0")
    path = [releases.importable("huggingface-hub", "1.33.0")]
    path.append(releases.importable("tokenizers", "0.23.3"))
    root = env.site / "transformers" / "models"
    stock = run_model(LAYOUT, env.site, "stock", tmp_path, root, path)
    assert stock["layout"]["depthwise"] == 27
    result = env.cli("apply", "--only", "transformers-hgnet-v2", "--scheme", "triton")
    assert result.returncode == 0, result.stderr
    patched = run_model(LAYOUT, env.site, "patched", tmp_path, root, path)["layout"]
    assert patched["depthwise"] == 0, patched
    assert patched["other"] == stock["layout"]["other"], patched
    assert patched["err"] < 1e-4, patched
