"""CPU tests of the kernel == stride transposed conv as a GEMM (templates/conv_transpose_linear.py).

The entry point keeps CPU inputs on the stock module, so the GEMM itself (:func:`gemm`) is
checked here against ``nn.ConvTranspose2d`` at the DB head's shapes scaled down and at odd
sizes, kernels and layouts; bench/depthwise_conv.py checks the entry on a GPU.
"""

from __future__ import annotations

import warnings
from types import ModuleType
from typing import Any

import pytest
import torch

from conftest import load_template


@pytest.fixture(scope="module")
def ct() -> ModuleType:
    return load_template("conv_transpose_linear")


CASES = [
    # (batch, in, out, kernel, h, w, dtype): the DB head's 64 -> 16 and 16 -> 1, scaled down.
    (1, 8, 4, 2, 12, 9, torch.float32),
    (1, 4, 1, 2, 15, 11, torch.float32),
    (3, 5, 6, 3, 4, 7, torch.float32),
    (2, 6, 3, 2, 5, 5, torch.float16),
    (1, 3, 2, 4, 1, 1, torch.float32),
]


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("layout", ["nchw", "channels_last", "strided"])
@pytest.mark.parametrize("bias", [True, False])
def test_gemm_matches_conv_transpose(ct: ModuleType, case: tuple, layout: str, bias: bool) -> None:
    n, cin, cout, k, h, w, dtype = case
    deconv = torch.nn.ConvTranspose2d(cin, cout, k, k, bias=bias)
    x = torch.randn(n, cin, h, w)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "strided":
        x = torch.randn(n, cin, h, 2 * w)[..., ::2]
    with torch.no_grad():
        want = deconv(x)
        assert ct.handled(x.to(dtype), deconv.to(dtype))
        got = ct.gemm(x.to(dtype), deconv.weight, deconv.bias)
        deconv.float()
    assert got.dtype == dtype and got.shape == want.shape and got.is_contiguous()
    tol = 1e-5 if dtype == torch.float32 else 5e-3
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kernel_size": 3, "stride": 2},
        {"kernel_size": 2, "stride": 2, "padding": 1},
        {"kernel_size": 2, "stride": 2, "output_padding": 1, "dilation": 2},
        {"kernel_size": 2, "stride": 2, "groups": 2},
        {"kernel_size": 2, "stride": 1},
    ],
    ids=str,
)
def test_other_transposed_convs_are_not_handled(ct: ModuleType, kwargs: dict[str, Any]) -> None:
    deconv = torch.nn.ConvTranspose2d(4, 4, **kwargs)
    assert not ct.handled(torch.randn(1, 4, 5, 5), deconv)


def test_cpu_input_runs_the_module_bit_for_bit(ct: ModuleType) -> None:
    deconv = torch.nn.ConvTranspose2d(6, 3, 2, 2)
    seen: list[int] = []
    deconv.register_forward_hook(lambda *_: seen.append(1))
    x = torch.randn(1, 6, 7, 5)
    with torch.no_grad():
        assert torch.equal(ct.conv_transpose2d(x, deconv), deconv(x))
    assert seen == [1, 1]


