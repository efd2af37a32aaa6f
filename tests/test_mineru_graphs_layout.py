"""PP-DocLayoutV2 and PP-FormulaNet's encoder replayed as graphs (patches/mineru_graphs.py,
issue 41 item 2): golden code written for these tests, every release that has the target
files, apply and revert through the real CLI, and the real patched files run on the CPU.

PP-DocLayoutV2's forward copies host values into device tensors, which a capture refuses;
:class:`graphs_fake.HostSyncs` finds those copies on a CPU (fake ``cuda`` tensors), in the
stock file and, none left, in the patched one. The capture logic runs through
:class:`graphs_fake.CpuGraphs`; the GPU side is bench/graphs_gpu.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import libcst as cst
import pytest
from graphs_fake import second_sighting
from packaging.version import Version

from rocmfix.errors import AnchorNotFoundError
from rocmfix.patch import CodeShape, Patch, TargetContext
from rocmfix.registry import all_patches

import releases
from conftest import ROOT, InstalledEnv, fake_torch, files_under, install_release

GOLDEN = Path(__file__).resolve().parent / "golden"
CTX = TargetContext(version="0", versions={}, torch=None)
WITH_MINERU = TargetContext(version="0", versions={"mineru": "4.0.12"}, torch=None)
LAYOUT_ID = "transformers-pp-doclayout-v2-graphs"
MASKS_ID = "transformers-eager-mask-graphs"
MINERU_ID = "mineru-layout-graphs"
FORMULA_ID = "mineru-formula-encoder-graphs"
LAYOUT_FILE = "transformers/models/pp_doclayout_v2/modeling_pp_doclayout_v2.py"
MINERU_LAYOUT_FILE = "mineru/model/layout/pp_doclayoutv2.py"
HERE = str(Path(__file__).parent)


def _patch(patch_id: str) -> Patch:
    return next(p for p in all_patches() if p.id == patch_id)


def _golden(patch: Patch, source: str) -> bytes:
    after = patch.transform(cst.parse_module((GOLDEN / f"{source}.py").read_bytes())).bytes
    golden = GOLDEN / f"{source}.graphs.patched.py"
    if os.environ.get("ROCMFIX_UPDATE_GOLDEN"):
        golden.write_bytes(after)
    assert after == golden.read_bytes()
    assert patch.classify(patch.parse(after), CTX).shape is CodeShape.PATCHED
    return after


# ------------------------------------------------------------------ golden (no network)


def test_mineru_layout_golden() -> None:
    """The predictor's call of the whole detector is routed; a call elsewhere stays."""
    patch = _patch(MINERU_ID)
    found = patch.classify(patch.parse((GOLDEN / "layout_predictor.py").read_bytes()), CTX)
    assert found.shape is CodeShape.NEEDS_PATCH, found
    assert "PPDocLayoutV2LayoutModel calls self.model(...) once" in found.reason
    after = _golden(patch, "layout_predictor")
    assert b"_rocmfix_graph_forward(self.model, pixel_values=batch)" in after
    assert b"        y = self.model(pixel_values=x)\n" in after
    assert b"_rocmfix_graph_constant" not in after  # no host values rewritten in MinerU
    assert patch.drop_paths == {"mineru/model/layout/rocmfix_graphs.py"}


def test_formula_encoder_golden() -> None:
    """BaseModel's backbone call (the encoder) is routed; its head (the autoregressive
    decoder) and the same call in another class stay."""
    patch = _patch(FORMULA_ID)
    found = patch.classify(patch.parse((GOLDEN / "formula_encoder.py").read_bytes()), CTX)
    assert (
        found.shape is CodeShape.NEEDS_PATCH
        and "BaseModel calls self.backbone(...) once" in found.reason
    ), found
    after = _golden(patch, "formula_encoder")
    assert b"            x = _rocmfix_graph_forward(self.backbone, x)\n" in after
    assert b"            x = self.head(x)\n" in after
    assert b"        out = self.backbone(x)  # not BaseModel" in after
    none = patch.classify(patch.parse((GOLDEN / "layout_predictor.py").read_bytes()), CTX)
    assert none.shape is CodeShape.FIXED_UPSTREAM and "no BaseModel" in none.reason


