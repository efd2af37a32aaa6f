"""MinerU's pytorchocr files (PP-OCRv6, PP-FormulaNet): every MinerU 3.x and 4.0.x wheel from
PyPI read and rewritten, apply/revert through the real CLI, and the real models run.

The models are built from the arch configs inside the installed wheel (random weights, no hub):
PP-OCRv6 det tiny and rec small (``BaseModel``) and the PP-FormulaNet_plus-M encoder
(``PPHGNetV2_B6_Formula``). rocmfix patches the installed files through the CLI; a fresh
process then imports the patched files with their GPU guard read as true, so CPU inputs take
the routed branch: the depthwise convs run the Triton kernel in the interpreter
(``TRITON_INTERPRET=1``), the transposed convs the GEMM and pixel shuffle. Outputs equal the
stock ones (fp32), and no depthwise or transposed ``aten.convolution`` is left in the routed
forward, by what runs: a TorchDispatchMode records every ``aten.convolution`` (17 + 2, 14 and
57 in the stock forwards; torch.profiler would make the interpreter a hundred times slower).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import libcst as cst
import pytest
from packaging.version import Version

from rocmfix.patch import CodeShape, Patch, TargetContext, TorchInfo
from rocmfix.registry import all_patches

import releases
from conftest import InstalledEnv, fake_torch, files_under, install_release

pytestmark = pytest.mark.network

CTX = TargetContext(version="0", versions={}, torch=TorchInfo("2.9.1", "7.2.0", None))
NEW, OLD = "mineru/model/_internal/pytorchocr", "mineru/model/utils/pytorchocr"
TORCH, HIP = "2.9.1+rocm7.2", "7.2.26015-fc0010cf6a"


def ocr_patches() -> list[Patch]:
    """The kernel routes of MinerU's OCR models (the graph patches of its predictors have
    tests of their own: tests/test_mineru_graphs.py)."""
    return [
        p
        for p in all_patches()
        if p.id.startswith(("mineru-ocr-", "mineru-utils-ocr-")) and not p.id.endswith("-graphs")
    ]


def _releases() -> list[str]:
    """Every final release from 3.0.0, and the first and last of each 2.x minor line."""
    every = [v for v in releases.releases("mineru") if Version(v).pre is None]
    picked = {v for v in every if Version(v) >= Version("3.0.0")}
    for minor in {Version(v).release[:2] for v in every if Version(v).major == 2}:
        line = [v for v in every if Version(v).release[:2] == minor]
        picked |= {line[0], line[-1]}
    return sorted(picked, key=Version)


def test_every_mineru_3_and_4_release() -> None:
    """Each file a release has is recognised (needs the patch, or has no such layer yet) and
    rewritten into code that compiles and reads as rocmfix's own; 3.4.x and 4.0.x need all
    five."""
    patches = ocr_patches()
    needs: dict[str, set[str]] = {}
    # Releases whose model files are byte-identical are checked once.
    for versions, files in releases.distinct("mineru", _releases(), [p.path for p in patches]):
        for p in patches:
            data = files[p.path]
            if data is None:
                continue
            found = p.classify(p.parse(data), CTX)
            assert found.shape in (CodeShape.NEEDS_PATCH, CodeShape.FIXED_UPSTREAM), (
                versions,
                p.id,
                found,
            )
            if found.shape is CodeShape.FIXED_UPSTREAM:
                continue
            patched = p.transform(cst.parse_module(data)).code
            compile(patched, f"{versions[0]}/{p.path}", "exec")
            assert p.classify(p.parse(patched.encode()), CTX).shape is CodeShape.PATCHED
            for version in versions:
                needs.setdefault(version, set()).add(p.id)
    assert needs["3.4.5"] == {p.id for p in patches if p.id.startswith("mineru-utils-ocr-")}
    assert needs[releases.PINNED["mineru"]] == {
        p.id for p in patches if p.id.startswith("mineru-ocr-")
    }
    # Before PP-OCRv6 (3.0.0): the DB head's transposed convs and the HGNetV2 backbone only.
    assert needs["3.0.0"] == {"mineru-utils-ocr-db-head", "mineru-utils-ocr-hgnetv2"}


def only_ocr(prefix: str) -> list[str]:
    """``--only`` naming each of ``prefix``'s OCR patches: their ops read ``unmeasured`` until
    ``doctor`` has measured them, and MinerU runs its small models in ONNX where the target
    env lacks torch's stack, so a patch id (the explicit override) is what patches them."""
    return [a for p in ocr_patches() if p.id.startswith(prefix) for a in ("--only", p.id)]


