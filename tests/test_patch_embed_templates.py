"""CPU tests of the patch-embed templates (templates/patch_embed_{gemm,linear}.py).

The Triton kernels run in Triton's CPU interpreter: ``TRITON_INTERPRET=1`` is set while the
templates are imported (triton decides interpreter-or-compiler when ``@triton.jit`` runs), and
restored afterwards so other test modules see the environment they started with. Every check
draws fresh random inputs and, where the API allows, writes into a NaN-poisoned output.
bf16 is checked here only through the interpreter's fp32 upcast; the GPU proof is
bench/patch_embed.py.
"""

from __future__ import annotations

import os

# Before anything imports triton: triton.language's own @jit helpers are compiled-or-interpreted
# at triton's first import. Left set for the session, as other interpreter tests want it too.
os.environ.setdefault("TRITON_INTERPRET", "1")

import ast
import json
import math
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from rocmfix.ops import OPS
from rocmfix.registry import all_patches

from conftest import TEMPLATES, load_template

SCHEMES = ("gemm", "linear")
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}

triton = pytest.importorskip("triton")

_counter = 0


pytestmark = pytest.mark.usefixtures("no_kernel_config")


def _load(scheme: str) -> ModuleType:
    return load_template(f"patch_embed_{scheme}")


@pytest.fixture(scope="module")
def mods() -> dict[str, ModuleType]:
    return {scheme: _load(scheme) for scheme in SCHEMES}


@pytest.fixture
def gemm(mods: dict[str, ModuleType]) -> Iterator[ModuleType]:
    mods["gemm"].clear_config_cache()
    yield mods["gemm"]
    mods["gemm"].clear_config_cache()


