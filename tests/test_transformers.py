"""transformers' Qwen-VL and GLM-4V patch embeds against real releases, through the real CLI.

Each release's modeling files are read out of its wheel (nothing of transformers is committed
here); every file rocmfix knows is patched with every scheme, compiled, re-applied as a no-op,
and reverted to the release's bytes.
"""

from __future__ import annotations

import ast
import re
import zipfile
from collections.abc import Callable

import pytest
from packaging.version import Version

from rocmfix.ops import PATCH_EMBED
from rocmfix.registry import all_patches

import releases
from conftest import ROOT, TRANSFORMERS_MODELS, InstalledEnv, files_under

pytestmark = pytest.mark.network

# The first release with Qwen2-VL, the last 4.x and the newest the suite pins; the compat
# sample (test_compat) round-trips the first release of every era besides.
VERSIONS = ["4.45.0", "4.57.6", "5.24.0"]
PATCHES = {p.id: p for p in all_patches() if p.distribution == "transformers"}
# The Conv3d patch embeds (Qwen-VL, GLM-4V): the other transformers patches (HGNetV2's
# depthwise convs) are other ops, whose verdicts wait on what ``doctor`` measured.
EMBEDS = {pid: p for pid, p in PATCHES.items() if p.op is PATCH_EMBED}
DROP = f"{TRANSFORMERS_MODELS}/rocmfix_patch_embed.py"
CONFIG_DROP = f"{TRANSFORMERS_MODELS}/rocmfix_kernel_config.py"
TEMPLATES = {s.name: s.entry for s in PATCH_EMBED.schemes}


def _verdicts(env: InstalledEnv) -> dict[str, str]:
    result = env.cli("status", "--json", "--only", "transformers")
    assert result.returncode == 0, result.stderr
    return {p["id"]: p["verdict"] for p in result.json()["patches"]}


@pytest.mark.parametrize("version", VERSIONS)
def test_release_round_trip_every_scheme(
    version: str, transformers_env: Callable[..., InstalledEnv]
) -> None:
    env = transformers_env(version)
    before = files_under(env.site)
    present = {pid for pid, p in EMBEDS.items() if (env.site / p.path).exists()}
    assert "transformers-qwen2-vl" in present
    # A patch of an op with a measured verdict reads ``unmeasured`` until ``doctor`` has timed
    # the op on this GPU, so ``apply --only transformers`` leaves it (and its file) alone.
    measured = {
        pid
        for pid, p in PATCHES.items()
        if pid not in EMBEDS
        and p.op is not None
        and p.op.measured_verdict
        and (env.site / p.path).exists()
    }
    assert _verdicts(env) == {
        pid: "applicable" if pid in present else "unmeasured" if pid in measured else "not-needed"
        for pid in PATCHES
    }
    for scheme, template in TEMPLATES.items():
        applied = env.cli("apply", "--scheme", scheme, "--only", "transformers")
        assert applied.returncode == 0, applied.stderr
        assert (env.site / DROP).read_bytes() == (ROOT / "templates" / template).read_bytes()
        assert (env.site / CONFIG_DROP).exists() == (scheme != "linear")
        for pid in present:
            source = (env.site / PATCHES[pid].path).read_bytes()
            compile(source, PATCHES[pid].path, "exec")
            assert b"from ..rocmfix_patch_embed import triton_conv3d_patchify" in source
            call = b"triton_conv3d_patchify(hidden_states.to(dtype=target_dtype), self.proj.weight"
            assert call in source
        status = env.cli("status", "--json", "--only", "transformers").json()["patches"]
        assert {p["id"]: p["scheme"] for p in status if p["verdict"] == "applied"} == {
            pid: scheme for pid in present
        }
        snapshot = files_under(env.site)
        again = env.cli("apply", "--scheme", scheme, "--only", "transformers")
        assert again.returncode == 0 and "unchanged" in again.stderr
        assert files_under(env.site) == snapshot
    reverted = env.cli("revert")
    assert reverted.returncode == 0, reverted.stderr
    assert files_under(env.site) == before
    assert not env.state.exists()


def _is_patch_embed(cls: ast.ClassDef) -> bool:
    """``self.proj = ...Conv3d(kernel_size=K, stride=K)`` in ``__init__``, and a ``forward``
    that views its input as 5-D patches: read with :mod:`ast`, not with rocmfix's classifier."""
    methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
    if "__init__" not in methods or "forward" not in methods:
        return False
    convs = [
        node.value
        for node in ast.walk(methods["__init__"])
        if isinstance(node, ast.Assign)
        and ast.unparse(node.targets[0]) == "self.proj"
        and isinstance(node.value, ast.Call)
        and ast.unparse(node.value.func).endswith("Conv3d")
    ]
    kwargs = [{k.arg: ast.unparse(k.value) for k in c.keywords} for c in convs]
    square = any(k.get("kernel_size") is not None and k.get("kernel_size") == k.get("stride")
                 for k in kwargs)  # fmt: skip
    views = [
        node
        for node in ast.walk(methods["forward"])
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "view"
        and len(node.args) == 5
    ]
    return square and bool(views)


def _conv3d_patch_embeds(version: str) -> set[str]:
    """Every modeling file of a release with a Conv3d patch embed, found by reading the wheel."""
    wheel = zipfile.ZipFile(releases.wheel("transformers", version))
    found = set()
    for name in wheel.namelist():
        if re.fullmatch(rf"{TRANSFORMERS_MODELS}/[^/]+/modeling_[^/]+\.py", name):
            tree = ast.parse(wheel.read(name))
            if any(_is_patch_embed(c) for c in tree.body if isinstance(c, ast.ClassDef)):
                found.add(name)
    return found


def test_every_conv3d_patch_embed_of_the_newest_release_is_a_patch() -> None:
    # A model transformers adds with the same shape must become a row of the table, or this
    # fails; video models (a Conv3d over the whole clip) are not patch embeds.
    newest = VERSIONS[-1]
    assert Version(newest) == max(Version(v) for v in VERSIONS)
    assert _conv3d_patch_embeds(newest) == {p.path for p in EMBEDS.values()}