def test_eager_mask_golden() -> None:
    """A number sent to a device per call is made there; on the host or a list, it stays.
    Beside MinerU only."""
    patch = _patch(MASKS_ID)
    data = (GOLDEN / "eager_mask.py").read_bytes()
    found = patch.classify(patch.parse(data), WITH_MINERU)
    assert found.shape is CodeShape.NEEDS_PATCH and found.reason.startswith("2 "), found
    alone = patch.classify(patch.parse(data), CTX)
    assert alone.shape is CodeShape.FIXED_UPSTREAM and "no mineru" in alone.reason
    after = _golden(patch, "eager_mask")
    assert after.count(b"torch.full((), ") == 2 and after.count(b"torch.tensor(") == 2
    with pytest.raises(AnchorNotFoundError):  # nothing left to rewrite
        patch.transform(cst.parse_module(after))


def test_host_syncs_names_each_copy_a_capture_refuses() -> None:
    """On fake ``cuda`` tensors: every copy from the host, those ATen makes below the
    dispatcher included (indices on the host, moved to the device first), and none where
    ATen does not wait."""
    import torch
    from graphs_fake import HostSyncs
    from torch._subclasses.fake_tensor import FakeTensorMode

    host = "a copy from the host"
    cases = {
        "x[torch.tensor([0, 1])]": (lambda x: x[torch.tensor([0, 1])], host),
        "x[torch.tensor([0, 1])] = 1.0": (
            lambda x: x.__setitem__(torch.tensor([0, 1]), 1.0),
            host,
        ),
        "torch.tensor(0.0, device=...)": (lambda x: torch.tensor(0.0, device=x.device), host),
        "torch.as_tensor([1, 2]).to(...)": (lambda x: torch.as_tensor([1, 2]).to(x.device), host),
        "x[torch.arange(2, device=...)]": (lambda x: x[torch.arange(2, device=x.device)], None),
        "x + torch.tensor(2.0)": (lambda x: x + torch.tensor(2.0), None),
        "x[x > 0] = 1.0": (lambda x: x.__setitem__(x > 0, 1.0), None),
    }
    with FakeTensorMode():
        for name, (run, want) in cases.items():
            with HostSyncs("test_mineru_graphs_layout.py") as syncs:
                run(torch.zeros(4, 4, device="cuda"))
            got = [why.split(" (")[0] for why, _ in syncs.found]
            assert got == ([] if want is None else [want]), (name, syncs.found)


# ------------------------------------------------------------------ real releases (PyPI)


@pytest.mark.network
def test_every_mineru_release_with_the_layout_and_formula_files() -> None:
    """MinerU's layout predictor from 3.0.0, BaseModel in 4.0.x's folder from 4.0.0: each
    rewritten, compiled, read back as patched; none before."""
    patches = [_patch(MINERU_ID), _patch(FORMULA_ID)]
    seen: dict[str, list[str]] = {p.id: [] for p in patches}
    finals = [
        v
        for v in releases.releases("mineru")
        if Version(v).pre is None and Version(v) >= Version("2.7")
    ]
    # Releases whose two files are byte-identical are checked once.
    for versions, files in releases.distinct("mineru", finals, [p.path for p in patches]):
        for p in patches:
            data = files[p.path]
            if data is None:
                continue
            found = p.classify(p.parse(data), CTX)
            assert found.shape is CodeShape.NEEDS_PATCH, (versions, p.id)
            patched = p.transform(cst.parse_module(data)).code
            compile(patched, f"{versions[0]}/{p.path}", "exec")
            assert p.classify(p.parse(patched.encode()), CTX).shape is CodeShape.PATCHED
            assert patched.count("_rocmfix_graph_forward(self.") == 1
            seen[p.id] += versions
    assert min(seen[MINERU_ID], key=Version) == "3.0.0"
    assert min(seen[FORMULA_ID], key=Version) == "4.0.0"
    assert (
        releases.PINNED["mineru"] in seen[MINERU_ID]
        and releases.PINNED["mineru"] in seen[FORMULA_ID]
    )