def fake_dist(site: Path, name: str, version: str) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("")


def _rocm_mineru(root: Path, version: str) -> InstalledEnv:
    target = f"{NEW if version.startswith('4') else OLD}/modeling/heads/det_db_head.py"
    env = install_release(root, "mineru", version, target)
    fake_torch(env.site, TORCH, hip=HIP)
    for name in ("torchvision", "transformers", "accelerate", "safetensors", "triton"):
        fake_dist(env.site, name, "3.8.0" if name == "triton" else "1.0")
    return env


@pytest.mark.parametrize("version", ["3.4.5", releases.PINNED["mineru"]])
def test_apply_and_revert_through_the_cli(tmp_path: Path, version: str) -> None:
    env = _rocm_mineru(tmp_path / "env", version)
    prefix = "mineru-ocr-" if version.startswith("4") else "mineru-utils-ocr-"
    before = files_under(env.site)
    result = env.cli("apply", *only_ocr(prefix))
    assert result.returncode == 0, result.stderr
    for name in ("lcnetv4", "hgnetv2", "replkfpn", "lightsvtr", "db-head"):
        assert f"{prefix}{name}: applied" in result.stderr, result.stderr
    package = NEW if version.startswith("4") else OLD
    assert (env.site / package / "modeling/rocmfix_depthwise_conv.py").is_file()
    assert (env.site / package / "modeling/rocmfix_conv_transpose.py").is_file()
    statuses = {p["id"]: p["verdict"] for p in env.cli("status", "--json").json()["patches"]}
    routes = {p.id for p in ocr_patches() if p.id.startswith(prefix)}
    assert {v for k, v in statuses.items() if k in routes} == {"applied"}
    result = env.cli("revert")
    assert result.returncode == 0, result.stderr
    assert files_under(env.site) == before


