"""The graph-replay patches of MinerU's OCR predictors (patches/mineru_graphs.py): golden code
written for these tests, every MinerU release's predictor files from PyPI, apply and revert
through the real CLI, and the real patched files run on the CPU.

On a CPU the dropped runner is a pass-through (nothing to replay there). Its fallbacks run
through the real patched ``predict_det.py`` with :class:`CpuGraphs` (the stand-in for
``torch.cuda``'s graphs from tests/test_graphs_runner.py) put into the runner the patched file
imported: a capture that raises, grad mode, a model in training, a shape past the cap.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import libcst as cst
import pytest
from graphs_fake import second_sighting
from packaging.version import Version

from rocmfix.errors import AnchorNotFoundError, ManifestError
from rocmfix.manifest import ManifestEntry
from rocmfix.patch import CodeShape, Patch, TargetContext
from rocmfix.registry import all_patches
from rocmfix.rewrite import MARKER
from rocmfix.write.verdicts import check_entry

import releases
from conftest import ROOT, InstalledEnv, fake_torch, files_under, install_release

GOLDEN = Path(__file__).resolve().parent / "golden"
CTX = TargetContext(version="0", versions={}, torch=None)
NEW = "mineru/model/_internal/pytorchocr/infer"


def graph_patches() -> list[Patch]:
    return [p for p in all_patches() if p.id.endswith("-graphs")]


def _patch(patch_id: str) -> Patch:
    return next(p for p in graph_patches() if p.id == patch_id)


# ------------------------------------------------------------------ golden (no network)


@pytest.mark.parametrize(
    ("source", "shape", "says"),
    [
        ("ocr_predictor", CodeShape.NEEDS_PATCH, "TextDetector calls self.net(...) 2 times"),
        ("ocr_predictor_returns", CodeShape.UNKNOWN, "not as `x = self.net(...)`"),
        ("ocr_predictor_none", CodeShape.FIXED_UPSTREAM, "never calls self.net(...)"),
    ],
)
def test_classify(source: str, shape: CodeShape, says: str) -> None:
    patch = _patch("mineru-ocr-det-graphs")
    found = patch.classify(patch.parse((GOLDEN / f"{source}.py").read_bytes()), CTX)
    assert found.shape is shape and says in found.reason, found


def test_rewrite() -> None:
    patch = _patch("mineru-ocr-det-graphs")
    before = (GOLDEN / "ocr_predictor.py").read_bytes()
    after = patch.transform(cst.parse_module(before)).bytes
    golden = GOLDEN / "ocr_predictor.graphs.patched.py"
    if os.environ.get("ROCMFIX_UPDATE_GOLDEN"):
        golden.write_bytes(after)
    assert after == golden.read_bytes()
    assert MARKER.encode() in after
    compile(after, str(golden), "exec")
    assert patch.classify(patch.parse(after), CTX).shape is CodeShape.PATCHED
    with pytest.raises(AnchorNotFoundError):
        patch.transform(cst.parse_module(after))
    # Every line but the two routed calls is the original's; the backbone call stays.
    kept = [line for line in before.splitlines() if b"= self.net(" not in line]
    assert all(line in after.splitlines() for line in kept)
    assert after.count(b"_rocmfix_graph_forward(self.net, ") == 2


SCOPED = """import torch


class BaseModel:
    def forward(self, x):
        y = self.backbone(x)

        class Helper:
            def f(self, x):
                z = self.backbone(x)

        return y


class Other:
    def forward(self, x):
        y = self.backbone(x)