# Under torch's FakeTensorMode (cuda tensors without a GPU), the ops of two detector forwards
# that would wait for the host: argv: the folders to import from. The runner's backend is told
# no tensor is on a device, so its calls pass through.
SYNCS = r"""
import json, sys
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
sys.path[:0] = json.loads(sys.argv[1])
from transformers import PPDocLayoutV2Config, PPDocLayoutV2ForObjectDetection
import transformers.models.pp_doclayout_v2.modeling_pp_doclayout_v2 as modeling
from graphs_fake import HostSyncs

runner = getattr(modeling, "_rocmfix_graph_forward", None)
if runner is not None:
    sys.modules[runner.__module__]._BACKEND.on_device = lambda t: False
config = PPDocLayoutV2Config()
config.class_thresholds = [0.5] * config.num_labels
config.class_order = list(range(config.num_labels))
found = []
with FakeTensorMode():
    with torch.device("cuda"):
        model = PPDocLayoutV2ForObjectDetection(config).eval()
    x = torch.randn(1, 3, 800, 800, device="cuda")
    for _ in range(2):
        with torch.no_grad(), HostSyncs("modeling_pp_doclayout_v2.py") as syncs:
            model(pixel_values=x)
        found.append(syncs.found)
print(json.dumps(found))
"""


def _python(code: str, *args: str) -> object:
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env=second_sighting(),
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _hub(tokenizers: str = "0.23.3") -> list[str]:
    return [
        str(releases.importable("huggingface-hub", "1.33.0")),
        str(releases.importable("tokenizers", tokenizers)),
        HERE,
    ]


def _linked(root: Path, site: Path, *packages: str) -> str:
    """A folder holding only ``packages`` from ``site`` (links): the site's fake torch
    metadata stays off the path."""
    root.mkdir()
    for name in packages:
        (root / name).symlink_to(site / name)
    return str(root)


@pytest.mark.network
def test_every_host_sync_of_the_real_layout_forward_is_gone(tmp_path: Path) -> None:
    """The stock detector makes nine copies from the host per forward (the six
    ``spatial_shapes`` writes, the two ``torch.tensor(self.config...)`` and the reading-order
    head's ``index_put_``); the patched one makes each once, on its first call, and none on
    the next."""
    version = releases.PINNED["transformers"]
    stock = releases.importable("transformers", version)
    found = _python(SYNCS, json.dumps([str(stock), *_hub()]))
    assert isinstance(found, list)
    lines = sorted({where.split(":")[1].strip().split(" =")[0] for _, where in found[1]})
    assert lines == [
        "class_order",
        "class_thresholds",
        "input_ids[torch.arange(batch_size, device=device), end_col_indices]",
        "spatial_shapes[level, 0]",
        "spatial_shapes[level, 1]",
    ]
    assert len(found[1]) == 9 and {why for why, _ in found[1]} == {
        "a copy from the host",
        "a copy from the host (index_put_ sends its value over)",
    }
    env = install_release(tmp_path / "env", "transformers", version, LAYOUT_FILE)
    from test_mineru_ocr import fake_dist

    fake_dist(env.site, "mineru", releases.PINNED["mineru"])
    result = env.cli("apply", "--only", LAYOUT_ID)
    assert result.returncode == 0, result.stderr
    found = _python(SYNCS, json.dumps([str(env.site), *_hub()]))
    assert isinstance(found, list)
    assert len(found[0]) == 6 and found[1] == [], found  # heights and widths equal: 3 + 3


