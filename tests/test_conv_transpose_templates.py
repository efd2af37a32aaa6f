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
    real = module._shuffle

    def spy(*args: Any) -> torch.Tensor:
        used.append(1)
        return real(*args)  # type: ignore[no-any-return]

    monkeypatch.setattr(module, "_shuffle", spy)
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

    monkeypatch.setattr(module, "_shuffle", broken)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for _ in range(3):
            got = module.conv_transpose2d(x, deconv).as_subclass(torch.Tensor)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert len([w for w in caught if "simulated hipBLASLt" in str(w.message)]) == 1


@pytest.mark.parametrize("contiguous", [True, False], ids=["weight", "strided-weight"])
@pytest.mark.parametrize(
    "change", ["weight-inplace", "bias-inplace", "weight-replaced", "bias-removed", "stride"]
)
def test_a_layers_prepared_views_never_go_stale(change: str, contiguous: bool) -> None:
    """After a layer's views and layout are prepared, each change of what they were made
    from gives the module's own result. A strided weight's [Cin, Cout*k*k] matrix is a copy,
    so an in-place update is seen only through the weight's version."""
    module = load_template("conv_transpose_linear")
    deconv = torch.nn.ConvTranspose2d(6, 4, 2, 2).eval()
    if not contiguous:
        deconv.weight = torch.nn.Parameter(torch.randn(4, 6, 2, 2).transpose(0, 1))
    x = torch.randn(1, 6, 5, 4)
    fake = x.as_subclass(_FakeCuda)
    with torch.no_grad():
        for _ in range(2):
            got = module.conv_transpose2d(fake, deconv).as_subclass(torch.Tensor)
            torch.testing.assert_close(got, deconv(x), rtol=1e-5, atol=1e-5)
        assert id(deconv) in module._layers
        if change == "weight-inplace":
            deconv.weight.mul_(-3.0)
        elif change == "bias-inplace":
            deconv.bias.add_(5.0)
        elif change == "weight-replaced":
            deconv.weight = torch.nn.Parameter(torch.randn_like(deconv.weight))
        elif change == "bias-removed":
            deconv.bias = None
        else:
            deconv.stride = (1, 1)
        want = deconv(x)
        for _ in range(2):
            got = module.conv_transpose2d(fake, deconv).as_subclass(torch.Tensor)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_inference_tensors_are_prepared_each_call() -> None:
    module = load_template("conv_transpose_linear")
    with torch.inference_mode():
        deconv = torch.nn.ConvTranspose2d(6, 4, 2, 2).eval()
        x = torch.randn(2, 6, 3, 5)
        fake = x.as_subclass(_FakeCuda)
        for _ in range(2):
            got = module.conv_transpose2d(fake, deconv).as_subclass(torch.Tensor)
            torch.testing.assert_close(got, deconv(x), rtol=1e-5, atol=1e-5)
            deconv.weight.mul_(2.0)
    assert id(deconv) not in module._layers


def test_a_layers_next_calls_prepare_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    module = load_template("conv_transpose_linear")
    made: list[str] = []
    for name in ("_views", "_spec", "handled"):
        real = getattr(module, name)

        def spy(*args: Any, _real: Any = real, _name: str = name) -> Any:
            made.append(_name)
            return _real(*args)

        monkeypatch.setattr(module, name, spy)
    deconv = torch.nn.ConvTranspose2d(6, 4, 2, 2).eval()
    x = torch.randn(1, 6, 5, 4)
    with torch.no_grad():
        for _ in range(3):
            module.conv_transpose2d(x.as_subclass(_FakeCuda), deconv)
        assert sorted(made) == ["_spec", "_views", "handled"]
        # A new input layout prepares its shapes alone; an updated weight its views alone.
        module.conv_transpose2d(x.contiguous(memory_format=torch.channels_last)
                                .as_subclass(_FakeCuda), deconv)  # fmt: skip
        deconv.weight.mul_(2.0)
        module.conv_transpose2d(x.as_subclass(_FakeCuda), deconv)
    assert made[3:] == ["handled", "_spec", "_views", "handled", "_spec"]


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