"""


def test_a_scoped_caller_routes_its_own_class_only() -> None:
    """The formula encoder's patch routes ``self.backbone`` in ``BaseModel`` itself: not in a
    class inside it, not in another class; classify counts what transform routes."""
    patch = _patch("mineru-formula-encoder-graphs")
    found = patch.classify(patch.parse(SCOPED.encode()), CTX)
    assert found.shape is CodeShape.NEEDS_PATCH and "self.backbone(...) once" in found.reason
    after = patch.transform(cst.parse_module(SCOPED)).code
    assert after.count("y = _rocmfix_graph_forward(self.backbone, x)") == 1
    assert after.count("z = self.backbone(x)") == 1 and after.count("y = self.backbone(x)") == 2


@pytest.mark.parametrize(
    ("model", "told"), [("rec", b"rocmfix_width_bucket=320"), ("det", b"rocmfix_size_bucket=320")]
)
def test_rec_and_det_offer_a_bucket_as_a_scheme(model: str, told: bytes) -> None:
    """rec's and det's graphs patches have two schemes, exact (the default: the call as
    before) and bucket (the call passes the runner its bucket); cls has none."""
    patch = _patch(f"mineru-ocr-{model}-graphs")
    assert patch.scheme_names == ("exact", "bucket") and patch.default_scheme == "exact"
    assert not _patch("mineru-ocr-cls-graphs").schemes
    before = (GOLDEN / "ocr_predictor.py").read_bytes()
    exact = patch.transformer("exact")(cst.parse_module(before)).bytes
    assert exact == patch.transformer(None)(cst.parse_module(before)).bytes
    assert told not in exact and exact.count(b"_rocmfix_graph_forward(self.net, ") == 2
    after = patch.transformer("bucket")(cst.parse_module(before)).bytes
    # Each routed call given the bucket, and nothing else.
    assert after.count(b"_rocmfix_graph_forward(self.net, inp, " + told + b")") == 1
    assert after.count(b", " + told + b")") == 2
    assert after.replace(b", " + told, b"") == exact
    assert patch.classify(patch.parse(after), CTX).shape is CodeShape.PATCHED
    assert patch.drops("bucket") == patch.drops("exact")  # the same runner, told by the call


def test_a_rec_patch_applied_before_its_schemes_is_the_default() -> None:
    """A manifest written before rec had schemes names none: read as applied (its default,
    what it wrote then), where any other unknown scheme is refused."""
    rec = _patch("mineru-ocr-rec-graphs")
    entry = ManifestEntry(
        rec.id, "mineru", "4.0.12", rec.path, None, "0" * 64, "1" * 64, (), False, "now"
    )
    check_entry(rec, entry)
    check_entry(rec, replace(entry, scheme="bucket"))
    with pytest.raises(ManifestError, match="unknown scheme 'gemm'"):
        check_entry(rec, replace(entry, scheme="gemm"))


def test_a_hand_made_runner_name_is_not_rocmfixs() -> None:
    patch = _patch("mineru-ocr-det-graphs")
    code = b"def f(self, x):\n    return _rocmfix_graph_forward(self.net, x)\n"
    found = patch.classify(patch.parse(code), CTX)
    assert found.shape is CodeShape.UNKNOWN and "not from rocmfix" in found.reason


def test_each_predictor_drops_the_runner_beside_it() -> None:
    for p in graph_patches():
        folder = p.path.rsplit("/", 1)[0]
        # transformers' eager mask is rewritten into plain torch (torch.full): no runner.
        wanted = (
            set() if p.id == "transformers-eager-mask-graphs" else {f"{folder}/rocmfix_graphs.py"}
        )
        assert p.drop_paths == wanted, p.id
        assert p.op is None and not p.needs_rocm  # graphs are no ROCm gap


# ------------------------------------------------------------------ real releases (PyPI)


def _releases() -> list[str]:
    """Every final release from 3.0.0, and the first and last of each 2.x minor line."""
    every = [v for v in releases.releases("mineru") if Version(v).pre is None]
    picked = {v for v in every if Version(v) >= Version("3.0.0")}
    for minor in {Version(v).release[:2] for v in every if Version(v).major == 2}:
        line = [v for v in every if Version(v).release[:2] == minor]
        picked |= {line[0], line[-1]}
    return sorted(picked, key=Version)


@pytest.mark.network
def test_every_release_has_one_layout_and_every_predictor_is_rewritten() -> None:
    patches = [p for p in graph_patches() if "-ocr-" in p.id]
    # Releases whose predictor files are byte-identical are checked once.
    for versions, files in releases.distinct("mineru", _releases(), [p.path for p in patches]):
        needs = set()
        for p in patches:
            data = files[p.path]
            if data is None:
                continue
            found = p.classify(p.parse(data), CTX)
            assert found.shape is CodeShape.NEEDS_PATCH, (versions, p.id)
            patched = p.transform(cst.parse_module(data)).code
            compile(patched, f"{versions[0]}/{p.path}", "exec")
            assert p.classify(p.parse(patched.encode()), CTX).shape is CodeShape.PATCHED
            needs.add(p.id)
        for version in versions:
            prefix = (
                "mineru-ocr-"
                if Version(version) >= Version("4")
                else "mineru-utils-ocr-"
                if Version(version) >= Version("2.6")
                else "mineru-paddle-ocr-"
            )
            assert needs == {f"{prefix}{m}-graphs" for m in ("det", "rec", "cls")}, version


def _mineru_env(root: Path, version: str) -> InstalledEnv:
    env = install_release(root, "mineru", version, f"{NEW}/predict_det.py")
    fake_torch(env.site, "2.9.1+rocm7.2", hip="7.2.26015-fc0010cf6a")
    return env


def _only(prefix: str) -> list[str]:
    return [a for m in ("det", "rec", "cls") for a in ("--only", f"{prefix}{m}-graphs")]


@pytest.mark.network
@pytest.mark.parametrize("version", ["3.4.5", releases.PINNED["mineru"]])
def test_apply_dry_run_status_and_revert_through_the_cli(tmp_path: Path, version: str) -> None:
    env = _mineru_env(tmp_path / "env", version)
    new = version.startswith("4")
    prefix = "mineru-ocr-" if new else "mineru-utils-ocr-"
    folder = NEW if new else "mineru/model/utils/tools/infer"
    before = files_under(env.site)
    dry = env.cli("apply", "--dry-run", *_only(prefix))
    assert dry.returncode == 0, dry.stderr
    # det's two calls, rec's three and cls's one, each kept as the `else` of its guard.
    added = [line for line in dry.stdout.splitlines() if line.startswith("+")]
    assert sum("= _rocmfix_graph_forward(self.net, inp)" in line for line in added) == 6
    assert files_under(env.site) == before
    result = env.cli("apply", *_only(prefix))
    assert result.returncode == 0, result.stderr
    for m in ("det", "rec", "cls"):
        assert f"{prefix}{m}-graphs: applied" in result.stderr, result.stderr
    assert (env.site / folder / "rocmfix_graphs.py").read_bytes() == (
        ROOT / "templates" / "rocmfix_graphs.py"
    ).read_bytes()
    statuses = {p["id"]: p["verdict"] for p in env.cli("status", "--json").json()["patches"]}
    assert {v for k, v in statuses.items() if k.startswith(prefix) and "graphs" in k} == {"applied"}
    other = "mineru-utils-ocr-" if new else "mineru-ocr-"
    assert statuses[f"{other}det-graphs"] == "not-needed"
    if new:  # rec's width bucket, chosen with --scheme, then the default again
        rec, predictor = f"{prefix}rec-graphs", env.site / folder / "predict_rec.py"
        dry = env.cli("apply", "--dry-run", "--scheme", "bucket", "--only", rec)
        assert dry.returncode == 0, dry.stderr
        added = [line for line in dry.stdout.splitlines() if line.startswith("+")]
        assert sum("(self.net, inp, rocmfix_width_bucket=320)" in line for line in added) == 3
        result = env.cli("apply", "--scheme", "bucket", "--only", rec)
        assert result.returncode == 0, result.stderr
        assert predictor.read_text().count("rocmfix_width_bucket=320)") == 3
        found = {p["id"]: p for p in env.cli("status", "--json").json()["patches"]}
        assert (found[rec]["verdict"], found[rec]["scheme"]) == ("applied", "bucket")
        assert found[f"{prefix}det-graphs"]["scheme"] == "exact"
        result = env.cli("apply", "--only", rec)
        assert result.returncode == 0, result.stderr
        assert "rocmfix_width_bucket" not in predictor.read_text()
        det, detector = f"{prefix}det-graphs", env.site / folder / "predict_det.py"
        result = env.cli("apply", "--scheme", "bucket", "--only", det)
        assert result.returncode == 0, result.stderr
        assert detector.read_text().count("(self.net, inp, rocmfix_size_bucket=320)") == 2
        refused = env.cli("apply", "--scheme", "bucket", "--only", f"{prefix}cls-graphs")
        assert refused.returncode != 0 and "no selected patch offers scheme 'bucket'" in (
            refused.stderr
        )
        # rec applied by a rocmfix from before its schemes (its manifest entry names none):
        # the default, already applied; a plain apply leaves it be.
        manifest = env.state / "manifest.json"
        doc = json.loads(manifest.read_text())
        doc["entries"][rec]["scheme"] = None
        manifest.write_text(json.dumps(doc))
        stamp = predictor.stat().st_mtime_ns
        result = env.cli("apply", "--only", rec)
        assert result.returncode == 0, result.stderr
        assert f"{rec}: unchanged (exact): already applied" in result.stderr, result.stderr
        assert predictor.stat().st_mtime_ns == stamp
    result = env.cli("revert")
    assert result.returncode == 0, result.stderr
    assert files_under(env.site) == before


# The real patched predict_det.py on a CPU. argv: site-packages, the JSON of stock outputs to
# write or compare against ("" for none). The runner is the one the patched file imported.
RUN = r"""
import copy, importlib, json, os, sys, types, warnings
import numpy as np, torch, yaml
site, mode = sys.argv[1:3]
sys.path.append(site)
stub = types.ModuleType("mineru")
stub.__path__ = [os.path.join(site, "mineru")]
sys.modules["mineru"] = stub