def _overlay(here: Path, source: Path, files: dict[str, bytes]) -> None:
    """``source`` under ``here``, linked entry by entry, but for ``files`` (paths relative to
    ``source``), written; the folders on their way made, their other entries linked."""
    here.mkdir(parents=True, exist_ok=True)
    below: dict[str, dict[str, bytes]] = {}
    for rel, data in files.items():
        head, _, rest = rel.partition("/")
        if rest:
            below.setdefault(head, {})[rest] = data
        else:
            (here / head).write_bytes(data)
    for entry in source.iterdir():
        if entry.name in below:
            _overlay(here / entry.name, entry, below[entry.name])
        elif entry.name != "__pycache__" and not (here / entry.name).exists():
            (here / entry.name).symlink_to(entry)


# (release, its host copies per stock forward): the nine of 5.24.0's, and in 5.3.0-5.20.1
# masking_utils.eager_mask's torch.tensor(0.0, device=...), which the reading-order head's
# eager mask makes (the copy an H100 capture refused on 5.17.0). 5.23.0 is the last release
# whose reading-order head runs eager attention only. 5.17.0's patched forward is the one
# test_apply_and_revert_both_rewrites_on_5_17_through_the_cli runs, from apply's own files.
RELEASES = (("5.3.0", 10), ("5.20.1", 10), ("5.20.2", 9), ("5.23.0", 9))


def _stock_copies(version: str, copies: int) -> tuple[Path, list[str], list[Any]]:
    """The stock release, the import path its forward needs, and the host copies of its two
    forwards, ``copies`` of them in the second; the eager mask's among them past nine."""
    stock = releases.importable("transformers", version)
    table = (stock / "transformers" / "dependency_versions_table.py").read_text()
    path = [*_hub("0.23.0rc0" if "<=0.23.0" in table else "0.23.3")]
    found = _python(SYNCS, json.dumps([str(stock), *path]))
    assert isinstance(found, list) and len(found[1]) == copies, found[1]
    masks = [w for _, w in found[1] if "create_bidirectional_mask(" in w]
    assert len(masks) == copies - 9, found[1]
    return stock, path, found


@pytest.mark.network
@pytest.mark.parametrize(("version", "copies"), RELEASES)
def test_no_host_copy_is_left_on_any_release(tmp_path: Path, version: str, copies: int) -> None:
    """Both rewrites (the detector's file and, where its eager mask copies, masking_utils)
    leave no copy from the host after the first forward, on every shape of the files."""
    stock, path, found = _stock_copies(version, copies)
    # 5.3.0-5.14.x make the anchors' fill with torch.tensor too, once: their cache keeps them.
    anchors = sum("torch.tensor(torch.finfo(dtype).max" in w for _, w in found[0])
    masks = copies > 9
    ctx = TargetContext(version=version, versions={"mineru": "4.0.12"}, torch=None)
    files: dict[str, bytes] = {}
    for patch_id in (LAYOUT_ID, MASKS_ID):
        patch = _patch(patch_id)
        data = (stock / patch.path).read_bytes()
        shape = patch.classify(patch.parse(data), ctx).shape
        needed = patch_id == LAYOUT_ID or masks
        assert shape is (CodeShape.NEEDS_PATCH if needed else CodeShape.FIXED_UPSTREAM)
        if needed:
            files[patch.path] = patch.transform(cst.parse_module(data)).bytes
    runner = (ROOT / "templates" / "rocmfix_graphs.py").read_bytes()
    files[f"{LAYOUT_FILE.rsplit('/', 1)[0]}/rocmfix_graphs.py"] = runner
    _overlay(tmp_path, stock, files)
    found = _python(SYNCS, json.dumps([str(tmp_path), *path]))
    assert isinstance(found, list)
    assert len(found[0]) == 6 + anchors and found[1] == [], found


