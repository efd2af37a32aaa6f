"""The sglang patch-embed patches against real sglang releases, through the real CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_vision import files_under, install, run_patched_class

from rocmfix.ops import PATCH_EMBED

import releases
from conftest import ROOT, InstalledEnv

pytestmark = pytest.mark.network

MODELS = "sglang/srt/models"
CONV_PY = "sglang/srt/layers/conv.py"
TARGETS = [f"{MODELS}/qwen2_vl.py", f"{MODELS}/qwen3_vl.py"]
PATCHES = ("sglang-qwen2-vl", "sglang-qwen3-vl")
DROP = f"{MODELS}/rocmfix_patch_embed.py"
TEMPLATES = {s.name: s.entry for s in PATCH_EMBED.schemes}
# (class, constructor kwargs, flattened patch size) of each target's patch embed.
CLASSES = {
    "qwen2_vl.py": (
        "Qwen2VisionPatchEmbed",
        {"patch_size": 14, "temporal_patch_size": 2, "in_chans": 3, "embed_dim": 32},
        3 * 2 * 14 * 14,
    ),
}


def _env(tmp_path: Path, version: str) -> InstalledEnv:
    return install(tmp_path / version, "sglang", version, [*TARGETS, CONV_PY])


def _verdicts(env: InstalledEnv) -> dict[str, tuple[str, str]]:
    result = env.cli("status", "--json", "--only", "sglang")
    assert result.returncode == 0, result.stderr
    return {p["id"]: (p["verdict"], p["reason"]) for p in result.json()["patches"]}


def test_0_5_9_round_trip_every_scheme_and_the_patched_class_runs(tmp_path: Path) -> None:
    env = _env(tmp_path, "0.5.9")
    before = files_under(env.site)
    assert {k: v[0] for k, v in _verdicts(env).items()} == {p: "applicable" for p in PATCHES}
    for scheme in ("gemm", "linear"):
        applied = env.cli("apply", "--scheme", scheme, "--only", "sglang")
        assert applied.returncode == 0, applied.stderr
        drop = env.site / DROP
        assert drop.read_bytes() == (ROOT / "templates" / TEMPLATES[scheme]).read_bytes()
        for rel in TARGETS:
            source = (env.site / rel).read_bytes()
            compile(source, rel, "exec")
            assert b"from .rocmfix_patch_embed import triton_conv3d_patchify" in source
        statuses = env.cli("status", "--json", "--only", "sglang").json()["patches"]
        assert {p["id"]: (p["verdict"], p["scheme"]) for p in statuses} == {
            p: ("applied", scheme) for p in PATCHES
        }
        for file, (name, kwargs, k) in CLASSES.items():
            err, forward = run_patched_class(
                env.site / MODELS / file, name, env.site / MODELS, kwargs, k
            )
            assert "triton_conv3d_patchify(x, self.proj.weight, self.proj.bias)" in forward
            assert err < 1e-5, (scheme, file, err)
    reverted = env.cli("revert")
    assert reverted.returncode == 0, reverted.stderr
    assert files_under(env.site) == before
    assert not env.state.exists()


@pytest.mark.parametrize("version", ["0.5.10", releases.PINNED["sglang"]])
def test_conv3dlayer_is_not_needed(tmp_path: Path, version: str) -> None:
    env = _env(tmp_path, version)
    verdicts = _verdicts(env)
    for patch in PATCHES:
        verdict, reason = verdicts[patch]
        assert verdict == "not-needed", (patch, verdict, reason)
        assert "unfold + F.linear" in reason
    before = files_under(env.site)
    applied = env.cli("apply", "--only", "sglang")
    assert applied.returncode == 0, applied.stderr
    assert files_under(env.site) == before
