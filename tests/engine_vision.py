"""What tests/test_sglang.py and tests/test_lmdeploy.py share: an engine's vision modeling
files installed from its real wheel (the rest of the wheel stays on PyPI), and a patched
patch-embed class run on CPU against ``nn.Conv3d``.

The patched file imports the engine's heavy dependencies, so its class is cut out of it with
libcst and run with ``torch``, ``nn`` and the kernel module rocmfix dropped beside it: the bytes
that run are the patched file's and the dropped kernel's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import libcst as cst
import torch
from torch import nn

from rocmfix.guest import templates as _templates
from rocmfix.rewrite import find_class

import releases
from conftest import InstalledEnv, files_under

__all__ = ["files_under", "install", "run_patched_class"]


def install(root: Path, project: str, version: str, files: list[str]) -> InstalledEnv:
    python = releases.make_venv(root)
    site = releases.partial_install(python, project, version, files)
    target = site / files[0]
    return InstalledEnv(root, python, site, target, target.read_bytes())


def run_patched_class(
    patched: Path, class_name: str, kernel_dir: Path, kwargs: dict[str, Any], k: int
) -> tuple[float, str]:
    """The patched class built with ``kwargs`` (random weights), run on ``[L, k]`` patches; its
    relative error against ``nn.Conv3d`` with the same weights, and its forward's source."""
    module = cst.parse_module(patched.read_bytes())
    cls = find_class(module, class_name)
    assert cls is not None, class_name
    source = module.code_for_node(cls)
    kernel = _templates.load(str(kernel_dir), "rocmfix_patch_embed", fresh=True)
    scope: dict[str, Any] = {
        "torch": torch,
        "nn": nn,
        "Optional": Any,
        "triton_conv3d_patchify": kernel.triton_conv3d_patchify,
    }
    exec(compile(source, str(patched), "exec"), scope)
    torch.manual_seed(0)
    embed = scope[class_name](**kwargs).eval()
    proj = embed.proj
    assert type(proj) is nn.Conv3d  # __init__ is left alone
    x = torch.randn(24, k)
    with torch.no_grad():
        got = embed(x)
        ref = proj(x.view(24, proj.in_channels, *proj.kernel_size)).view(24, -1)
    err = ((got.double() - ref.double()).norm() / ref.double().norm()).item()
    return err, source