@pytest.mark.network
def test_apply_and_revert_both_rewrites_on_5_17_through_the_cli(tmp_path: Path) -> None:
    """The release the H100 capture failed on: its stock forward makes the eager mask's copy
    too (ten), apply rewrites the detector's file and masking_utils, the forward makes no copy
    from the host after its first, and revert puts every file back."""
    _stock_copies("5.17.0", 10)
    env = install_release(tmp_path / "env", "transformers", "5.17.0", LAYOUT_FILE)
    from test_mineru_ocr import fake_dist

    fake_dist(env.site, "mineru", releases.PINNED["mineru"])
    before = files_under(env.site)
    result = env.cli("apply", "--only", LAYOUT_ID, "--only", MASKS_ID)
    assert result.returncode == 0, result.stderr
    for patch_id in (LAYOUT_ID, MASKS_ID):
        assert f"{patch_id}: applied" in result.stderr, result.stderr
    statuses = {p["id"]: p["verdict"] for p in env.cli("status", "--json").json()["patches"]}
    assert statuses[LAYOUT_ID] == statuses[MASKS_ID] == "applied"
    path = _hub("0.23.3")
    found = _python(
        SYNCS, json.dumps([_linked(tmp_path / "path", env.site, "transformers"), *path])
    )
    assert isinstance(found, list)
    assert len(found[0]) == 6 and found[1] == [], found
    result = env.cli("revert")
    assert result.returncode == 0, result.stderr
    assert files_under(env.site) == before


def _both(root: Path) -> InstalledEnv:
    """The pinned MinerU and transformers in one venv, as MinerU's torch stack has them."""
    env = install_release(root, "mineru", releases.PINNED["mineru"], MINERU_LAYOUT_FILE)
    releases.pip_install(
        env.python, releases.wheel("transformers", releases.PINNED["transformers"])
    )
    fake_torch(env.site, "2.9.1+rocm7.2", hip="7.2.26015-fc0010cf6a")
    return env


IDS = ("--only", LAYOUT_ID, "--only", MINERU_ID, "--only", FORMULA_ID)


@pytest.mark.network
def test_apply_dry_run_status_and_revert_through_the_cli(tmp_path: Path) -> None:
    env = _both(tmp_path / "env")
    before = files_under(env.site)
    dry = env.cli("apply", "--dry-run", *IDS)
    assert dry.returncode == 0, dry.stderr
    added = [line for line in dry.stdout.splitlines() if line.startswith("+")]
    assert (
        sum("= _rocmfix_graph_forward(self.model, pixel_values=batch_tensor)" in a for a in added)
        == 1
    )
    assert sum("x = _rocmfix_graph_forward(self.backbone, x)" in a for a in added) == 1
    assert sum("= _rocmfix_graph_constant(" in a for a in added) == 5
    assert files_under(env.site) == before
    result = env.cli("apply", *IDS)
    assert result.returncode == 0, result.stderr
    for patch_id in (LAYOUT_ID, MINERU_ID, FORMULA_ID):
        assert f"{patch_id}: applied" in result.stderr, result.stderr
        dropped = env.site / _patch(patch_id).path.rsplit("/", 1)[0] / "rocmfix_graphs.py"
        assert dropped.read_bytes() == (ROOT / "templates" / "rocmfix_graphs.py").read_bytes()
    statuses = {p["id"]: p["verdict"] for p in env.cli("status", "--json").json()["patches"]}
    assert [statuses[i] for i in (LAYOUT_ID, MINERU_ID, FORMULA_ID)] == ["applied"] * 3
    result = env.cli("revert")
    assert result.returncode == 0, result.stderr
    assert files_under(env.site) == before