# What both real-model scripts share: argv is (site-packages, mode, store, root of the patched
# files); ``Forced`` imports a patched file with rocmfix's GPU guard read as true, so CPU inputs
# take the routed branch; ``Spy`` counts the convs left to torch; ``compare`` saves the stock
# outputs or checks the patched ones against them. The model part defines ``models()``.
PRELUDE = r"""
import ast, copy, importlib.abc, importlib.machinery, json, os, sys, types, warnings
# ROCMFIX_TEST_DEVICE=cuda runs the same check on a GPU (the guard is true there anyway).
device = os.environ.get("ROCMFIX_TEST_DEVICE", "cpu")
if device == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
import torch

# fp32 means fp32 on a GPU too (cuDNN's convs default to TF32), so stock is a fair reference.
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
site, mode, store, root = sys.argv[1:5]


class Forced(importlib.machinery.SourceFileLoader):
    def source_to_code(self, data, path, *, _optimize=-1):
        tree = ast.parse(data)
        for node in ast.walk(tree):
            test = getattr(node, "test", None)
            if not (isinstance(node, ast.If) and isinstance(test, ast.BoolOp)):
                continue
            first = test.values[0]
            if isinstance(first, ast.Compare) and getattr(first.left, "id", "").startswith(
                "_rocmfix_"
            ):
                test.values = [
                    ast.Constant(True)
                    if isinstance(v, ast.Attribute) and v.attr == "is_cuda" else v
                    for v in test.values
                ]
        return compile(ast.fix_missing_locations(tree), path, "exec")


class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec and spec.origin and spec.origin.startswith(root):
            with open(spec.origin, "rb") as f:
                if b"# rocmfix:" in f.read():
                    spec.loader = Forced(name, spec.origin)
        return spec


# After the real torch: the environment holds only a torch's metadata for rocmfix to read.
sys.path.append(site)
if mode == "patched":
    sys.meta_path.insert(0, Finder())
    warnings.simplefilter("error")  # a kernel that falls back to the stock op warns


from torch.utils._python_dispatch import TorchDispatchMode


class Spy(TorchDispatchMode):
    # Every aten.convolution that actually runs, as the dispatcher sees it (whoever called it:
    # a module, F.conv2d, a kernel's fallback), with its kind, groups, stride and kernel. The
    # profiler would see the same ops but makes Triton's interpreter a hundred times slower.
    def __init__(self):
        super().__init__()
        self.depthwise = self.transposed = self.other = 0
        self.left = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        # Under inference_mode a mode sees aten.conv2d itself, elsewhere aten.convolution: each
        # conv once either way.
        if name in ("convolution", "_convolution"):
            conv = args[0], args[1], args[3], args[6], args[8]
        elif name in ("conv2d", "conv_transpose2d"):
            get = lambda i, k, d: args[i] if len(args) > i else (kwargs or {}).get(k, d)
            conv = args[0], args[1], get(3, "stride", [1]), name != "conv2d", get(6, "groups", 1)
        else:
            conv = None
        if conv is not None:
            x, w, stride, transposed, groups = conv
            kernel = list(w.shape[2:])
            if transposed:
                self.transposed += 1
                self.left.append(["transposed", kernel, list(stride), groups])
            elif groups > 1 and groups == x.shape[1] and w.shape[1] == 1:
                self.depthwise += 1
                self.left.append(["depthwise", kernel, list(stride), groups])
            else:
                self.other += 1
        return func(*args, **(kwargs or {}))


def flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for k in sorted(out) for t in flat(out[k])]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in flat(o)]
    if hasattr(out, "__dict__"):
        return [t for k in sorted(vars(out)) for t in flat(vars(out)[k])]
    return []


def compare(models):
    report = {}
    for name, model, inputs in models:
        model = model.eval().to(device)
        inputs = {k: v.to(device) for k, v in inputs.items()}
        # Non-trivial BatchNorm statistics, so a BatchNorm applied in the kernel's store counts.
        torch.manual_seed(2)
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
        spy = Spy()
        with torch.no_grad(), spy:
            outs = [t.cpu() for t in flat(model(**inputs))]
        if device != "cpu":
            torch.cuda.synchronize()
        path = os.path.join(store, name + ".pt")
        entry = {"depthwise": spy.depthwise, "transposed": spy.transposed, "other": spy.other}
        if mode == "patched":
            entry["left"] = spy.left
        if mode == "stock":
            torch.save(outs, path)
        else:
            stock = torch.load(path)
            assert len(stock) == len(outs)
            entry["err"] = max(
                ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()
                for a, b in zip(outs, stock)
                if a.is_floating_point()
            )
        report[name] = entry
    print(json.dumps(report))
"""