class _FakeCuda(torch.Tensor):
    """A CPU tensor that says it is on a GPU: the entry's GPU path, on a machine without one."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def test_entry_takes_the_gemm_and_survives_its_failure(
    ct: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = load_template("conv_transpose_linear")
    deconv = torch.nn.ConvTranspose2d(8, 4, 2, 2).eval()
    x = torch.randn(1, 8, 6, 5).as_subclass(_FakeCuda)
    used: list[int] = []
    real = module._run

    def spy(*args: Any) -> torch.Tensor:
        used.append(1)
        return real(*args)  # type: ignore[no-any-return]

    monkeypatch.setattr(module, "_run", spy)
    with torch.no_grad():
        want = deconv(x.as_subclass(torch.Tensor))
        torch.testing.assert_close(module.conv_transpose2d(x, deconv).as_subclass(torch.Tensor),
                                   want, rtol=1e-5, atol=1e-5)  # fmt: skip
    assert used == [1]
    # Autograd recording: the module runs.
    module.conv_transpose2d(x, deconv)
    assert used == [1]

    def broken(*_: Any) -> torch.Tensor:
        raise RuntimeError("simulated hipBLASLt failure")

    monkeypatch.setattr(module, "_run", broken)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for _ in range(3):
            got = module.conv_transpose2d(x, deconv).as_subclass(torch.Tensor)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert len([w for w in caught if "simulated hipBLASLt" in str(w.message)]) == 1


CHANGES = [
    "weight-inplace", "bias-inplace", "weight-replaced", "bias-removed", "weight-data",
    "bias-data", "stride", "padding", "layer-hook", "global-hook", "channels-last",
    "float64", "grad",
]  # fmt: skip


@pytest.mark.parametrize("contiguous", [True, False], ids=["weight", "strided-weight"])
@pytest.mark.parametrize("change", CHANGES)
def test_a_layers_prepared_views_never_go_stale(change: str, contiguous: bool) -> None:
    """After a layer's plan replays, each change of what it was made from or for gives the
    module's own result. A strided weight's [Cin, Cout*k*k] matrix is a copy, so an in-place
    update is seen only through the weight's version; a contiguous one's is a view."""
    module = load_template("conv_transpose_linear")
    deconv = torch.nn.ConvTranspose2d(6, 4, 2, 2).eval()
    if not contiguous:
        deconv.weight = torch.nn.Parameter(torch.randn(4, 6, 2, 2).transpose(0, 1))
    x = torch.randn(1, 6, 5, 4)
    seen: list[str] = []
    with torch.no_grad():
        for _ in range(2):
            got = module.conv_transpose2d(x.as_subclass(_FakeCuda), deconv)
            torch.testing.assert_close(got.as_subclass(torch.Tensor), deconv(x),
                                       rtol=1e-5, atol=1e-5)  # fmt: skip
        assert id(deconv) in module._layers and module._layers[id(deconv)][-2] is not None
        if change == "weight-inplace":
            deconv.weight.mul_(-3.0)
        elif change == "bias-inplace":
            deconv.bias.add_(5.0)
        elif change == "weight-replaced":
            deconv.weight = torch.nn.Parameter(torch.randn_like(deconv.weight))
        elif change == "bias-removed":
            deconv.bias = None
        elif change == "weight-data":
            deconv.weight.data = torch.randn_like(deconv.weight)
        elif change == "bias-data":
            deconv.bias.data = torch.randn_like(deconv.bias)
        elif change == "stride":
            deconv.stride = (1, 1)
        elif change == "padding":
            deconv.padding = (1, 1)
        elif change == "layer-hook":
            deconv.register_forward_hook(lambda *_: seen.append("layer"))
        elif change == "channels-last":
            x = x.contiguous(memory_format=torch.channels_last)
        elif change == "float64":
            deconv.double()
            x = x.double()
    hook = None
    if change == "global-hook":
        hook = torch.nn.modules.module.register_module_forward_hook(
            lambda *_: seen.append("global")
        )
    if change == "grad":
        x.requires_grad_(True)
    try:
        with torch.set_grad_enabled(change == "grad"):
            for _ in range(2):
                got = module.conv_transpose2d(x.as_subclass(_FakeCuda), deconv)
                want = deconv(x)
                torch.testing.assert_close(got.as_subclass(torch.Tensor), want,
                                           rtol=1e-5, atol=1e-5)  # fmt: skip
                if change == "grad":
                    assert got.requires_grad
    finally:
        if hook is not None:
            hook.remove()
    assert bool(seen) == change.endswith("-hook")


@pytest.mark.parametrize("contiguous", [True, False], ids=["weight", "strided-weight"])
def test_inference_tensors_are_never_stale(contiguous: bool) -> None:
    """Inference tensors have no version: a layer whose [Cin, Cout*k*k] matrix is a copy (a
    strided weight) is prepared each call; a contiguous weight's views share its memory, so
    they are kept and see every in-place update."""
    module = load_template("conv_transpose_linear")
    with torch.inference_mode():
        deconv = torch.nn.ConvTranspose2d(6, 4, 2, 2).eval()
        if not contiguous:
            deconv.weight = torch.nn.Parameter(torch.randn(4, 6, 2, 2).transpose(0, 1))
        x = torch.randn(2, 6, 3, 5)
        fake = x.as_subclass(_FakeCuda)
        for _ in range(3):
            got = module.conv_transpose2d(fake, deconv).as_subclass(torch.Tensor)
            torch.testing.assert_close(got, deconv(x), rtol=1e-5, atol=1e-5)
            deconv.weight.mul_(2.0)
    assert (id(deconv) in module._layers) == contiguous


@pytest.mark.parametrize("contiguous", [True, False], ids=["weight", "strided-weight"])
def test_a_layers_next_calls_prepare_nothing(
    monkeypatch: pytest.MonkeyPatch, contiguous: bool
) -> None:
    module = load_template("conv_transpose_linear")
    made: list[str] = []
    for name in ("_views", "_spec", "handled"):
        real = getattr(module, name)

        def spy(*args: Any, _real: Any = real, _name: str = name) -> Any:
            made.append(_name)
            return _real(*args)

        monkeypatch.setattr(module, name, spy)
    deconv = torch.nn.ConvTranspose2d(6, 4, 2, 2).eval()
    if not contiguous:
        deconv.weight = torch.nn.Parameter(torch.randn(4, 6, 2, 2).transpose(0, 1))
    x = torch.randn(1, 6, 5, 4)
    last = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        for _ in range(3):
            module.conv_transpose2d(x.as_subclass(_FakeCuda), deconv)
        assert sorted(made) == ["_spec", "_views", "handled"]
        # A new input layout prepares its shapes alone, and a known one nothing.
        for t in (last, x, last):
            module.conv_transpose2d(t.as_subclass(_FakeCuda), deconv)
        assert made[3:] == ["handled", "_spec"]
        # An updated weight: nothing where the views share its memory, else the views and
        # the layout's shapes anew.
        deconv.weight.mul_(2.0)
        got = module.conv_transpose2d(x.as_subclass(_FakeCuda), deconv)
        torch.testing.assert_close(got.as_subclass(torch.Tensor), deconv(x),
                                   rtol=1e-5, atol=1e-5)  # fmt: skip
    assert made[5:] == ([] if contiguous else ["_views", "handled", "_spec"])


@pytest.mark.parametrize("kind", ["conv2d", "kernel-3-stride-2"])
def test_a_layer_the_gemm_does_not_compute_replays_the_module(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A call site that passes a layer the GEMM does not compute (OCR det's head passes one
    every forward) runs the module, and from its second call on without the first call's
    preparation; a hook added later is still honoured."""
    module = load_template("conv_transpose_linear")
    layer: Any = (
        torch.nn.Conv2d(6, 4, 3, padding=1)
        if kind == "conv2d"
        else torch.nn.ConvTranspose2d(6, 4, 3, 2)
    )
    made: list[int] = []
    real = module._first

    def spy(*args: Any) -> Any:
        made.append(1)
        return real(*args)

    monkeypatch.setattr(module, "_first", spy)
    x = torch.randn(1, 6, 5, 4)
    seen: list[int] = []
    with torch.no_grad():
        for _ in range(3):
            got = module.conv_transpose2d(x.as_subclass(_FakeCuda), layer)
            torch.testing.assert_close(got.as_subclass(torch.Tensor), layer(x))
        assert made == [1]
        layer.register_forward_hook(lambda *_: seen.append(1))
        module.conv_transpose2d(x.as_subclass(_FakeCuda), layer)
    assert seen == [1] and made == [1, 1]


def test_under_torch_compile_the_gemm_is_traced_fullgraph(monkeypatch: pytest.MonkeyPatch) -> None:
    """No address or version reads in a graph: a traced call runs :func:`gemm_traced` as graph
    ops."""
    module = load_template("conv_transpose_linear")
    used: list[int] = []
    real = module.gemm_traced

    def spy(*args: Any) -> torch.Tensor:
        used.append(1)
        return real(*args)  # type: ignore[no-any-return]

    monkeypatch.setattr(module, "gemm_traced", spy)
    deconv = torch.nn.ConvTranspose2d(8, 4, 2, 2).eval()
    x = torch.randn(1, 8, 6, 5)
    compiled = torch.compile(lambda t: module.conv_transpose2d(t, deconv), backend="eager",
                             fullgraph=True)  # fmt: skip
    with torch.no_grad():
        got = compiled(x.as_subclass(_FakeCuda)).as_subclass(torch.Tensor)
        torch.testing.assert_close(got, deconv(x), rtol=1e-5, atol=1e-5)
    assert used == [1]