# MinerU's real patched layout predictor over the real patched detector, on a CPU. argv: the
# folders to import from. The stock outputs first (the runner passes CPU inputs through),
# then with the stand-in backend: the whole detector captured at its 2nd call, replayed after,
# its backbone held inside that graph; then each fallback.
WHOLE = r"""
import copy, json, sys, types, os, warnings
import numpy as np, torch
sys.path[:0] = json.loads(sys.argv[1])


class Anything(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: None


# MinerU's layout helpers import docvortex (its image helpers), which the forward never calls.
for name in ("docvortex", "docvortex.image", "docvortex.geometry", "docvortex.schema"):
    sys.modules[name] = Anything(name)
stub = types.ModuleType("mineru")
stub.__path__ = [os.path.join(sys.path[0], "mineru")]
sys.modules["mineru"] = stub
from transformers import PPDocLayoutV2Config, PPDocLayoutV2ForObjectDetection
import transformers.models.pp_doclayout_v2.modeling_pp_doclayout_v2 as modeling
import mineru.model.layout.pp_doclayoutv2 as layout
from graphs_fake import CpuGraphs

config = PPDocLayoutV2Config()
config.class_thresholds = [0.5] * config.num_labels
config.class_order = list(range(config.num_labels))
config.num_queries = 16
torch.manual_seed(0)
predictor = object.__new__(layout.PPDocLayoutV2LayoutModel)
predictor.model = PPDocLayoutV2ForObjectDetection(config).eval()
predictor.device, predictor.imgsz, predictor.rescale_factor = "cpu", (64, 64), 1 / 255
predictor.use_paddlex_filter_boxes = False
seen = []
predictor._post_process_object_detection = lambda outputs, sizes: seen.append(outputs) or []
image = np.random.default_rng(1).integers(0, 255, (48, 40, 3), dtype=np.uint8)
KEYS = ("logits", "pred_boxes", "order_logits")


def forward():
    predictor.batch_predict([image])  # the rewritten line: outputs = self.model(pixel_values=...)
    return {k: seen[-1][k].clone() for k in KEYS}


same = lambda a, b: all(torch.equal(a[k], b[k]) for k in KEYS)
runner = sys.modules[layout._rocmfix_graph_forward.__module__]
inner = sys.modules[modeling._rocmfix_graph_forward.__module__]
backbone = predictor.model.model.backbone.model
report = {"two runners": runner is not inner}
stock = forward()
report["cpu"] = [same(forward(), stock) for _ in range(2)]
report["cpu stats"] = [runner.stats(predictor.model), inner.stats(backbone)]
fake = CpuGraphs()
fake.inside = runner._capturing
runner._BACKEND = inner._BACKEND = fake
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("error")  # as under python -W error: nothing may raise in the forward
    report["replayed"] = [same(forward(), stock) for _ in range(4)]
    report["stats"] = runner.stats(predictor.model)
    report["backbone"] = inner.stats(backbone)
    report["replays"] = fake.replays

    def eager(run):
        # the stock call of the same files, the same random draws (training's dropout)
        torch.manual_seed(3)
        got = run()
        runner.ENABLED = inner.ENABLED = False
        torch.manual_seed(3)
        want = run()
        runner.ENABLED = inner.ENABLED = True
        return same(got, want)

    x = torch.randn(1, 3, 64, 64)  # grad mode: MinerU calls it under no_grad; here, outside
    graphed = layout._rocmfix_graph_forward
    report["grad mode"] = eager(lambda: graphed(predictor.model, pixel_values=x))
    kept, predictor.model = predictor.model, copy.deepcopy(predictor.model).train()
    report["training"] = eager(forward)
    predictor.model = kept
    runner.MAX_CAPTURES = 1
    predictor.imgsz = (96, 64)
    wide = [forward() for _ in range(3)]
    report["past the cap"] = [same(w, wide[0]) for w in wide]
    runner.MAX_CAPTURES, predictor.imgsz = 64, (64, 64)
    fake.fail_capture = RuntimeError("operation not permitted when stream is capturing")
    predictor.model = copy.deepcopy(kept)  # a model the runner has not seen
    report["capture raises"] = [same(forward(), stock) for _ in range(3)]
    report["broken"] = runner.stats(predictor.model)["broken"]
report["warnings"] = [str(w.message) for w in caught]
print(json.dumps(report))
"""


