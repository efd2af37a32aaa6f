"""The vllm patch-embed patches against real vllm releases, through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging.version import Version

from rocmfix.ops import PATCH_EMBED

import releases
from conftest import (
    ROOT,
    VLLM_CONV,
    VLLM_MODELS,
    VLLM_TARGETS,
    InstalledEnv,
    files_under,
    patch_p1,
)

pytestmark = pytest.mark.network

NEWEST = releases.PINNED["vllm"]  # no index read at collection: -m "not network" runs offline
# One release per era of the patched code (nn.Conv3d; the last before Conv3dLayer, with
# qwen3_vl; the first Conv3dLayer; the newest): the compat sample round-trips twelve.
VERSIONS = ["0.8.5", "0.11.0", "0.11.2", NEWEST]
PATCHES = ("vllm-qwen2-vl", "vllm-qwen2.5-vl", "vllm-qwen3-vl")
DROP = f"{VLLM_MODELS}/qwen2_vl_vision_kernels.py"
CONFIG_DROP = f"{VLLM_MODELS}/rocmfix_kernel_config.py"
TEMPLATES = {s.name: s.entry for s in PATCH_EMBED.schemes}


def _verdicts(env: InstalledEnv) -> dict[str, str]:
    result = env.cli("status", "--json", "--only", "vllm")
    assert result.returncode == 0, result.stderr
    return {p["id"]: p["verdict"] for p in result.json()["patches"]}


def _record_lines(env: InstalledEnv) -> list[str]:
    record = next(env.site.glob("vllm-*.dist-info")) / "RECORD"
    return record.read_text().splitlines()


@pytest.mark.parametrize("version", VERSIONS)
def test_release_round_trip_every_scheme(
    version: str, vllm_env: Callable[..., InstalledEnv]
) -> None:
    env = vllm_env(version)
    before = files_under(env.site)
    has_qwen3 = Version(version) >= Version("0.11.0")
    expected = {p: "applicable" for p in PATCHES}
    if not has_qwen3:
        expected["vllm-qwen3-vl"] = "not-needed"
    assert _verdicts(env) == expected

    for scheme in ("gemm", "linear"):
        applied = env.cli("apply", "--scheme", scheme, "--only", "vllm")
        assert applied.returncode == 0, applied.stderr
        drop = env.site / DROP
        assert drop.read_bytes() == (ROOT / "templates" / TEMPLATES[scheme]).read_bytes()
        assert any(line.startswith(f"{DROP},sha256=") for line in _record_lines(env))
        # The Triton schemes bring the shared config module; the vendor one needs none.
        config = (ROOT / "templates" / "rocmfix_kernel_config.py").read_bytes()
        if scheme == "linear":
            assert not (env.site / CONFIG_DROP).exists()
        else:
            assert (env.site / CONFIG_DROP).read_bytes() == config
            assert any(line.startswith(f"{CONFIG_DROP},") for line in _record_lines(env))
        for rel in VLLM_TARGETS[: 3 if has_qwen3 else 2]:
            source = (env.site / rel).read_bytes()
            compile(source, rel, "exec")
            assert b"from .qwen2_vl_vision_kernels import triton_conv3d_patchify" in source
            assert b"self.proj(x)" not in source
        statuses = env.cli("status", "--json", "--only", "vllm").json()["patches"]
        assert {p["id"]: (p["verdict"], p["scheme"]) for p in statuses if p["scheme"]} == {
            p: ("applied", scheme) for p in PATCHES if has_qwen3 or p != "vllm-qwen3-vl"
        }
        snapshot = files_under(env.site)
        again = env.cli("apply", "--scheme", scheme, "--only", "vllm")
        assert again.returncode == 0, again.stderr
        assert "unchanged" in again.stderr
        assert files_under(env.site) == snapshot

    reverted = env.cli("revert")
    assert reverted.returncode == 0, reverted.stderr
    assert files_under(env.site) == before
    assert not env.state.exists()


@pytest.mark.parametrize(
    ("version", "torch", "hip", "verdict"),
    [
        ("0.11.0", "2.10.0.dev20251001+rocm7.0", "7.0.0", "applicable"),  # the seed's stack
        ("0.11.2", "2.9.0+rocm6.4", "6.4.0", "not-needed"),  # torch == 2.9.0: matmul
        ("0.13.0", "2.10.0+rocm7.1", "7.1.0", "applicable"),  # eager still calls F.conv3d
        ("0.19.0", "2.10.0+rocm7.1", "7.1.0", "not-needed"),  # >= 2.9 from 0.19
        ("0.19.0", "2.8.0+rocm6.4", "6.4.0", "applicable"),
    ],
)
def test_conv3dlayer_verdict_depends_on_the_target_torch(
    version: str, torch: str, hip: str, verdict: str, vllm_env: Callable[..., InstalledEnv]
) -> None:
    env = vllm_env(version, torch=torch, hip=hip)
    result = env.cli("status", "--json", "--only", "vllm-qwen2-vl")
    doc = result.json()
    assert doc["environment"]["torch"] == {"version": torch, "hip": hip, "cuda": None}
    patch = doc["patches"][0]
    assert patch["verdict"] == verdict, patch
    if Version(version) >= Version("0.11.1"):
        notes = " ".join(patch["notes"])
        assert "compiled mode already runs Conv3dLayer as a matmul" in notes
        assert "read from conv.py" in notes
        assert torch in patch["reason"]


ROCM_LABEL = "0.11.0rc2.dev198+g736fbf4c8.rocm701"


def _relabel(env: InstalledEnv, label: str) -> None:
    """What a ROCm build looks like: the released code under a version label of its own."""
    metadata = next(env.site.glob("vllm-*.dist-info")) / "METADATA"
    text = metadata.read_text()
    version = next(line for line in text.splitlines() if line.startswith("Version: "))
    metadata.write_text(text.replace(version, f"Version: {label}"))


@pytest.mark.parametrize(
    ("case", "torch", "verdict", "says"),
    [
        # 0.28-era code under the seed's label: the gate (>= 2.9) admits torch 2.10.
        ("relabelled", "2.10.0+rocm7.1", "not-needed", "is_torch_equal_or_newer"),
        # A pre-release of 2.9.0 sorts below 2.9.0, as vllm's own comparison has it.
        ("relabelled", "2.9.0.dev20250801+rocm6.4", "applicable", "2.9.0.dev20250801"),
        ("relabelled", "2.9.0a0+git1234abc", "applicable", "2.9.0a0"),
        # conv.py edited to always call F.conv3d: needed, whatever torch and the label say.
        ("conv-edited", "2.10.0+rocm7.1", "applicable", "always calls F.conv3d"),
    ],
)
def test_verdicts_follow_the_code_not_the_label(
    case: str, torch: str, verdict: str, says: str, vllm_env: Callable[..., InstalledEnv]
) -> None:
    env = vllm_env("0.28.0", torch=torch, hip="7.1.0")
    _relabel(env, ROCM_LABEL)
    if case == "conv-edited":
        conv = env.site / VLLM_CONV
        source = conv.read_text()
        start = source.index("def forward_cuda", source.index("class Conv3dLayer"))
        end = source.index("return self._forward_conv(x)", start)
        body = source[start:end].replace("self._forward_mulmat(x)", "self._forward_conv(x)")
        conv.write_text(source[:start] + body + source[end:])
    result = env.cli("status", "--json", "--only", "vllm-qwen2-vl")
    patch = result.json()["patches"][0]
    assert patch["version"] == ROCM_LABEL
    assert patch["verdict"] == verdict, patch
    assert says in " ".join((patch["reason"], *patch["notes"])), patch


def test_scheme_switch_and_partial_revert(vllm_env: Callable[..., InstalledEnv]) -> None:
    env = vllm_env("0.11.0")
    before = files_under(env.site)
    assert env.cli("apply", "--only", "vllm").returncode == 0
    gemm_targets = {rel: (env.site / rel).read_bytes() for rel in VLLM_TARGETS}
    switched = env.cli("apply", "--scheme", "linear", "--only", "vllm")
    assert switched.returncode == 0, switched.stderr
    assert "re-applied (linear)" in switched.stderr
    assert {rel: (env.site / rel).read_bytes() for rel in VLLM_TARGETS} == gemm_targets
    assert (env.site / DROP).read_bytes() == (ROOT / "templates" / TEMPLATES["linear"]).read_bytes()

    # The dropped module is shared: it stays until the last patch using it is reverted.
    partial = env.cli("revert", "--only", "vllm-qwen2-vl")
    assert partial.returncode == 0, partial.stderr
    assert (env.site / VLLM_TARGETS[0]).read_bytes() == before[VLLM_TARGETS[0]]
    assert (env.site / DROP).exists()
    one_scheme = env.cli("apply", "--scheme", "gemm", "--only", "vllm-qwen2-vl")
    assert one_scheme.returncode == 1
    assert "apply them together with one --scheme" in one_scheme.stderr
    assert env.cli("revert").returncode == 0
    assert files_under(env.site) == before


def test_dry_run_diff_applies_with_patch(
    vllm_env: Callable[..., InstalledEnv], tmp_path: Path
) -> None:
    env = vllm_env("0.13.0")
    dry = env.cli("apply", "--dry-run", "--only", "vllm")
    assert dry.returncode == 0, dry.stderr
    assert f"--- /dev/null\n+++ b/{DROP}\n" in dry.stdout
    copy = tmp_path / "copy"
    releases.copy_tree(env.site, copy)
    assert patch_p1(dry.stdout_bytes, copy) == 0
    assert env.cli("apply", "--only", "vllm").returncode == 0
    assert files_under(copy) == files_under(env.site)


def test_pip_uninstall_leaves_no_dropped_file(vllm_env: Callable[..., InstalledEnv]) -> None:
    env = vllm_env("0.11.0")
    assert env.cli("apply", "--only", "vllm").returncode == 0
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(env.python), "uninstall", "-y", "vllm"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert not (env.site / DROP).exists(), "RECORD lists the drop, so pip removes it"
    status = env.status("vllm-qwen2-vl")
    assert status["verdict"] == "not-installed"
    assert "uninstalled after rocmfix patched it" in status["reason"]
    assert env.cli("revert").returncode == 0
    assert not env.state.exists()


_RUN_PATCHED = textwrap.dedent(
    """
    import importlib, json, sys, types
    import libcst as cst
    import torch
    from torch import nn

    patched, class_name, size_attr = sys.argv[1], sys.argv[2], sys.argv[3]
    templates = json.loads(sys.argv[4])
    module = cst.parse_module(open(patched, "rb").read())
    cls = next(n for n in module.body if isinstance(n, cst.ClassDef) and n.name.value == class_name)
    results = {}
    for scheme, (folder, name, dtypes, m) in templates.items():
        # The folder as a package of its own: the kernel imports its config module beside it.
        package = types.ModuleType(f"kernels_{scheme}")
        package.__path__ = [folder]
        sys.modules[package.__name__] = package
        kernels = importlib.import_module(f"{package.__name__}.{name}")
        # nn.Conv3d stands in for vllm's Conv3dLayer: same arguments, same 5-D weight.
        namespace = {"torch": torch, "nn": nn, "Conv3dLayer": nn.Conv3d,
                     "triton_conv3d_patchify": kernels.triton_conv3d_patchify}
        source = module.code_for_node(cls.with_changes(decorators=[]))
        exec(compile(source, patched, "exec"), namespace)
        for dtype_name in dtypes:
            dtype = getattr(torch, dtype_name)
            torch.manual_seed(len(results))
            embed = namespace[class_name](14, 2, 3, 1280).to(dtype)
            ref = nn.Conv3d(3, 1280, (2, 14, 14), (2, 14, 14), bias=embed.proj.bias is not None)
            ref = ref.to(torch.float64)
            with torch.no_grad():
                embed.proj.weight.normal_(0, 0.02)
                if embed.proj.bias is not None:
                    embed.proj.bias.normal_(0, 0.02)
                ref.weight.copy_(embed.proj.weight)
                if ref.bias is not None:
                    ref.bias.copy_(embed.proj.bias)
                x = torch.randn(m, 3 * 2 * 14 * 14).to(dtype)
                out = embed(x)
                want = ref(x.to(torch.float64).view(m, 3, 2, 14, 14)).view(m, 1280)
            assert out.shape == (m, getattr(embed, size_attr)) and out.dtype == dtype
            err = ((out.double() - want).norm() / want.norm()).item()
            results[f"{scheme}/{dtype_name}"] = err
    print(json.dumps(results))
    """
)


@pytest.mark.parametrize(
    ("version", "patch", "file", "class_name", "size_attr"),
    [
        ("0.11.0", "vllm-qwen2-vl", "qwen2_vl.py", "Qwen2VisionPatchEmbed", "embed_dim"),
        (NEWEST, "vllm-qwen2-vl", "qwen2_vl.py", "Qwen2VisionPatchEmbed", "embed_dim"),
        (NEWEST, "vllm-qwen3-vl", "qwen3_vl.py", "Qwen3_VisionPatchEmbed", "hidden_size"),
    ],
)
def test_patched_forward_matches_conv3d(
    version: str,
    patch: str,
    file: str,
    class_name: str,
    size_attr: str,
    vllm_env: Callable[..., InstalledEnv],
) -> None:
    """Run the rewritten class lifted out of the patched file (not its text) against
    nn.Conv3d in float64, with each scheme's kernel module, in Triton's CPU interpreter."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    env = vllm_env(version)
    assert env.cli("apply", "--only", patch).returncode == 0
    target = env.site / VLLM_MODELS / file
    drop = env.site / DROP
    assert drop.read_bytes() == (ROOT / "templates" / TEMPLATES["gemm"]).read_bytes()
    templates = str(ROOT / "templates")
    plan = {
        # The dropped copy, imported from where rocmfix put it.
        "gemm": (str(drop.parent), drop.stem, ["float32", "float16"], 24),
        "linear": (templates, "patch_embed_linear", ["float32", "float16"], 24),
    }
    done = subprocess.run(
        [sys.executable, "-c", _RUN_PATCHED, str(target), class_name, size_attr, json.dumps(plan)],
        capture_output=True,
        text=True,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    errors = json.loads(done.stdout.strip().splitlines()[-1])
    for key, err in errors.items():
        limit = 1e-5 if key.endswith("float32") else 1e-2
        assert err < limit, (key, err)
    assert set(errors) == {f"{s}/{d}" for s, (_, _, dtypes, _) in plan.items() for d in dtypes}