def _inputs(
    m: int, c: int, t: int, p: int, n: int, dtype: torch.dtype, bias: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    k = c * t * p * p
    x = torch.randn(m, c, t, p, p, dtype=torch.float64)
    w = torch.randn(n, c, t, p, p, dtype=torch.float64) / math.sqrt(k)
    b = torch.randn(n, dtype=torch.float64) if bias else None
    return x.to(dtype), w.to(dtype), None if b is None else b.to(dtype)


def _reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """The Conv3d itself, in fp64, on the (already rounded) inputs."""
    t, p = w.shape[2], w.shape[3]
    out = F.conv3d(x.double(), w.double(), None if b is None else b.double(), stride=(t, p, p))
    return out.reshape(x.shape[0], w.shape[0])


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all(), "non-finite output (unwritten or poisoned element)"
    return float((out.double() - ref).norm() / ref.norm())


def _poisoned(m: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.full((m, n), float("nan"), dtype=dtype)


# ------------------------------------------------------------------------------ correctness

MINERU = (3, 2, 14, 1280)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("m", [1, 7, 130])
def test_gemm_mineru_shape(gemm: ModuleType, dtype: torch.dtype, bias: bool, m: int) -> None:
    x, w, b = _inputs(m, *MINERU, dtype, bias)
    ref = _reference(x, w, b)
    out = gemm.triton_conv3d_patchify(x, w, b)
    assert out.shape == (m, 1280) and out.dtype == dtype
    assert _rel_err(out, ref) < TOL[dtype]
    poisoned = _poisoned(m, 1280, dtype)
    gemm.patchify_gemm(x.reshape(m, -1), w.reshape(1280, -1), b, out=poisoned)
    assert _rel_err(poisoned, ref) < TOL[dtype]


def test_gemm_bf16_through_interpreter_upcast(gemm: ModuleType) -> None:
    x, w, b = _inputs(33, *MINERU, torch.bfloat16, True)
    out = gemm.triton_conv3d_patchify(x, w, b)
    assert out.dtype == torch.bfloat16
    assert _rel_err(out, _reference(x, w, b)) < TOL[torch.bfloat16]


# Odd K (96 = whole BLOCK_K steps; 150 and 54 have a tail and rows that are not 16-byte
# aligned in 16-bit dtypes) and N not a multiple of the tile.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(3, 2, 4, 40), (3, 2, 5, 96), (3, 1, 3, 17)])
def test_gemm_odd_shapes(gemm: ModuleType, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    for m, bias in ((1, True), (7, False), (130, True)):
        x, w, b = _inputs(m, *shape, dtype, bias)
        n = shape[-1]
        out = _poisoned(m, n, dtype)
        cfg = {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 32}
        gemm.patchify_gemm(x.reshape(m, -1), w.reshape(n, -1), b, config=cfg, out=out)
        assert _rel_err(out, _reference(x, w, b)) < TOL[dtype]


@pytest.mark.parametrize(
    "cfg",
    [
        {"tma": True, "persistent": True, "flatten": True},
        {"tma": True, "persistent": False, "epilogue_subtile": True},
        {"tma": True, "persistent": True, "epilogue_subtile": True, "BLOCK_K": 64},
    ],
    ids=["persistent-flatten", "grid-subtile", "persistent-subtile-bk64"],
)
def test_gemm_descriptor_kernel(gemm: ModuleType, cfg: dict[str, Any]) -> None:
    if not gemm._HAS_HOST_TMA:
        pytest.skip("this triton has no host-side TensorDescriptor")
    cfg = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, **cfg}
    for m, shape, dtype in ((7, MINERU, torch.float16), (70, (3, 2, 4, 40), torch.float32)):
        x, w, b = _inputs(m, *shape, dtype, True)
        n = shape[-1]
        out = _poisoned(m, n, dtype)
        gemm.patchify_gemm(x.reshape(m, -1), w.reshape(n, -1), b, config=cfg, out=out)
        assert _rel_err(out, _reference(x, w, b)) < TOL[dtype]


def test_gemm_descriptor_kernel_from_tma_min_m_rows_on(gemm: ModuleType) -> None:
    if not gemm._HAS_HOST_TMA:
        pytest.skip("this triton has no host-side TensorDescriptor")
    cfg = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "tma": True, "tma_min_m": 100}
    for m, kernel in ((7, gemm._gemm_ptr_kernel), (99, gemm._gemm_ptr_kernel),
                      (100, gemm._gemm_tma_kernel)):  # fmt: skip
        x, w, b = _inputs(m, *MINERU, torch.float16, True)
        a, wf = x.reshape(m, -1), w.reshape(1280, -1)
        assert gemm.prepare(a, wf, b, cfg)[0] is kernel, m
        out = _poisoned(m, 1280, torch.float16)
        gemm.patchify_gemm(a, wf, b, config=cfg, out=out)
        assert _rel_err(out, _reference(x, w, b)) < TOL[torch.float16]


def test_gemm_persistent_pointer_kernel(gemm: ModuleType) -> None:
    # More tiles than the interpreter's programs (4), so each program walks several, the last
    # ones partial in M and N, the K tail peeled in each.
    cfg = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "tma": False, "persistent": True}
    for m, shape, dtype, bias in (
        (130, (3, 2, 4, 40), torch.float32, True),
        (70, (3, 2, 5, 96), torch.float16, False),
    ):
        x, w, b = _inputs(m, *shape, dtype, bias)
        n = shape[-1]
        a, wf = x.reshape(m, -1), w.reshape(n, -1)
        kernel, grid, _, _ = gemm.prepare(a, wf, b, cfg)
        assert kernel is gemm._gemm_ptr_kernel and grid == (gemm.INTERPRETER_SM_COUNT,)
        out = _poisoned(m, n, dtype)
        gemm.patchify_gemm(a, wf, b, config=cfg, out=out)
        assert _rel_err(out, _reference(x, w, b)) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [MINERU, (3, 2, 5, 96)])
