"""The 1x1 conv op (``pointwise-conv``): its GEMM template against ``F.conv2d`` on the CPU, its
entry's fallbacks, the DocLayout-YOLO route (golden code written for these tests, then the
real release through the CLI and its model run down the GPU branch), and ``rocmfix profile``
naming it from the registry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import libcst as cst
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from rocmfix.ops import OPS, op
from rocmfix.patch import CodeShape, Patch, TargetContext
from rocmfix.registry import all_patches
from rocmfix.rewrite import MARKER

from conftest import ROOT, InstalledEnv, files_under, load_template

PATCH = "doclayout-pointwise-conv"
TARGET = "doclayout_yolo/nn/modules/conv.py"
DROP = "doclayout_yolo/nn/modules/rocmfix_pointwise_conv.py"
GOLDEN = Path(__file__).resolve().parent / "golden"
CTX = TargetContext(version="0", versions={}, torch=None)
OP = op("pointwise-conv")


@pytest.fixture(scope="module")
def gemm() -> Any:
    return load_template("pointwise_conv_gemm")


def _patch() -> Patch:
    return next(p for p in all_patches() if p.id == PATCH)


class Convs(TorchDispatchMode):
    """Counts the aten convolutions that actually run."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in (torch.ops.aten.convolution.default, torch.ops.aten.conv2d.default):
            self.count += 1
        return func(*args, **(kwargs or {}))


