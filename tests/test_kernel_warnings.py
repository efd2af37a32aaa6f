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
    "depthwise": ("depthwise_conv_triton", "ROCMFIX_DEPTHWISE_CONV_CONFIG", _depthwise, "_launch"),
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


def _patched(root: Path, golden: str, file: str, scheme_of: tuple[str, str], kernel: str,
             kernel_prologue: str = "") -> Path:  # fmt: skip
    """A package ``pkg`` holding the golden patched ``golden`` as ``pkg/<file>`` and the
    templates of ``scheme_of`` (op, scheme) dropped as ``apply`` lays them out: the entry as
    ``pkg/<kernel>.py``, its support beside it; ``kernel_prologue`` runs first in the dropped
    ``rocmfix_triton.py`` (after its ``__future__`` import: before it, any prologue would be a
    SyntaxError, not the fault it names)."""
    scheme = op(scheme_of[0]).scheme(scheme_of[1])
    pkg = root / "pkg"
    target = pkg / file
    target.parent.mkdir(parents=True)
    for folder in [target.parent, *target.parent.parents][: len(Path(file).parts)]:
        (folder / "__init__.py").write_text("")
    shutil.copy(GOLDEN / golden, target)
    shutil.copy(TEMPLATES / scheme.entry, pkg / f"{kernel}.py")
    for name in scheme.support:
        shutil.copy(TEMPLATES / name, pkg / name)
    triton_module = pkg / "rocmfix_triton.py"
    future = "from __future__ import annotations\n"  # must stay first: the prologue follows it
    text = triton_module.read_text()
    assert future in text
    triton_module.write_text(text.replace(future, future + kernel_prologue, 1))
    return root


def _patched_layer(root: Path, kernel_prologue: str = "") -> Path:
    """The golden patched PP-LCNetV4 layer as ``pkg/backbones/layer.py``, which imports
    ``..rocmfix_depthwise_conv``, with the triton scheme dropped beside it."""
    return _patched(
        root, "ocr_lcnet.mineru.patched.py", "backbones/layer.py",
        ("depthwise-conv", "triton"), KERNEL, kernel_prologue,
    )  # fmt: skip


# What a dropped kernel module's first line does to fail at import (a rocmfix_triton.py that
# every scheme's entry imports).
PROLOGUES = {
    "warns-at-import": "import warnings\nwarnings.warn('old', DeprecationWarning)\n",
    "raises-at-import": "raise RuntimeError('a broken install')\n",
}

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
            entry._launch = boom
        got = kernel(x, layer.convolution, bn=layer.normalization, act=layer.activation)
        torch.testing.assert_close(got, want)
print("ok")
"""


@pytest.mark.parametrize(
    "fault",
    ["config-variable", "tuned-file", "kernel-raises", "warns-at-import", "raises-at-import"],
)
def test_a_failure_under_python_w_error_returns_stock(fault: str, tmp_path: Path) -> None:
    root = _patched_layer(tmp_path / "site", PROLOGUES.get(fault, ""))
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


# The golden patched patch embed (lmdeploy's shape: the input cast, a bias given here) against
# its own Conv3d, the stock op the rewritten call replaced.
EMBED = """
import sys, torch
sys.path.insert(0, {root!r})
from pkg import embed as patched
layer = patched.PatchEmbed(p=2, t=2, c=3, dim=16).eval()
layer.proj.bias = torch.nn.Parameter(torch.randn(16))
x = torch.randn(6, 3 * 2 * 2 * 2)
with torch.no_grad():
    got = layer(x)
    want = layer.proj(x.view(-1, 3, 2, 2, 2)).view(-1, 16)
assert torch.equal(got, want)
print("kernel:", patched.triton_conv3d_patchify.__module__)
print("ok")
"""


@pytest.mark.parametrize("fault", list(PROLOGUES))
def test_a_patch_embed_whose_kernel_fails_at_import_runs_the_stock_conv3d(
    fault: str, tmp_path: Path
) -> None:
    root = _patched(
        tmp_path / "site", "lmdeploy_patch_embed.patched.py", "embed.py", ("patch-embed", "gemm"),
        "rocmfix_patch_embed", PROLOGUES[fault],
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", textwrap.dedent(EMBED.format(root=str(root)))],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": PYTHONPATH},
        cwd="/", timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["kernel: pkg.embed", "ok"]  # the stock fallback ran