def test_linear(mods: dict[str, ModuleType], dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    for m, bias in ((1, False), (7, True), (130, True)):
        x, w, b = _inputs(m, *shape, dtype, bias)
        out = mods["linear"].triton_conv3d_patchify(x, w, b)
        assert out.shape == (m, shape[-1]) and out.dtype == dtype
        assert _rel_err(out, _reference(x, w, b)) < TOL[dtype]


def test_empty_batch_and_bad_shapes(mods: dict[str, ModuleType]) -> None:
    for scheme in SCHEMES:
        x, w, _ = _inputs(0, 3, 2, 4, 8, torch.float32, False)
        assert mods[scheme].triton_conv3d_patchify(x, w).shape == (0, 8)
    x, w, _ = _inputs(2, 3, 2, 4, 8, torch.float32, False)
    with pytest.raises((ValueError, RuntimeError)):
        mods["gemm"].triton_conv3d_patchify(x, w[:, :2])
    with pytest.raises((ValueError, RuntimeError)):
        mods["gemm"].triton_conv3d_patchify(x, w, torch.zeros(5))


def test_kernels_run_in_interpreter(mods: dict[str, ModuleType]) -> None:
    # Otherwise the CPU path would be F.linear and the tests above would prove nothing.
    assert mods["gemm"].INTERPRETING


# ------------------------------------------------------------------------------ weights


def test_weight_modified_in_place_is_seen(mods: dict[str, ModuleType]) -> None:
    # gemm caches a row-padded copy of the weight: an in-place update such as a late weight
    # load must still show up in the very next call.
    for scheme in SCHEMES:
        x, w, b = _inputs(5, 3, 2, 4, 24, torch.float32, True)
        first = mods[scheme].triton_conv3d_patchify(x, w, b)
        assert _rel_err(first, _reference(x, w, b)) < 1e-5
        with torch.no_grad():
            w.mul_(-2.0)
            w[0].add_(1.0)
        second = mods[scheme].triton_conv3d_patchify(x, w, b)
        assert _rel_err(second, _reference(x, w, b)) < 1e-5, scheme


def test_gemm_repeat_calls_reuse_one_prepared_launch(gemm: ModuleType) -> None:
    """Eager calls keep one prepared launch per layout key: a repeat call gives the bytes a
    fresh launch gives, and everything the key leaves out (in-place weight updates) or the
    entry does not keep (layouts that need a copy) is still seen."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(24, 3, 2, 4, 4, generator=gen)
    bias_store = torch.randn(48, generator=gen)
    bias = bias_store[:24]

    def fresh(m: int, offset: int = 0) -> torch.Tensor:
        flat = torch.randn(m * 96 + offset, generator=gen)
        return flat[offset:].view(m, 3, 2, 4, 4)

    def check(x: torch.Tensor, b: torch.Tensor | None) -> None:
        got = gemm.triton_conv3d_patchify(x, w, b)
        uncached = gemm.patchify_gemm(x.reshape(x.shape[0], -1), w.reshape(24, -1), b)
        assert torch.equal(got, uncached)
        assert _rel_err(got, _reference(x, w, b)) < 1e-5

    with torch.no_grad():
        for _ in range(3):
            check(fresh(5), bias)
        check(fresh(5), None)
        assert len(gemm._calls) == 2  # one per key: with and without bias
        w.mul_(-0.5)  # a new version: the same key, a fresh packed copy
        check(fresh(5), bias)
        assert len(gemm._calls) == 2
        check(fresh(5, offset=1), bias)  # 4 bytes off: Triton specialises on alignment
        assert len(gemm._calls) == 3
        # A layout whose flatten is a copy runs, but is never kept: the entry would read x.
        check(fresh(5).transpose(3, 4), bias)
        # A strided bias is made contiguous per call (the kernel reads bias_ptr + n).
        check(fresh(5), bias_store[::2])
        assert len(gemm._calls) == 3
    gemm.clear_config_cache()
    assert not gemm._calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gemm_packs_weight_rows_to_128_bytes(gemm: ModuleType, dtype: torch.dtype) -> None:
    # K = 1176 rows are 2352 bytes; the kernel must run on a cached copy whose rows start on
    # 128-byte lines (the measured gain), and give the same result as with the raw weight.
    x, w, b = _inputs(70, *MINERU, dtype, True)
    ref = _reference(x, w, b)
    a, w2 = x.reshape(70, -1), w.reshape(1280, -1)
    out = _poisoned(70, 1280, dtype)
    gemm.patchify_gemm(a, w2, b, out=out)
    assert _rel_err(out, ref) < TOL[dtype]
    (src, packed), *_ = gemm._packed_cache.values()
    assert src.data_ptr() == w2.data_ptr()
    assert packed.shape == w2.shape and torch.equal(packed, w2)
    assert (packed.stride(0) * packed.element_size()) % 128 == 0
    assert packed.stride(0) > w2.stride(0)
    # The same weight again is a cache hit, not a second copy.
    gemm.patchify_gemm(a, w2, b, out=out)
    assert len(gemm._packed_cache) == 1
    # pack_weight=False runs on the raw weight and caches nothing.
    gemm.clear_config_cache()
    out = _poisoned(70, 1280, dtype)
    gemm.patchify_gemm(a, w2, b, config={"pack_weight": False}, out=out)
    assert _rel_err(out, ref) < TOL[dtype] and not gemm._packed_cache


def test_gemm_weight_write_through_data_needs_clear(gemm: ModuleType) -> None:
    # .data writes bypass the version counter (vllm's default weight loader writes that way):
    # clear_config_cache() is the documented way to drop the stale copy.
    x, w, _ = _inputs(9, *MINERU, torch.float32, False)
    a, w2 = x.reshape(9, -1), w.reshape(1280, -1)
    gemm.patchify_gemm(a, w2)
    w2.data.mul_(-1.0)
    gemm.clear_config_cache()
    assert _rel_err(gemm.patchify_gemm(a, w2), _reference(x, w, None)) < 1e-5


def test_gemm_inference_tensor_weight_is_not_cached(gemm: ModuleType) -> None:
    with torch.inference_mode():
        x, w, _ = _inputs(9, *MINERU, torch.float32, False)
        a, w2 = x.reshape(9, -1), w.reshape(1280, -1)
        first = gemm.patchify_gemm(a, w2)
        w2.mul_(2.0)
        second = gemm.patchify_gemm(a, w2)
    assert not gemm._packed_cache
    assert _rel_err(second, 2.0 * first.double()) < 1e-5


# ------------------------------------------------------------------------------ config


def _write_tuned(path: Path, per_arch: dict[str, Any]) -> None:
    doc = {"schema": 1, "kernels": {"patch_embed_gemm": per_arch}}
    path.write_text(json.dumps(doc))


def _default(gemm: ModuleType) -> dict[str, Any]:
    return dict(gemm.PATCH_EMBED_CONFIGS["default"]["any"])


def test_config_shipped_default_without_gpu(gemm: ModuleType) -> None:
    assert gemm.device_arch("cpu") == "cpu"
    assert gemm.resolve_config("cpu") == _default(gemm)
    fp32 = gemm.resolve_config("cpu", torch.float32)
    assert fp32 == {**_default(gemm), **gemm.PATCH_EMBED_CONFIGS["default"]["fp32"]}
    for arch, layers in gemm.PATCH_EMBED_CONFIGS.items():
        for layer, cfg in layers.items():
            assert layer in ("any", "f16", "fp32"), (arch, layer)
            assert gemm.CONFIG.validate(cfg) == cfg, (arch, layer)


def test_config_lookup_order(
    gemm: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tuned = tmp_path / "tuned.json"
    _write_tuned(
        tuned,
        {
            "default": {"BLOCK_M": 64, "num_stages": 2},
            "gfx1100": {"BLOCK_M": 16, "BLOCK_N": 16},
        },
    )
    monkeypatch.setenv("ROCMFIX_TUNED_FILE", str(tuned))
    cfg = gemm.resolve_config("cpu")
    assert cfg["BLOCK_M"] == 64 and cfg["num_stages"] == 2
    # The foreign-arch entry is ignored; untouched keys keep the shipped values.
    assert cfg["BLOCK_N"] == _default(gemm)["BLOCK_N"]
    monkeypatch.setenv("ROCMFIX_PATCH_EMBED_CONFIG", json.dumps({"BLOCK_M": 32}))
    cfg = gemm.resolve_config("cpu")
    assert cfg["BLOCK_M"] == 32 and cfg["num_stages"] == 2
    # The env config is used by the kernel: a result through it is still right.
    x, w, b = _inputs(9, 3, 2, 4, 40, torch.float32, True)
    assert _rel_err(gemm.triton_conv3d_patchify(x, w, b), _reference(x, w, b)) < 1e-5


def test_tuned_file_read_once(
    gemm: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tuned = tmp_path / "tuned.json"
    _write_tuned(tuned, {"default": {"BLOCK_K": 64}})
    monkeypatch.setenv("ROCMFIX_TUNED_FILE", str(tuned))
    assert gemm.resolve_config("cpu")["BLOCK_K"] == 64
    _write_tuned(tuned, {"default": {"BLOCK_K": 16}})
    assert gemm.resolve_config("cpu")["BLOCK_K"] == 64
    gemm.clear_config_cache()
    assert gemm.resolve_config("cpu")["BLOCK_K"] == 16


def test_tuned_file_default_location(
    gemm: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ROCMFIX_TUNED_FILE")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "rocmfix").mkdir()
    _write_tuned(tmp_path / "rocmfix" / "tuned.json", {"default": {"GROUP_M": 4}})
    assert gemm.kc.tuned_file_path() == str(tmp_path / "rocmfix" / "tuned.json")
    assert gemm.resolve_config("cpu")["GROUP_M"] == 4


@pytest.mark.parametrize(
    "content",
    ["{not json", json.dumps({"schema": 99, "kernels": {}}), json.dumps([1, 2])],
    ids=["garbage", "wrong-schema", "not-an-object"],
)
def test_corrupt_tuned_file_warns_once(
    gemm: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str
) -> None:
    tuned = tmp_path / "tuned.json"
    tuned.write_text(content)
    monkeypatch.setenv("ROCMFIX_TUNED_FILE", str(tuned))
    with pytest.warns(RuntimeWarning, match="tuned file"):
        cfg = gemm.resolve_config("cpu")
    assert cfg == _default(gemm)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gemm.resolve_config("cpu") == cfg


def test_a_source_with_a_bad_key_is_ignored_whole(
    gemm: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Half a config is one nobody measured: the whole entry goes, with one warning naming
    # every bad key.
    tuned = tmp_path / "tuned.json"
    _write_tuned(tuned, {"default": {"BLOCK_M": 64, "BLOCK_Q": 1, "BLOCK_N": 100}})
    monkeypatch.setenv("ROCMFIX_TUNED_FILE", str(tuned))
    with pytest.warns(RuntimeWarning, match="BLOCK_Q.*BLOCK_N=100") as caught:
        cfg = gemm.resolve_config("cpu")
    assert len(caught) == 1
    assert cfg == _default(gemm)
    monkeypatch.setenv("ROCMFIX_PATCH_EMBED_CONFIG", "[oops")
    with pytest.warns(RuntimeWarning, match="ROCMFIX_PATCH_EMBED_CONFIG"):
        assert gemm.resolve_config("cpu") == _default(gemm)
    monkeypatch.setenv("ROCMFIX_PATCH_EMBED_CONFIG", json.dumps({"BLOCK_M": 64}))
    assert gemm.resolve_config("cpu")["BLOCK_M"] == 64
    with pytest.raises(ValueError, match="unknown key 'BLOCK_Q'"):
        gemm.patchify_gemm(torch.ones(2, 4), torch.ones(3, 4), config={"BLOCK_Q": 1})


def _fake_gpu(monkeypatch: pytest.MonkeyPatch, hip: str | None, **props: Any) -> None:
    class Props:
        multi_processor_count = 132

    for key, value in props.items():
        setattr(Props, key, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Props())
    monkeypatch.setattr(torch.version, "hip", hip)


def test_arch_detection_and_arch_entries(
    gemm: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_gpu(monkeypatch, None, major=9, minor=0)
    assert gemm.device_arch("cuda:0") == "sm_90"
    shipped = {**_default(gemm), **gemm.PATCH_EMBED_CONFIGS["sm_90"]["f16"]}
    assert gemm.resolve_config("cuda:0") == shipped
    tuned = tmp_path / "tuned.json"
    _write_tuned(tuned, {"sm_90": {"num_stages": 5}, "gfx942": {"num_stages": 1}})
    monkeypatch.setenv("ROCMFIX_TUNED_FILE", str(tuned))
    assert gemm.resolve_config("cuda:0")["num_stages"] == 5
    gemm.clear_config_cache()
    _fake_gpu(monkeypatch, "6.4", gcnArchName="gfx942:sramecc+:xnack-")
    assert gemm.device_arch("cuda:0") == "gfx942"
    assert gemm.resolve_config("cuda:0")["num_stages"] == 1
    assert gemm.resolve_config("cuda:0")["matrix_instr_nonkdim"] == 16
    gemm.clear_config_cache()

    def broken(index: int) -> None:
        raise RuntimeError("no driver")

    monkeypatch.setattr(torch.cuda, "get_device_properties", broken)
    assert gemm.device_arch("cuda:0") == "unknown"
    assert gemm.resolve_config("cuda:0") == _default(gemm)


# ------------------------------------------------------------------------------ op / import


def test_second_import_keeps_op_working(mods: dict[str, ModuleType]) -> None:
    again = _load("gemm")
    x, w, b = _inputs(3, 3, 2, 4, 16, torch.float32, True)
    ref = _reference(x, w, b)
    assert _rel_err(again.triton_conv3d_patchify(x, w, b), ref) < 1e-5
    assert _rel_err(mods["gemm"].triton_conv3d_patchify(x, w, b), ref) < 1e-5
    assert hasattr(torch.ops.rocmfix, again.OP_NAME)


def test_templates_import_only_stdlib_torch_triton_and_their_support() -> None:
    # A template lands in a package it must not depend on: only the standard library, torch,
    # triton, and the support templates its scheme drops beside it (relatively, so it is
    # always that copy).
    allowed = set(sys.stdlib_module_names) | {"torch", "triton", "__future__"}
    beside: dict[str, set[str]] = {}
    for scheme in (s for op in OPS for s in op.schemes):
        for name in scheme.templates:
            beside.setdefault(name, set()).update(t[:-3] for t in scheme.support)
    # A patch without an op may drop one runner, alone (the graph replay's).
    for patch in all_patches():
        if patch.runner is not None:
            beside.setdefault(patch.runner, set())
    assert set(beside) == {p.name for p in TEMPLATES.glob("*.py")} - {"__init__.py"}
    for path in sorted(TEMPLATES.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level:
                assert (node.level, node.module) == (1, None), f"{path.name}: relative import"
                names = {a.name for a in node.names}
                assert names <= beside[path.name] - {path.name[:-3]}, (path.name, names)
                continue
            elif isinstance(node, ast.ImportFrom):
                roots = {(node.module or "").split(".")[0]}
            else:
                continue
            assert roots <= allowed, f"{path.name} imports {roots - allowed}"


def test_public_surface(mods: dict[str, ModuleType]) -> None:
    for scheme in SCHEMES:
        mod = mods[scheme]
        assert scheme == mod.SCHEME
        assert callable(mod.triton_conv3d_patchify)
        assert mod.__doc__ and "rocmfix revert" in mod.__doc__


def test_opcheck(mods: dict[str, ModuleType]) -> None:
    opcheck = getattr(torch.library, "opcheck", None)
    if opcheck is None:
        pytest.skip("torch.library.opcheck needs torch >= 2.4")
    op = getattr(torch.ops.rocmfix, mods["gemm"].OP_NAME).default
    x, w, b = _inputs(3, 3, 2, 4, 8, torch.float32, True)
    for bias in (b, None):
        opcheck(
            op,
            (x.reshape(3, -1), w.reshape(8, -1), bias),
            test_utils=("test_schema", "test_faketensor"),
        )


@pytest.mark.parametrize("scheme", SCHEMES)
def test_torch_compile_fullgraph(mods: dict[str, ModuleType], scheme: str) -> None:
    mod = mods[scheme]

    class PatchEmbed(torch.nn.Module):
        # vllm's Qwen2VisionPatchEmbed after rocmfix rewrote its forward.
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Conv3d(3, 24, (2, 4, 4), stride=(2, 4, 4), bias=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            L, _ = x.shape
            x = x.view(L, -1, 2, 4, 4)
            return mod.triton_conv3d_patchify(x, self.proj.weight, self.proj.bias)

    torch._dynamo.reset()
    model = PatchEmbed().eval()
    x = torch.randn(6, 96)
    with torch.no_grad():
        ref = model.proj(x.view(6, 3, 2, 4, 4)).reshape(6, 24)
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        out = compiled(x)
        x2 = torch.randn(11, 96)
        out2 = compiled(x2)
        ref2 = model.proj(x2.view(11, 3, 2, 4, 4)).reshape(11, 24)
    assert _rel_err(out, ref.double()) < 1e-5
    assert _rel_err(out2, ref2.double()) < 1e-5


def test_config_too_big_for_the_gpu_falls_back(
    gemm: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not gemm._OUT_OF_RESOURCES:
        pytest.skip("this triton has no OutOfResources")
    real = gemm._launch
    calls: list[int] = []

    def first_call_out_of_resources(*args: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise gemm._OUT_OF_RESOURCES[0](300000, 232448, "shared memory")
        real(*args)

    monkeypatch.setattr(gemm, "_launch", first_call_out_of_resources)
    x, w, b = _inputs(5, 3, 2, 4, 24, torch.float32, True)
    with pytest.warns(RuntimeWarning, match="does not fit"):
        out = gemm.triton_conv3d_patchify(x, w, b)
    assert len(calls) == 2
    assert _rel_err(out, _reference(x, w, b)) < 1e-5


def test_too_many_stages_step_down_once(gemm: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    # The sm_90 config leaves 3 KB of shared memory. A triton that needs more must land on one
    # stage less (same tile, still pipelined), not on the portable default, and remember it.
    if not gemm._OUT_OF_RESOURCES:
        pytest.skip("this triton has no OutOfResources")
    real = gemm._launch
    stages: list[int] = []

    def four_stages_do_not_fit(a: Any, w: Any, bias: Any, out: Any, plan: Any, *rest: Any) -> None:
        stages.append(plan.opts["num_stages"])
        if plan.opts["num_stages"] >= 4:
            raise gemm._OUT_OF_RESOURCES[0](235000, 232448, "shared memory")
        real(a, w, bias, out, plan, *rest)

    monkeypatch.setattr(gemm, "_launch", four_stages_do_not_fit)
    monkeypatch.setenv(
        "ROCMFIX_PATCH_EMBED_CONFIG",
        json.dumps({"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "num_stages": 4}),
    )
    gemm.clear_config_cache()
    x, w, b = _inputs(70, 3, 2, 4, 24, torch.float32, True)
    with pytest.warns(RuntimeWarning, match="does not fit"):
        out = gemm.triton_conv3d_patchify(x, w, b)
    assert _rel_err(out, _reference(x, w, b)) < 1e-5
    assert stages == [4, 3]
    out = gemm.triton_conv3d_patchify(x, w, b)
    assert stages == [4, 3, 3], "the smaller plan was not kept"
    assert _rel_err(out, _reference(x, w, b)) < 1e-5


def test_missing_triton_falls_back_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = load_template("patch_embed_gemm", block_triton=True)
    assert not mod.rt.HAS_TRITON
    x, w, b = _inputs(4, 3, 2, 4, 8, torch.float32, True)
    ref = _reference(x, w, b)
    a2, w2 = x.reshape(4, -1), w.reshape(8, -1)
    # The op's kernel path (a GPU's, here the interpreter's) warns; a CPU call is F.linear.
    monkeypatch.setattr(mod, "INTERPRETING", True)
    with pytest.warns(RuntimeWarning, match="triton is not importable"):
        out = mod._impl(a2, w2, b)
    assert _rel_err(out, ref) < 1e-5
    monkeypatch.setattr(mod, "INTERPRETING", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _rel_err(mod._impl(a2, w2, b), ref) < 1e-5