# MinerU's real patched BaseModel with PP-FormulaNet_plus-S's architecture (its encoder is
# PPHGNetV2_B4_Formula), on a CPU, its head off (the decoder stays eager): the encoder through
# the stand-in backend, rebuilt as the same output object. argv: the folders to import from.
FORMULA = r"""import copy, importlib, json, os, sys, types, warnings
import torch, yaml
sys.path[:0] = json.loads(sys.argv[1])
stub = types.ModuleType("mineru")
stub.__path__ = [os.path.join(sys.path[0], "mineru")]
sys.modules["mineru"] = stub
from graphs_fake import CpuGraphs

package = "mineru.model._internal.pytorchocr"
base = importlib.import_module(package + ".modeling.architectures.base_model")
resources = os.path.join(sys.path[0], *package.split("."), "utils", "resources")
with open(os.path.join(resources, "pp_formulanet_arch_config.yaml")) as f:
    arch = yaml.safe_load(f)["PP-FormulaNet_plus-S"]["Architecture"]
torch.manual_seed(0)
model = base.BaseModel(copy.deepcopy(arch)).eval()
model.use_head = False  # the decoder is autoregressive: the rewritten line is the encoder's
x = torch.randn(1, 3, 64, 64)
report = {"patched": getattr(base, "_rocmfix_graph_forward", None) is not None}
with torch.inference_mode():
    stock = model(x)
    runner = sys.modules[base._rocmfix_graph_forward.__module__]
    fake = runner._BACKEND = CpuGraphs()
    fake.inside = runner._capturing
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("error")
        outs = [model(x) for _ in range(3)]
report["type"] = sorted({type(o).__name__ for o in outs})
state = stock.last_hidden_state
same = lambda o: torch.equal(o.last_hidden_state, state) and o.keys() == stock.keys()
report["equal"] = [same(o) for o in outs]
report["stats"] = runner.stats(model.backbone)
report["warnings"] = [str(w.message) for w in caught]
print(json.dumps(report))
"""


@pytest.mark.network
def test_the_real_patched_formula_encoder_on_a_cpu(tmp_path: Path) -> None:
    pinned = releases.PINNED["mineru"]
    env = install_release(tmp_path / "env", "mineru", pinned, _patch(FORMULA_ID).path)
    fake_torch(env.site, "2.9.1+rocm7.2", hip="7.2.26015-fc0010cf6a")
    result = env.cli("apply", "--only", FORMULA_ID)
    assert result.returncode == 0, result.stderr
    found = _python(FORMULA, json.dumps([_linked(tmp_path / "path", env.site, "mineru"), HERE]))
    assert isinstance(found, dict) and found["patched"] is True
    assert found["type"] == ["DonutSwinModelOutput"] and found["equal"] == [True] * 3
    assert found["stats"]["counts"] == {"eager": 1, "captured": 1, "replayed": 2}
    assert found["warnings"] == []


@pytest.mark.network
def test_the_real_patched_layout_predictor_on_a_cpu(tmp_path: Path) -> None:
    env = _both(tmp_path / "env")
    result = env.cli("apply", "--only", LAYOUT_ID, "--only", MINERU_ID)
    assert result.returncode == 0, result.stderr
    linked = _linked(tmp_path / "path", env.site, "mineru", "transformers")
    loguru = str(releases.importable("loguru", "0.7.3"))
    found = _python(WHOLE, json.dumps([linked, loguru, *_hub()]))
    assert isinstance(found, dict)
    assert found["two runners"] is True
    # A CPU input: the stock forward, nothing captured, nothing said.
    assert found["cpu"] == [True] * 2
    assert [s["captures"] for s in found["cpu stats"]] == [0, 0]
    # The whole detector: eager, captured (and replayed), replayed; equal to stock each time.
    assert found["replayed"] == [True] * 4 and found["replays"] == 3
    assert found["stats"]["counts"] == {"eager": 1, "captured": 1, "replayed": 3}
    # Its backbone ran inside the detector's graph: seen once eager, never a graph of its own.
    assert found["backbone"]["graphs"] == 0 and found["backbone"]["counts"] == {"eager": 1}
    assert found["grad mode"] is True and found["training"] is True
    assert found["past the cap"] == [True] * 3
    assert found["capture raises"] == [True] * 3
    assert str(found["broken"]).startswith("RuntimeError: operation not permitted")
    said = " | ".join(found["warnings"])
    for reason in ("grad mode", "training", "shape past the cap", "capture failed"):
        assert f"PPDocLayoutV2ForObjectDetection runs eager ({reason}:" in said, said