class Anything(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: None


# The predictors' utility module imports docvortex (MinerU 4's image helpers), which the
# forward never calls.
for name in ("docvortex", "docvortex.image", "docvortex.geometry", "docvortex.schema"):
    sys.modules[name] = Anything(name)
package = "mineru.model._internal.pytorchocr"
base = importlib.import_module(package + ".modeling.architectures.base_model")
predict_det = importlib.import_module(package + ".infer.predict_det")
with open(os.path.join(site, *package.split("."), "utils", "resources", "arch_config.yaml")) as f:
    arch = yaml.safe_load(f)
torch.manual_seed(0)
det = object.__new__(predict_det.TextDetector)
det.net = base.BaseModel(copy.deepcopy(arch["ch_PP-OCRv6_tiny_det_infer"])).eval()
det.device, det.det_algorithm, det.ocr_inference_dtype = "cpu", "DB", torch.float32
det._postprocess_det_batch = lambda preds, shapes, ori: [preds["maps"]]


def image(h, w, seed):
    return np.random.default_rng(seed).standard_normal((3, h, w)).astype(np.float32)


def forward(h, w, seed=1):
    # The rewritten line runs inside: inp = torch.from_numpy(...); outputs = self.net(inp).
    (maps, _), = det._batch_process_preprocessed([(0, image(h, w, seed), np.zeros(4), (h, w))])[0]
    return maps


warnings.simplefilter("error")  # as under python -W error: nothing may raise in the forward
report = {"patched": getattr(predict_det, "_rocmfix_graph_forward", None) is not None}
if mode == "stock":
    report["maps"] = forward(64, 96).tolist()
    print(json.dumps(report))
    raise SystemExit
runner = sys.modules[predict_det._rocmfix_graph_forward.__module__]
sys.path.insert(0, sys.argv[3])
from graphs_fake import CpuGraphs

if mode == "bucket":  # --scheme bucket: the crop grown to 320x320, its edge repeated
    runner._BACKEND = CpuGraphs()
    x = torch.from_numpy(image(64, 96, 1))[None]
    grown = torch.nn.functional.pad(x, (0, 224, 0, 256), mode="replicate")
    with torch.inference_mode():
        want = det.net(grown)["maps"][..., :64, :96].numpy()
    report["bucketed"] = [bool(np.array_equal(forward(64, 96), want)) for _ in range(3)]
    report["stats"] = runner.stats(det.net)
    print(json.dumps(report))
    raise SystemExit
expected = np.asarray(json.loads(mode)["maps"], dtype=np.float32)
report["cpu"] = [bool(np.array_equal(forward(64, 96), expected)) for _ in range(3)]
report["cpu stats"] = runner.stats(det.net)
fake = runner._BACKEND = CpuGraphs()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("error")
    report["replayed"] = [bool(np.array_equal(forward(64, 96), expected)) for _ in range(3)]
    report["replays"] = fake.replays
    # A model in training (a copy: train mode updates BatchNorm's statistics).
    kept, det.net = det.net, copy.deepcopy(det.net).train()
    with torch.inference_mode():
        trained = det.net(torch.from_numpy(image(64, 96, 1))[None])["maps"].numpy()
    report["training"] = [bool(np.array_equal(forward(64, 96), trained)) for _ in range(2)]
    det.net = kept
    # Grad mode: the predictors call under inference mode; the runner they import, outside.
    x = torch.from_numpy(image(64, 96, 1))[None]
    report["grad mode"] = bool(torch.equal(
        predict_det._rocmfix_graph_forward(det.net, x)["maps"], det.net(x)["maps"]))
    runner.MAX_CAPTURES = 1
    wide = [forward(64, 128, 2) for _ in range(3)]
    report["past the cap"] = [bool(np.array_equal(m, wide[0])) for m in wide]
    report["captures"] = fake.captures
    fake.fail_capture = RuntimeError("operation not permitted when stream is capturing")
    runner.MAX_CAPTURES = 64
    det.net = copy.deepcopy(det.net)  # a model the runner has not seen
    report["capture raises"] = [bool(np.array_equal(forward(64, 96), expected)) for _ in range(3)]
    report["broken"] = runner.stats(det.net)["broken"]
report["warnings"] = [str(w.message) for w in caught]
print(json.dumps(report))
"""


@pytest.mark.network
def test_the_real_patched_detector_on_a_cpu(tmp_path: Path) -> None:
    env = _mineru_env(tmp_path / "env", releases.PINNED["mineru"])

    def run(mode: str) -> dict[str, object]:
        done = subprocess.run(
            [sys.executable, "-c", RUN, str(env.site), mode, str(Path(__file__).parent)],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
            env=second_sighting(),
        )
        assert done.returncode == 0, done.stderr[-4000:]
        found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
        return found

    stock = run("stock")
    assert stock["patched"] is False
    result = env.cli("apply", *_only("mineru-ocr-"))
    assert result.returncode == 0, result.stderr
    found = run(json.dumps({"maps": stock["maps"]}))
    assert found["patched"] is True
    # A CPU input: the stock forward, nothing captured, nothing said.
    assert found["cpu"] == [True] * 3
    assert found["cpu stats"] == {
        "graphs": 0,
        "held_bytes": 0,
        "captures": 0,
        "broken": None,
        "counts": {},
    }
    # Through the capture logic: eager, captured, replayed; equal to stock each time.
    assert found["replayed"] == [True] * 3 and found["replays"] == 2
    assert found["training"] == [True] * 2 and found["grad mode"] is True
    assert found["past the cap"] == [True] * 3 and found["captures"] == 1
    assert found["capture raises"] == [True] * 3
    assert str(found["broken"]).startswith("RuntimeError: operation not permitted")
    said = " | ".join(str(w) for w in found["warnings"])  # type: ignore[attr-defined]
    for reason in ("training", "grad mode", "shape past the cap", "capture failed"):
        assert f"BaseModel runs eager ({reason}:" in said, said
    assert len(found["warnings"]) == 4, said  # type: ignore[arg-type]
    # --scheme bucket: DB's maps of the grown crop, cut back to the crop's size, eager then
    # captured and replayed (the real head gives maps the input's size: nothing "not bucketed").
    result = env.cli("apply", "--scheme", "bucket", "--only", "mineru-ocr-det-graphs")
    assert result.returncode == 0, result.stderr
    found = run("bucket")
    assert found["bucketed"] == [True] * 3
    assert found["stats"]["counts"] == {  # type: ignore[index]
        "bucketed": 3,
        "eager": 1,
        "captured": 1,
        "replayed": 2,
    }


# ------------------------------------------------------------ PP-DocLayoutV2's backbone

LAYOUT_ID = "transformers-pp-doclayout-v2-graphs"
WITH_MINERU = TargetContext(version="0", versions={"mineru": "4.0.12"}, torch=None)
LAYOUT_FILE = "transformers/models/pp_doclayout_v2/modeling_pp_doclayout_v2.py"


def test_layout_golden() -> None:
    """Only the encoder's backbone call is routed: a ``self.model(...)`` elsewhere (the whole
    detector, which cannot be captured) stays as it is; and only beside MinerU."""
    patch = _patch(LAYOUT_ID)
    before = (GOLDEN / "layout_encoder.py").read_bytes()
    # Without MinerU in the environment, transformers' users are left alone.
    alone = patch.classify(patch.parse(before), CTX)
    assert alone.shape is CodeShape.FIXED_UPSTREAM and "no mineru here" in alone.reason
    found = patch.classify(patch.parse(before), WITH_MINERU)
    assert found.shape is CodeShape.NEEDS_PATCH, found
    assert "PPDocLayoutV2ConvEncoder calls self.model(...) once" in found.reason
    after = patch.transform(cst.parse_module(before)).bytes
    golden = GOLDEN / "layout_encoder.graphs.patched.py"
    if os.environ.get("ROCMFIX_UPDATE_GOLDEN"):
        golden.write_bytes(after)
    assert after == golden.read_bytes()
    assert b"_rocmfix_graph_forward(self.model, pixel_values).feature_maps" in after
    # PPDocLayoutV2Model's four host values kept on the device; the slice, the mask and the
    # list of its own, and the class the rewrite does not name, left alone.
    assert after.count(b"= _rocmfix_graph_constant(") == 4
    assert after.count(b"_rocmfix_graph_constant(self.config.class_order,") == 1
    left = (b"ids[:, 0] = self.config.start_", b"ids[mask] = self.config.pred_", b"x[0, 0] = 1")
    for kept in (*left, b"torch.tensor([1, 2]", b"torch.tensor(self.config.offsets"):
        assert kept in after, kept
    assert b"        outputs = self.model(pixel_values)\n" in after
    assert after.count(b"_rocmfix_graph_forward(self.model") == 1
    assert patch.classify(patch.parse(after), WITH_MINERU).shape is CodeShape.PATCHED
    none = patch.classify(patch.parse((GOLDEN / "ocr_predictor_none.py").read_bytes()), WITH_MINERU)
    assert none.shape is CodeShape.FIXED_UPSTREAM and "no PPDocLayoutV2ConvEncoder" in none.reason


@pytest.mark.network
def test_every_transformers_release_with_the_layout_model() -> None:
    patch = _patch(LAYOUT_ID)
    seen = []
    finals = [
        v
        for v in releases.releases("transformers")
        if Version(v) >= Version("5.0.0") and Version(v).pre is None
    ]
    # Releases whose modeling file is byte-identical are checked once.
    for versions, files in releases.distinct("transformers", finals, [LAYOUT_FILE]):
        data = files[LAYOUT_FILE]
        if data is None:
            continue
        found = patch.classify(patch.parse(data), WITH_MINERU)
        assert found.shape is CodeShape.NEEDS_PATCH, versions
        patched = patch.transform(cst.parse_module(data)).code
        compile(patched, f"{versions[0]}/{LAYOUT_FILE}", "exec")
        # The host values PP-DocLayoutV2's forward copies to the device, in every release:
        # six spatial_shapes writes (two statements), two config lists, one index_put_.
        assert patched.count("_rocmfix_graph_constant(") == 5, versions
        assert "torch.tensor(self.config." not in patched, versions
        again = patch.classify(patch.parse(patched.encode()), WITH_MINERU)
        assert again.shape is CodeShape.PATCHED
        seen += versions
    assert releases.PINNED["transformers"] in seen


@pytest.mark.network
def test_layout_apply_and_revert_through_the_cli(transformers_env) -> None:  # type: ignore[no-untyped-def]
    env: InstalledEnv = transformers_env(releases.PINNED["transformers"])
    from test_mineru_ocr import fake_dist

    assert env.status(LAYOUT_ID)["verdict"] == "not-needed"  # no MinerU here
    fake_dist(env.site, "mineru", releases.PINNED["mineru"])
    before = files_under(env.site)
    result = env.cli("apply", "--only", LAYOUT_ID)
    assert result.returncode == 0, result.stderr
    assert f"{LAYOUT_ID}: applied" in result.stderr, result.stderr
    assert (env.site / "transformers/models/pp_doclayout_v2/rocmfix_graphs.py").is_file()
    assert env.status(LAYOUT_ID)["verdict"] == "applied"
    result = env.cli("revert")
    assert result.returncode == 0, result.stderr
    assert files_under(env.site) == before


# The real patched modeling file on a CPU: the whole detector under no_grad (as MinerU calls
# it), first as a pass-through, then with the stand-in backend: its backbone captured at the
# second call and replayed at the third, outputs equal to the eager ones each time.
LAYOUT_RUN = r"""
import json, sys, warnings
import torch
sys.path[:0] = json.loads(sys.argv[1])
from transformers import PPDocLayoutV2Config, PPDocLayoutV2ForObjectDetection
import transformers.models.pp_doclayout_v2.modeling_pp_doclayout_v2 as modeling
from graphs_fake import CpuGraphs

