"""A dropped kernel's failure under warnings-as-errors (issue 39, item 2): a bad config
variable, a bad tuned file, a kernel that raises, a kernel module that fails to import. In
each case the user's layer returns the stock result and nothing leaves it, under pytest's
``filterwarnings = error`` (in-process) and under ``python -W error`` (a fresh interpreter,
where the warning must still be shown).

The kernels run in Triton's CPU interpreter on small fp32 inputs; the patched layer is the
golden rewrite of a PP-LCNetV4 conv layer (tests/golden, code written for these tests) with
the depthwise templates dropped beside it as ``apply`` lays them out.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from rocmfix.ops import op

from conftest import PYTHONPATH, TEMPLATES, load_template

pytest.importorskip("triton")
pytestmark = [pytest.mark.usefixtures("no_kernel_config"), pytest.mark.filterwarnings("error")]

GOLDEN = Path(__file__).resolve().parent / "golden"
KERNEL = "rocmfix_depthwise_conv"  # the name mineru-ocr-lcnetv4 drops the entry under


def _depthwise(m: ModuleType) -> tuple[torch.Tensor, torch.Tensor]:
    conv = torch.nn.Conv2d(4, 4, 3, 1, 1, groups=4).eval()
    bn, act = torch.nn.BatchNorm2d(4).eval(), torch.nn.ReLU()
    x = torch.randn(1, 4, 9, 7)
    return m.depthwise_conv2d(x, conv, bn, act), act(bn(conv(x)))


def _dilated(m: ModuleType) -> tuple[torch.Tensor, torch.Tensor]:
    x, w = torch.randn(1, 4, 10, 9), torch.randn(6, 4, 3, 3)
    return m.dilated_conv2d(x, w, 2, 2), F.conv2d(x, w, None, 1, 2, 2)


def _patch_embed(m: ModuleType) -> tuple[torch.Tensor, torch.Tensor]:
    x, w, b = torch.randn(8, 3, 2, 2, 2), torch.randn(16, 3, 2, 2, 2), torch.randn(16)
    return m.triton_conv3d_patchify(x, w, b), F.conv3d(x, w, b, stride=(2, 2, 2)).flatten(1)


# template, its config variable, what a call computes, the step a kernel failure is put in
ENTRIES: dict[str, tuple[str, str, Callable[[ModuleType], Any], str]] = {
    "depthwise": ("depthwise_conv_triton", "ROCMFIX_DEPTHWISE_CONV_CONFIG", _depthwise, "_eager"),
    "dilated": ("dilated_conv_triton", "ROCMFIX_DILATED_CONV_CONFIG", _dilated, "_conv"),
    "patch-embed": ("patch_embed_gemm", "ROCMFIX_PATCH_EMBED_CONFIG", _patch_embed, "_cached_call"),
}  # fmt: skip


def _boom(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("the kernel broke")


@pytest.mark.parametrize("entry", list(ENTRIES))
@pytest.mark.parametrize("fault", ["config-variable", "tuned-file", "kernel-raises"])
def test_a_failure_under_filterwarnings_error_returns_stock(
    entry: str, fault: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    template, variable, call, step = ENTRIES[entry]
    module = load_template(template)  # fresh: nothing warned yet in this process
    if fault == "config-variable":
        monkeypatch.setenv(variable, "{not json")
    elif fault == "tuned-file":
        (tmp_path / "tuned.json").write_text("{not json")
        monkeypatch.setenv("ROCMFIX_TUNED_FILE", str(tmp_path / "tuned.json"))
    else:
        monkeypatch.setattr(module, step, _boom)
    with torch.no_grad():
        got, want = call(module)
    torch.testing.assert_close(got, want)


def _patched_layer(root: Path, kernel_prologue: str = "") -> Path:
    """A package holding the golden patched layer (``pkg/backbones/layer.py``, which imports
    ``..rocmfix_depthwise_conv``) and the triton scheme's templates dropped beside it;
    ``kernel_prologue`` is put at the top of the dropped ``rocmfix_triton.py``."""
    scheme = op("depthwise-conv").scheme("triton")
    pkg = root / "pkg"
    (pkg / "backbones").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "backbones" / "__init__.py").write_text("")
    shutil.copy(GOLDEN / "ocr_lcnet.mineru.patched.py", pkg / "backbones" / "layer.py")
    shutil.copy(TEMPLATES / scheme.entry, pkg / f"{KERNEL}.py")
    for name in scheme.support:
        shutil.copy(TEMPLATES / name, pkg / name)
    triton_module = pkg / "rocmfix_triton.py"
    triton_module.write_text(kernel_prologue + triton_module.read_text())
    return root


# What the patched forward runs on a GPU, called with CPU tensors (the interpreter runs the
# kernel on them; the patched forward itself routes only GPU tensors), against the layer.
RUN = """
import sys, torch
sys.path.insert(0, {root!r})
from pkg.backbones import layer as patched
layer = patched.PPLCNetV4ConvLayer(4, 4, 3, groups=4).eval()
x = torch.randn(1, 4, 9, 7)
with torch.no_grad():
    want = layer(x)
    kernel = patched._rocmfix_depthwise_conv2d
    if kernel is None:
        print("kernel: none")
    else:
        if {boom}:
            import pkg.{kernel} as entry
            def boom(*a, **k):
                raise RuntimeError("the kernel broke")
            entry._eager = boom
        got = kernel(x, layer.convolution, bn=layer.normalization, act=layer.activation)
        torch.testing.assert_close(got, want)
