"""The lmdeploy patch-embed patches against real lmdeploy releases, through the real CLI."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from engine_vision import files_under, install, run_patched_class

from rocmfix.ops import PATCH_EMBED

import releases
from conftest import ROOT, InstalledEnv

pytestmark = pytest.mark.network

MODELS = "lmdeploy/pytorch/models"
FILES = ("qwen2_vl.py", "qwen2_5_vl.py", "qwen3_vl.py")
TARGETS = [f"{MODELS}/{f}" for f in FILES]
PATCHES = ("lmdeploy-qwen2-vl", "lmdeploy-qwen2.5-vl", "lmdeploy-qwen3-vl")
DROP = f"{MODELS}/rocmfix_patch_embed.py"
TEMPLATES = {s.name: s.entry for s in PATCH_EMBED.schemes}
SMALL = {"patch_size": 14, "temporal_patch_size": 2, "in_channels": 3, "embed_dim": 32}
# (class, constructor kwargs, flattened patch size) of each target's patch embed; Qwen3-VL's
# has a bias and takes its config.
CLASSES = {
    "qwen2_vl.py": ("PatchEmbed", SMALL, 3 * 2 * 14 * 14),
    "qwen2_5_vl.py": ("Qwen2_5_PatchEmbed", SMALL, 3 * 2 * 14 * 14),
    "qwen3_vl.py": (
        "Qwen3VLVisionPatchEmbed",
        {
            "config": SimpleNamespace(
                patch_size=16, temporal_patch_size=2, in_channels=3, hidden_size=32
            )
        },
        3 * 2 * 16 * 16,
    ),
}


def _env(tmp_path: Path, version: str) -> InstalledEnv:
    return install(tmp_path / version, "lmdeploy", version, TARGETS)


def _verdicts(env: InstalledEnv) -> dict[str, str]:
    result = env.cli("status", "--json", "--only", "lmdeploy")
    assert result.returncode == 0, result.stderr
    return {p["id"]: p["verdict"] for p in result.json()["patches"]}


@pytest.mark.parametrize("version", ["0.17.0", releases.PINNED["lmdeploy"]])
def test_release_round_trip_every_scheme_and_the_patched_classes_run(
    tmp_path: Path, version: str
) -> None:
    env = _env(tmp_path, version)
    before = files_under(env.site)
    assert _verdicts(env) == {p: "applicable" for p in PATCHES}
    for scheme in ("gemm", "linear"):
        applied = env.cli("apply", "--scheme", scheme, "--only", "lmdeploy")
        assert applied.returncode == 0, applied.stderr
        drop = env.site / DROP
        assert drop.read_bytes() == (ROOT / "templates" / TEMPLATES[scheme]).read_bytes()
        statuses = env.cli("status", "--json", "--only", "lmdeploy").json()["patches"]
        assert {p["id"]: (p["verdict"], p["scheme"]) for p in statuses} == {
            p: ("applied", scheme) for p in PATCHES
        }
        for file, (name, kwargs, k) in CLASSES.items():
            source = (env.site / MODELS / file).read_bytes()
            compile(source, file, "exec")
            assert b"from .rocmfix_patch_embed import triton_conv3d_patchify" in source
            err, forward = run_patched_class(
                env.site / MODELS / file, name, env.site / MODELS, kwargs, k
            )
            assert "self.proj.weight, self.proj.bias)" in forward
            assert err < 1e-5, (scheme, file, err)
    reverted = env.cli("revert")
    assert reverted.returncode == 0, reverted.stderr
    assert files_under(env.site) == before
    assert not env.state.exists()