config = PPDocLayoutV2Config()
config.class_thresholds = [0.5] * config.num_labels
config.class_order = list(range(config.num_labels))
config.num_queries = 16
torch.manual_seed(0)
model = PPDocLayoutV2ForObjectDetection(config).eval()
x = torch.randn(1, 3, 64, 64)
runner = sys.modules[modeling._rocmfix_graph_forward.__module__]
warnings.simplefilter("error")
with torch.no_grad():
    eager = model(pixel_values=x)
    passed = model(pixel_values=x)
    fake = runner._BACKEND = CpuGraphs()
    graphed = [model(pixel_values=x) for _ in range(3)]
backbone = model.model.backbone.model
same = lambda a, b: all(
    torch.equal(a[k], b[k]) for k in ("logits", "pred_boxes") if a.get(k) is not None
)
print(json.dumps({
    "pass-through": same(passed, eager),
    "graphed": [same(g, eager) for g in graphed],
    "replays": fake.replays,
    "stats": runner.stats(backbone),
}))
"""


@pytest.mark.network
def test_the_real_patched_layout_model_on_a_cpu(tmp_path: Path) -> None:
    version = releases.PINNED["transformers"]
    from test_mineru_ocr import fake_dist

    env = install_release(tmp_path / "env", "transformers", version, LAYOUT_FILE)
    fake_dist(env.site, "mineru", releases.PINNED["mineru"])
    result = env.cli("apply", "--only", LAYOUT_ID)
    assert result.returncode == 0, result.stderr
    path = [str(releases.importable("huggingface-hub", "1.33.0"))]
    path += [str(releases.importable("tokenizers", "0.23.3")), str(env.site)]
    path.append(str(Path(__file__).parent))
    done = subprocess.run(
        [sys.executable, "-c", LAYOUT_RUN, json.dumps(path)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env=second_sighting(),
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["pass-through"] is True
    assert found["graphed"] == [True] * 3 and found["replays"] == 2, found
    assert found["stats"]["graphs"] == 1 and found["stats"]["counts"]["replayed"] == 2