print("ok")
"""


@pytest.mark.parametrize(
    "fault",
    ["config-variable", "tuned-file", "kernel-raises", "warns-at-import", "raises-at-import"],
)
def test_a_failure_under_python_w_error_returns_stock(fault: str, tmp_path: Path) -> None:
    prologue = {
        "warns-at-import": "import warnings\nwarnings.warn('old', DeprecationWarning)\n",
        "raises-at-import": "raise RuntimeError('a broken install')\n",
    }.get(fault, "")
    root = _patched_layer(tmp_path / "site", prologue)
    env = {
        **os.environ,
        "PYTHONPATH": PYTHONPATH,
        "TRITON_INTERPRET": "1",
        "ROCMFIX_TUNED_FILE": str(tmp_path / "absent.json"),
    }
    env.pop("ROCMFIX_DEPTHWISE_CONV_CONFIG", None)
    if fault == "config-variable":
        env["ROCMFIX_DEPTHWISE_CONV_CONFIG"] = "{not json"
    elif fault == "tuned-file":
        (tmp_path / "tuned.json").write_text("{not json")
        env["ROCMFIX_TUNED_FILE"] = str(tmp_path / "tuned.json")
    script = RUN.format(root=str(root), kernel=KERNEL, boom=fault == "kernel-raises")
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", textwrap.dedent(script)],
        capture_output=True, text=True, env=env, cwd="/", timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "ok"
    if fault.endswith("-at-import"):
        assert "kernel: none" in done.stdout  # the layer took its stock path
    else:
        assert "RuntimeWarning: rocmfix: " in done.stderr, done.stderr  # shown, not raised


def test_an_import_that_warns_under_filterwarnings_error_leaves_the_stock_layer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _patched_layer(tmp_path, "import warnings\nwarnings.warn('old', DeprecationWarning)\n")
    monkeypatch.syspath_prepend(str(root))
    try:
        patched = importlib.import_module("pkg.backbones.layer")
        assert patched._rocmfix_depthwise_conv2d is None
        layer = patched.PPLCNetV4ConvLayer(4, 4, 3, groups=4).eval()
        with torch.no_grad():
            layer(torch.randn(1, 4, 9, 7))
    finally:
        for name in [n for n in sys.modules if n == "pkg" or n.startswith("pkg.")]:
            del sys.modules[name]