# (n, cin, cout, groups, h, w): dense, grouped (3 into 1 a group, as DocLayout-YOLO's), more
# out than in a group, odd sizes, one pixel, an empty batch.
SHAPES = [
    (1, 8, 16, 1, 5, 7),
    (2, 12, 6, 3, 3, 4),
    (3, 288, 96, 96, 7, 5),
    (2, 4, 12, 2, 5, 3),
    (2, 5, 7, 1, 1, 1),
    (1, 33, 17, 1, 13, 11),
    (0, 8, 4, 2, 3, 3),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("layout", ["nchw", "channels-last"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_the_gemm_computes_f_conv2d(
    gemm: Any, dtype: torch.dtype, layout: str, bias: bool, shape: tuple[int, ...]
) -> None:
    n, cin, cout, g, h, w = shape
    torch.manual_seed(0)
    x = torch.randn(n, cin, h, w, dtype=dtype)
    if layout == "channels-last":
        x = x.contiguous(memory_format=torch.channels_last)
    weight = torch.randn(cout, cin // g, 1, 1, dtype=dtype)
    b = torch.randn(cout, dtype=dtype) if bias else None
    got = gemm.conv2d(x, weight, b, 1, 0, 1, g)
    want = F.conv2d(x, weight, b, groups=g)
    assert got.shape == want.shape and got.dtype == want.dtype
    exact = F.conv2d(x.double(), weight.double(), None if b is None else b.double(), groups=g)
    limit = 1e-5 if dtype == torch.float32 else 4e-3
    scale = max([1.0, *exact.abs().flatten().tolist()])
    assert all(abs(e) <= limit * scale for e in (got.double() - exact).flatten().tolist())
    # The layout F.conv2d gives (where one is defined: a single pixel is both).
    if h * w > 1 and n > 0:
        for fmt in (torch.contiguous_format, torch.channels_last):
            assert got.is_contiguous(memory_format=fmt) == want.is_contiguous(memory_format=fmt)


def test_the_gemm_refuses_what_is_not_a_1x1_gemm(gemm: Any) -> None:
    x, w = torch.randn(1, 4, 5, 5), torch.randn(4, 4, 1, 1)
    for stride, padding in (((2, 2), 0), (1, 1), (1, (0, 1))):
        with pytest.raises(NotImplementedError):
            gemm.conv2d(x, w, None, stride, padding, 1, 1)
    with pytest.raises(NotImplementedError):
        gemm.conv2d(x, torch.randn(4, 4, 3, 3), None, 1, 1, 1, 1)
    # One channel in and one out per group (a per-channel scale): no GEMM in it, the vendor's
    # own path was 2-4x faster on an H100; the entry leaves it to the stock line.
    with pytest.raises(NotImplementedError):
        gemm.conv2d(x, torch.randn(4, 1, 1, 1), None, 1, 0, 1, 4)
    assert gemm.pointwise(torch.randn(8, 1, 1, 1), 1, 0, 4)  # two out per group: a GEMM
    with pytest.raises(NotImplementedError, match="layout"):
        gemm.conv2d(x.transpose(2, 3), w, None, 1, 0, 1, 1)  # neither NCHW nor channels-last
    assert torch.equal(gemm.conv2d(x, w, None, 1, "valid", 2, 1), F.conv2d(x, w))


def _layer(cin: int, cout: int, k: int = 1, groups: int = 1, **kw: Any) -> Any:
    torch.manual_seed(1)
    conv = torch.nn.Conv2d(cin, cout, k, groups=groups, **kw).eval()
    bn = torch.nn.BatchNorm2d(cout).eval()
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    return conv, bn, torch.nn.SiLU()


@pytest.mark.parametrize("layout", ["nchw", "channels-last"])
def test_the_entry_runs_the_layer_as_a_gemm(gemm: Any, layout: str) -> None:
    conv, bn, act = _layer(288, 96, groups=96, bias=True)
    x = torch.randn(2, 288, 9, 7)
    if layout == "channels-last":
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        want = act(bn(conv(x)))
        spy = Convs()
        with spy:
            got = gemm.pointwise_conv2d(x, conv, bn=bn, act=act)
        assert torch.equal(gemm.pointwise_conv2d(x, conv), gemm.conv2d(x, conv.weight,
                           conv.bias, 1, 0, 1, 96))  # fmt: skip
    assert spy.count == 0, "the GEMM ran no convolution"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _stock_ran(gemm: Any, x: torch.Tensor, conv: Any, **kw: Any) -> bool:
    spy = Convs()
    with spy:
        got = gemm.pointwise_conv2d(x, conv, **kw)
    want = conv(x)
    for name in ("bn", "act"):
        if kw.get(name) is not None:
            want = kw[name](want)
    assert torch.equal(got, want)
    return spy.count == 1


def test_the_entry_runs_the_stock_modules_for_anything_else(gemm: Any) -> None:
    x = torch.randn(1, 8, 6, 6)
    conv, bn, act = _layer(8, 8)
    with torch.no_grad():
        assert not _stock_ran(gemm, x, conv, bn=bn, act=act)
        for other in (_layer(8, 8, 3, padding=1)[0], _layer(8, 8, stride=2)[0],
                      _layer(8, 8, padding=1)[0]):  # fmt: skip
            assert _stock_ran(gemm, x, other, bn=bn, act=act)
        assert not gemm.handled(x.half(), conv)  # a weight of another dtype

        class Mine(torch.nn.Conv2d):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return super().forward(x) * 2

        mine = Mine(8, 8, 1).eval()
        assert _stock_ran(gemm, x, mine)
        seen: list[int] = []
        handle = conv.register_forward_hook(lambda *_: seen.append(1))
        assert _stock_ran(gemm, x, conv) and seen  # the hook sees its module called
        handle.remove()
    # Autograd records the call: the stock modules, which have a backward.
    assert _stock_ran(gemm, x.requires_grad_(), conv)


def test_a_failing_gemm_is_the_stock_result_and_a_warning_that_cannot_raise(
    gemm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_args: Any) -> None:
        raise RuntimeError("no GEMM here")

    monkeypatch.setattr(gemm, "gemm", broken)
    conv, bn, act = _layer(8, 4)
    x = torch.randn(1, 8, 5, 5)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("error")  # python -W error: still no exception in the forward
        got = gemm.pointwise_conv2d(x, conv, bn=bn, act=act)
        torch.testing.assert_close(got, act(bn(conv(x))))
    assert any("1x1 conv as a GEMM failed" in str(w.message) for w in caught)


# The route: golden code written for these tests.
GOLDEN_CASES = [
    ("doclayout_conv", CodeShape.NEEDS_PATCH, "Conv: 1x1 convs"),
    ("doclayout_conv_fused", CodeShape.UNKNOWN, "does not run self.conv → self.bn → self.act"),
    ("hgnet_layer", CodeShape.FIXED_UPSTREAM, "has no Conv"),
]


@pytest.mark.parametrize(("source", "shape", "says"), GOLDEN_CASES)
def test_golden(source: str, shape: CodeShape, says: str) -> None:
    p = _patch()
    data = (GOLDEN / f"{source}.py").read_bytes()
    found = p.classify(p.parse(data), CTX)
    assert found.shape is shape and says in found.reason, found
    assert p.classify(cst.parse_module(data), CTX) == found
    if shape is not CodeShape.NEEDS_PATCH:
        return
    patched = p.transform(cst.parse_module(data)).code
    expected = GOLDEN / f"{source}.pointwise.patched.py"
    if os.environ.get("ROCMFIX_UPDATE_GOLDEN"):
        expected.write_text(patched)
    assert patched == expected.read_text()
    assert MARKER in patched
    compile(patched, source, "exec")
    # Only Conv's nested return is routed; Conv2's sum and forward_fuse keep theirs.
    assert patched.count("_rocmfix_pointwise_conv2d(x, self.conv, bn=self.bn, act=self.act)") == 1
    assert patched.count("return self.act(self.bn(self.conv(x)))") == 1
    assert patched.count("return self.act(self.bn(self.conv(x) + x))") == 1
    assert p.classify(p.parse(patched.encode()), CTX).shape is CodeShape.PATCHED
    with pytest.raises(Exception, match="already called"):
        p.transform(cst.parse_module(patched))


@pytest.mark.network
def test_release_round_trip(doclayout_env: Callable[[str], InstalledEnv]) -> None:
    """The real 0.0.4 (the three releases ship one byte-identical conv.py): apply alone and
    beside the dilated-conv patch (both drop rocmfix_kernel_support.py), revert to the bytes."""
    env = doclayout_env("0.0.4")
    before = files_under(env.site)
    target = env.site / TARGET
    original = target.read_bytes()
    status = env.status(PATCH)
    assert status["pristine"] == "record", status
    applied = env.cli("apply", "--only", PATCH)
    assert applied.returncode == 0, applied.stderr
    text = target.read_text()
    compile(text, TARGET, "exec")
    assert "return _rocmfix_pointwise_conv2d(x, self.conv, bn=self.bn, act=self.act)" in text
    assert "            return self.act(self.bn(self.conv(x)))" in text  # the stock branch
    assert (env.site / DROP).read_bytes() == (ROOT / "templates" / OP.schemes[0].entry).read_bytes()
    assert env.status(PATCH)["verdict"] == "applied"
    both = env.cli("apply", "--only", PATCH, "--only", "doclayout-dilated-conv")
    assert both.returncode == 0, both.stderr
    reverted = env.cli("revert")
    assert reverted.returncode == 0, reverted.stderr
    assert target.read_bytes() == original
    assert files_under(env.site) == before


_FORWARD = textwrap.dedent(
    """
    import json, sys
    import torch
    import doclayout_yolo
    from doclayout_yolo.nn.tasks import YOLOv10DetectionModel
    from torch.utils._python_dispatch import TorchDispatchMode

    class Routed(torch.Tensor):
        "A CPU tensor that takes the rewrite's GPU branch."
        @property
        def is_cuda(self):
            return True

    class Pointwise(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = 0
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten.convolution.default, torch.ops.aten.conv2d.default):
                self.seen += tuple(args[1].shape[2:]) == (1, 1)
            return func(*args, **(kwargs or {}))

    cfg = f"{doclayout_yolo.__path__[0]}/cfg/models/v10/yolov10m-doclayout.yaml"
    torch.manual_seed(0)
    model = YOLOv10DetectionModel(cfg, nc=10, verbose=False).eval()
    for m in model.modules():  # running statistics that are not the identity
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    x = torch.rand(1, 3, 128, 96)
    results = {}
    with torch.inference_mode():
        for name, inp in (("plain", x), ("routed", x.as_subclass(Routed))):
            spy = Pointwise()
            with spy:
                maps = model(inp)["one2one"][1]
            flat = torch.cat([m.as_subclass(torch.Tensor).flatten(1) for m in maps], 1)
            results[name] = flat.double().flatten().tolist()
            results[name + "_1x1"] = spy.seen
    print(json.dumps(results))
    """
)


def _forward(env: InstalledEnv) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _FORWARD],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(env.site)},
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.network
def test_the_patched_model_matches_stock(doclayout_env: Callable[[str], InstalledEnv]) -> None:
    """DocLayout-YOLO from its shipped yaml (random weights), its GPU branch taken on the CPU:
    every 1x1 conv of a Conv layer runs as a GEMM, and the outputs match stock."""
    env = doclayout_env("0.0.4")
    stock = _forward(env)
    assert stock["plain_1x1"] == stock["routed_1x1"] > 100
    assert env.cli("apply", "--only", PATCH).returncode == 0
    patched = _forward(env)
    assert patched["plain"] == stock["plain"], "the CPU path is the stock code"
    # What is left are the head's twelve bare nn.Conv2d 1x1s, which no Conv layer wraps, and
    # the DilatedBlocks' eight depthwise gates (one channel a group: no GEMM in it).
    assert patched["routed_1x1"] == 20, patched["routed_1x1"]
    num = sum((a - b) ** 2 for a, b in zip(patched["routed"], stock["plain"], strict=True))
    den = sum(b * b for b in stock["plain"])
    assert (num / den) ** 0.5 < 1e-5


# The profile names it from the registry.
GROUPED = {"name": "aten::conv2d", "shapes": [[1, 576, 80, 58], [192, 3, 1, 1], []],
           "concrete": [None, None, None, [1, 1], [0, 0], [1, 1], 192]}  # fmt: skip
SOURCE = "/x/site-packages/doclayout_yolo/nn/modules/conv.py:50 Conv.forward"


def test_the_profile_knows_a_1x1_conv_and_names_its_patch() -> None:
    from rocmfix.profile import analyse
    from rocmfix.profile.model import Form, OpStat

    assert analyse.conv_kind(GROUPED) == "pointwise-conv"
    dense = dict(GROUPED, shapes=[[1, 64, 8, 8], [32, 64, 1, 1], []],
                 concrete=[None, None, None, [1, 1], [0, 0], [1, 1], 1])  # fmt: skip
    assert analyse.conv_kind(dense) == "pointwise-conv"
    for other in ([2, 2], [0, 0]), ([1, 1], [1, 1]):
        concrete = [None, None, None, other[0], other[1], [1, 1], 192]
        assert analyse.conv_kind(dict(GROUPED, concrete=concrete)) is None
    patch, routed = analyse.patch_for(GROUPED, SOURCE, all_patches())
    assert patch is not None and patch.id == PATCH and not routed
    dropped = "/x/site-packages/doclayout_yolo/nn/modules/rocmfix_pointwise_conv.py:90 f"
    assert analyse.patch_for(GROUPED, dropped, all_patches()) == (patch, True)
    # The replay runs the op's schemes (tests/test_profile_registry.py), and a flagged call
    # whose GEMM form won names the patch.
    row = OpStat(key="k", op="conv2d", shapes=((1, 576, 80, 58), (192, 3, 1, 1), ()),
                 dtypes=("float32",), layout="contiguous", conv=analyse.conv_params(GROUPED),
                 calls=10, total_ms=100.0, first_ms=10.0, steady_ms=3.0, share=0.5,
                 flops=None, bytes=None, tflops=None, gbps=None, roofline=None, modules=(),
                 source=SOURCE, kernels=(), pids=(1,))  # fmt: skip
    forms = [Form("as run", 3.0, ok=True), Form("rocmfix GEMM", 1.0, ok=True)]
    done = analyse.verdict(row, forms, patch, False, "cuda", False, {}, total_ms=200.0)
    assert done["flagged"] and done["fix"].command == f"rocmfix apply --only {PATCH} --force"
    assert done["fix"].kind == "patch" and done["best"] == "rocmfix GEMM"


def test_the_op_is_registered_with_a_measured_verdict() -> None:
    assert OP in OPS and OP.measured_verdict and OP.fallback == "gemm"
    cases = {c.id for c in OP.cases}
    assert "pointwise-conv-288to96-g96-160x116-fp32" in cases  # DocLayout-YOLO's grouped 1x1
    assert "pointwise-conv-576to192-g192-80x58-fp32" in cases
    assert all(c.cpu["cin"] % c.cpu["g"] == 0 and c.cpu["cout"] % c.cpu["g"] == 0
               for c in OP.cases)  # fmt: skip