OCR = r"""
import yaml

package = "mineru.model._internal.pytorchocr"
wanted = os.environ["ROCMFIX_TEST_MODELS"].split(",")
# MinerU's package __init__ imports its whole document stack; the OCR models need none of it.
stub = types.ModuleType("mineru")
stub.__path__ = [os.path.join(site, "mineru")]
sys.modules["mineru"] = stub
base = importlib.import_module(package + ".modeling.architectures.base_model")
backbones = importlib.import_module(package + ".modeling.backbones")
resources = os.path.join(site, *package.split("."), "utils", "resources")
with open(os.path.join(resources, "arch_config.yaml")) as f:
    arch = yaml.safe_load(f)
with open(os.path.join(resources, "pp_formulanet_arch_config.yaml")) as f:
    formula = yaml.safe_load(f)
if mode == "patched" and device == "cpu":
    head = importlib.import_module(package + ".modeling.heads.det_db_head")
    assert head._rocmfix_conv_transpose2d is not None
    ct = importlib.import_module(package + ".modeling.rocmfix_conv_transpose")
    # The entry keeps CPU tensors on the stock op; its GEMM and pixel shuffle run here.
    head._rocmfix_conv_transpose2d = lambda x, d: (
        ct.gemm(x, d.weight, d.bias) if ct.handled(x, d) else d(x)
    )


def models():
    torch.manual_seed(0)
    if "det" in wanted:
        det = base.BaseModel(copy.deepcopy(arch["ch_PP-OCRv6_tiny_det_infer"]))
        yield "det", det, {"x": torch.randn(1, 3, 64, 96)}
    if "rec" in wanted:
        rec = base.BaseModel(copy.deepcopy(arch["ch_PP-OCRv6_small_rec_infer"]))
        yield "rec", rec, {"x": torch.randn(1, 3, 48, 160)}
    if "formula" in wanted:
        backbone = formula["PP-FormulaNet_plus-M"]["Architecture"]["Backbone"]
        encoder = backbones.build_backbone(copy.deepcopy(backbone), "rec")
        yield "formula", encoder, {"input_data": torch.randn(1, 3, 64, 64)}


compare(models())
"""


# Triton's interpreter pays per program and loop step, not per element: 32 channels a program
# (the shipped tiles take one) run these models' depthwise convs about six times faster on
# the CPU (rec: 82 s to 14 s). What the model tests check, the routing and the numbers, is
# the same for any tile; the tiles themselves are tests/test_depthwise_templates.py's.
INTERPRETER_TILE = {"ROCMFIX_DEPTHWISE_CONV_CONFIG": '{"BLOCK_C": 32}'}


def run_model(
    script: str,
    site: Path,
    mode: str,
    store: Path,
    root: Path,
    path: Sequence[Path] = (),
    env: dict[str, str] | None = None,
) -> dict[str, dict[str, float]]:
    """Run ``PRELUDE`` + ``script`` in a fresh interpreter (``path`` first on its sys.path)."""
    code = f"import sys; sys.path[:0] = {[str(p) for p in path]!r}\n" + PRELUDE + script
    done = subprocess.run(
        [sys.executable, "-c", code, str(site), mode, str(store), str(root)],
        capture_output=True,
        text=True,
        timeout=3000,
        check=False,
        env={**os.environ, **INTERPRETER_TILE, **(env or {})},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report: dict[str, dict[str, float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


# Depthwise and transposed aten.convolution calls per stock forward, as MinerU runs the
# models (the counts); the routed forward must leave none of either.
COUNTS = {"det": (17, 2), "rec": (14, 0), "formula": (57, 0)}


# All three run in the suite: with the interpreter's tile (INTERPRETER_TILE) det takes about
# 11 s, rec 14 and the formula encoder 46 on two cores, where one channel a program made det
# and the formula encoder 10-16 minutes each.
@pytest.mark.parametrize("model", list(COUNTS))
def test_the_real_models_match_stock(tmp_path: Path, model: str) -> None:
    env = _rocm_mineru(tmp_path / "env", releases.PINNED["mineru"])
    root = env.site / NEW
    which = {"ROCMFIX_TEST_MODELS": model}
    stock = run_model(OCR, env.site, "stock", tmp_path, root, env=which)[model]
    assert (stock["depthwise"], stock["transposed"]) == COUNTS[model], stock
    result = env.cli("apply", *only_ocr("mineru-ocr-"))
    assert result.returncode == 0, result.stderr
    patched = run_model(OCR, env.site, "patched", tmp_path, root, env=which)[model]
    assert patched["depthwise"] == patched["transposed"] == 0, patched["left"]
    assert patched["other"] == stock["other"], patched
    assert patched["err"] < 1e-4, patched
