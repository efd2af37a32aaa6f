"""What makes a kernel entry's cached plan stale, and that the next call sees it
(templates/depthwise_conv_triton.py, conv_transpose_linear.py, dilated_conv_triton.py,
patch_embed_gemm.py, rocmfix_kernel_support.py): each test lets a plan stand, changes what
the result depends on the way real code does, and checks the next call against the stock
modules. Every test failed on the code before these fixes (a review of the replay paths,
2026-11-26).

Training is the case version counters miss: BatchNorm's train-mode forward updates its running
statistics inside aten's batch_norm without moving their versions, and a fused optimizer step
(``AdamW(fused=True)``, transformers' default on torch >= 2.8) writes parameters without
moving theirs. A call autograd records takes the stock modules; every optimizer step makes
the kernel modules forget what they derived (ks.training_seen, an optimizer step hook); the
BatchNorm's ``num_batches_tracked`` stamps its statistics. Writes through ``.data`` move no
version either, outside any training step: code that does that to a live model calls the
kernel module's ``clear_config_cache()`` (documented, not tested).

The Triton kernels run in their CPU interpreter; the transposed conv's GEMM path is reached
with a CPU tensor that says it is on a GPU (as its own tests do).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from types import ModuleType
from typing import Any

import pytest
import torch

from conftest import load_template

pytest.importorskip("triton")
pytestmark = [
    pytest.mark.usefixtures("no_kernel_config"),
    pytest.mark.filterwarnings("ignore:`torch.jit.trace:FutureWarning"),
]


@pytest.fixture(scope="module")
def tri() -> ModuleType:
    return load_template("depthwise_conv_triton")


def _layer(c: int = 4, k: tuple[int, int] = (3, 3), bias: bool = False) -> tuple[Any, Any, Any]:
    conv = torch.nn.Conv2d(c, c, k, 1, ((k[0] - 1) // 2, (k[1] - 1) // 2), groups=c, bias=bias)
    bn = torch.nn.BatchNorm2d(c)
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 1.5)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    return conv.eval(), bn.eval(), torch.nn.ReLU()


def _replaying(tri: ModuleType, x: torch.Tensor, conv: Any, bn: Any, act: Any) -> None:
    """Two calls: the first plans, the second replays; both must equal the stock layer."""
    tri.clear_config_cache()
    with torch.no_grad():
        for _ in range(2):
            got = tri.depthwise_conv2d(x, conv, bn, act)
            torch.testing.assert_close(got, act(bn(conv(x))) if bn is not None else
                                       (act(conv(x)) if act is not None else conv(x)))  # fmt: skip
    assert len(tri._plans), "the kernel never ran"


# --------------------------------------------------------------------------------------------
# 1. A folded BatchNorm whose statistics or affine parameters change without a version bump.
# --------------------------------------------------------------------------------------------


def test_bn_running_stats_updated_by_a_train_mode_forward_are_seen(tri: ModuleType) -> None:
    """Train, then evaluate again (fine-tuning with periodic eval): BatchNorm's train-mode
    forward updates running_mean/running_var in place inside aten's batch_norm, whose schema
    does not mark them mutable, so their ``_version`` does not move (CPU and GPU alike). The
    replay's stamps (and ks.fold_bn's cache) see the same tensor, address and version and
    launch the fold of the OLD statistics."""
    conv, bn, act = _layer()
    x = torch.randn(2, 4, 8, 6)
    _replaying(tri, x, conv, bn, act)
    versions = (bn.running_mean._version, bn.running_var._version)
    bn.train()
    with torch.no_grad():
        for _ in range(3):  # a few training steps' forwards, with real statistics to learn
            bn(conv(torch.randn(8, 4, 8, 6) * 3.0 + 2.0))
    bn.eval()
    assert (bn.running_mean._version, bn.running_var._version) == versions  # the root cause
    with torch.no_grad():
        got = tri.depthwise_conv2d(x, conv, bn, act)
        want = act(bn(conv(x)))
    torch.testing.assert_close(got, want)


class _Block(torch.nn.Module):
    """A conv-BN-ReLU layer whose forward is the patched code's: the entry with its modules."""

    def __init__(self, tri: ModuleType) -> None:
        super().__init__()
        self.tri = tri
        self.conv, self.bn, self.act = _layer()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.tri.depthwise_conv2d(x, self.conv, self.bn, self.act)
        return out

    def stock(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.act(self.bn(self.conv(x)))
        return out


def test_a_training_step_with_a_fused_optimizer_between_evals_is_seen(tri: ModuleType) -> None:
    """Fine-tuning with periodic evaluation: eval (a plan stands), a training step through the
    patched forward with ``AdamW(fused=True)``, whose step writes the conv's and the
    BatchNorm's parameters without moving their versions, then eval again."""
    tri.clear_config_cache()
    block = _Block(tri)
    x = torch.randn(2, 4, 8, 6)
    block.eval()
    with torch.no_grad():
        block(x)
        block(x)
    assert len(tri._plans), "the kernel never ran"
    opt = torch.optim.AdamW(block.parameters(), lr=0.5, fused=True)
    block.train()
    loss = block(torch.randn(4, 4, 8, 6) * 3.0 + 2.0).square().mean()
    loss.backward()  # the entry ran the stock modules: they have a backward
    assert block.conv.weight.grad is not None and block.bn.weight.grad is not None
    before = block.bn.weight._version
    opt.step()
    assert block.bn.weight._version == before  # the root cause
    block.eval()
    with torch.no_grad():
        got = block(x)
        want = block.act(block.bn(block.conv(x)))
    torch.testing.assert_close(got, want)


# --------------------------------------------------------------------------------------------
# 2. A weight given a new shape or strides at the same address without a version bump.
# --------------------------------------------------------------------------------------------


def test_depthwise_weight_data_reassigned_to_a_view_of_itself_is_seen(tri: ModuleType) -> None:
    """``conv.weight.data = conv.weight.data.transpose(2, 3)``: same Parameter, same address,
    same version (``.data =`` bumps nothing), a 5x3 kernel where the plan has a 3x5 view of
    the storage. The replay checks neither the weight's shape nor its strides (the in-place
    ``transpose_`` case was fixed by the version stamp; this one is not)."""
    conv = torch.nn.Conv2d(4, 4, (3, 5), 1, (2, 2), groups=4, bias=False).eval()
    x = torch.randn(1, 4, 9, 8)
    _replaying(tri, x, conv, None, None)
    conv.weight.data = conv.weight.data.transpose(2, 3)
    with torch.no_grad():
        want = conv(x)
        got = tri.depthwise_conv2d(x, conv)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want)


class _FakeCuda(torch.Tensor):
    """A CPU tensor that says it is on a GPU (tests/test_conv_transpose_templates.py's)."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def _ct_replaying(module: ModuleType, x: torch.Tensor, deconv: Any) -> None:
    with torch.no_grad():
        for _ in range(2):
            got = module.conv_transpose2d(x.as_subclass(_FakeCuda), deconv)
            torch.testing.assert_close(got.as_subclass(torch.Tensor), deconv(x),
                                       rtol=1e-5, atol=1e-5)  # fmt: skip
    assert module._layers[id(deconv)][-2] is not None


@pytest.mark.parametrize("how", ["transpose_", "data-view"])
def test_conv_transpose_weight_reshaped_at_the_same_address_is_seen(how: str) -> None:
    """The transposed conv's plan stamps a contiguous weight by its address alone (the
    version only where its matrix is a copy): a square kernel transposed in place
    (``transpose_``, version moves but is not read) or re-viewed through ``.data =`` keeps
    the address, and the replay multiplies by the old [Cin, Cout*k*k] view."""
    module = load_template("conv_transpose_linear")
    deconv = torch.nn.ConvTranspose2d(6, 4, 2, 2).eval()
    x = torch.randn(1, 6, 5, 4)
    _ct_replaying(module, x, deconv)
    with torch.no_grad():
        if how == "transpose_":
            deconv.weight.transpose_(2, 3)
        else:
            deconv.weight.data = deconv.weight.data.transpose(2, 3)
        got = module.conv_transpose2d(x.as_subclass(_FakeCuda), deconv).as_subclass(torch.Tensor)
        want = deconv(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------
# 3. The transposed conv ignores autocast (the depthwise entry was fixed for it: 8bc8fdd).
# --------------------------------------------------------------------------------------------


def test_conv_transpose_under_autocast_computes_in_autocasts_dtype() -> None:
    """Under autocast the stock ConvTranspose2d computes and returns bf16; the entry (first
    call and replay) runs its GEMM in bf16 (mm is on autocast's list) but writes an fp32
    output through ``out=``: another dtype than stock, and neither's values."""
    module = load_template("conv_transpose_linear")
    deconv = torch.nn.ConvTranspose2d(8, 4, 2, 2).eval()
    x = torch.randn(1, 8, 6, 5)
    _ct_replaying(module, x, deconv)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = module.conv_transpose2d(x.as_subclass(_FakeCuda), deconv).as_subclass(torch.Tensor)
        want = deconv(x)
    assert got.dtype == want.dtype == torch.bfloat16


# --------------------------------------------------------------------------------------------
# 4. torch.fx symbolic tracing of a patched layer takes the model down.
# --------------------------------------------------------------------------------------------


class _DwLayer(torch.nn.Module):
    def __init__(self, entry: Any) -> None:
        super().__init__()
        self.entry = entry
        self.conv, self.bn, self.act = _layer()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.entry(x, self.conv, self.bn, self.act)  # type: ignore[no-any-return]


def test_fx_symbolic_trace_of_a_depthwise_layer_does_not_raise(tri: ModuleType) -> None:
    """The stock layer traces; the entry's first-call path evaluates ``x.is_cuda`` (a Proxy)
    as a bool outside any try (depthwise_conv_triton.py:474): TraceError, not the stock
    modules. (With a plan in hand the replay's try catches it and warns.)"""
    tri.clear_config_cache()
    layer = _DwLayer(tri.depthwise_conv2d).eval()
    gm = torch.fx.symbolic_trace(layer)
    x = torch.randn(1, 4, 8, 6)
    with torch.no_grad():
        torch.testing.assert_close(gm(x), layer.act(layer.bn(layer.conv(x))))


def test_fx_symbolic_trace_of_a_transposed_conv_does_not_raise() -> None:
    """conv_transpose_linear._first: ``not x.is_cuda`` on a Proxy raises TraceError."""
    module = load_template("conv_transpose_linear")

    class Head(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.deconv = torch.nn.ConvTranspose2d(8, 4, 2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return module.conv_transpose2d(x, self.deconv)  # type: ignore[no-any-return]

    head = Head().eval()
    gm = torch.fx.symbolic_trace(head)
    x = torch.randn(1, 8, 6, 5)
    with torch.no_grad():
        torch.testing.assert_close(gm(x), head.deconv(x))


# --------------------------------------------------------------------------------------------
# 5. Training through the patch embed and the dilated conv: the stock op, and what was packed
#    from the weight forgotten.
# --------------------------------------------------------------------------------------------


def test_the_patch_embed_under_autograd_is_the_stock_conv_with_its_gradient() -> None:
    """A Qwen-VL vision tower fine-tuned with the patch applied: the kernel's output carried
    no gradient, so the patch embed's weight silently stopped learning. Under autograd the
    entry runs F.conv3d; after a fused optimizer step, the next inference call packs the
    weight afresh."""
    pe = load_template("patch_embed_gemm")
    weight = torch.nn.Parameter(torch.randn(16, 3, 2, 4, 4))
    bias = torch.nn.Parameter(torch.randn(16))
    x = torch.randn(12, 3, 2, 4, 4)

    def stock(inp: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv3d(inp, weight, bias, stride=(2, 4, 4)).flatten(1)

    with torch.no_grad():
        pe.triton_conv3d_patchify(x, weight, bias)  # a call (and a packed weight) stands
        torch.testing.assert_close(pe.triton_conv3d_patchify(x, weight, bias), stock(x),
                                   rtol=2e-2, atol=2e-2)  # fmt: skip
    y = pe.triton_conv3d_patchify(x, weight, bias)
    assert y.requires_grad
    y.square().mean().backward()
    assert weight.grad is not None and bias.grad is not None
    before = weight._version
    torch.optim.AdamW([weight, bias], lr=0.5, fused=True).step()
    assert weight._version == before  # the step moved no version
    with torch.no_grad():
        torch.testing.assert_close(pe.triton_conv3d_patchify(x, weight, bias), stock(x),
                                   rtol=2e-2, atol=2e-2)  # fmt: skip


def test_the_dilated_conv_under_autograd_is_the_stock_conv_with_its_gradient() -> None:
    """DocLayout-YOLO trained with the patch applied: the block's call raised "no backward
    pass", taking training down. It runs the stock conv and modules, and a fused optimizer
    step between two evaluations is seen (the weight's pack is forgotten)."""
    dil = load_template("dilated_conv_triton")
    conv, bn, act = torch.nn.Conv2d(4, 4, 3, bias=False), torch.nn.BatchNorm2d(4), torch.nn.SiLU()
    with torch.no_grad():
        bn.running_var.uniform_(0.5, 1.5)
    x = torch.randn(1, 4, 9, 7)

    def block(inp: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = dil.dilated_conv2d(inp, conv.weight, 2, 2, bn=bn, act=act)
        return out

    def stock(inp: torch.Tensor) -> torch.Tensor:
        return act(bn(torch.nn.functional.conv2d(inp, conv.weight, None, 1, 2, 2)))

    bn.eval()
    with torch.no_grad():
        block(x)
        torch.testing.assert_close(block(x), stock(x), rtol=1e-4, atol=1e-4)
    bn.train()
    block(torch.randn(2, 4, 9, 7)).square().mean().backward()
    assert conv.weight.grad is not None and bn.weight.grad is not None
    torch.optim.AdamW([conv.weight, *bn.parameters()], lr=0.5, fused=True).step()
    bn.eval()
    with torch.no_grad():
        torch.testing.assert_close(block(x), stock(x), rtol=1e-4, atol=1e-4)


def test_a_fine_tuned_batchnorm_after_a_frozen_conv_is_seen(tri: ModuleType) -> None:
    """Detection fine-tuning often freezes the backbone's convs and BatchNorm statistics and
    trains the BatchNorm's affine parameters: the conv's weight and the input need no grad,
    the BatchNorm stays in eval mode (its batch count does not move), and a fused step writes
    its weight and bias without moving their versions."""
    tri.clear_config_cache()
    block = _Block(tri).eval()
    block.conv.weight.requires_grad_(False)
    x = torch.randn(2, 4, 8, 6)
    with torch.no_grad():
        block(x)
        block(x)
    assert len(tri._plans), "the kernel never ran"
    opt = torch.optim.AdamW(block.bn.parameters(), lr=0.5, fused=True)
    block(torch.randn(4, 4, 8, 6)).square().mean().backward()
    opt.step()
    # A new input layout: the replay cannot stand, and the next plan folds the BatchNorm anew.
    y = torch.randn(2, 4, 10, 6)
    with torch.no_grad():
        got = block(y)
        want = block.act(block.bn(block.conv(y)))
    torch.testing.assert_close(got, want)


# --------------------------------------------------------------------------------------------
# 6. Optimizer steps (hooked), compiled training, frozen layers beside trained ones.
# --------------------------------------------------------------------------------------------


def test_an_inference_call_between_the_training_forward_and_the_fused_step(
    tri: ModuleType,
) -> None:
    """A fused optimizer writes the parameters at the step, after the training forward: an
    inference call in between (a sample logged between loss and step) plans and folds the
    pre-step values, and the step moves no version. The step itself makes the plans go
    (ks.training_seen, hooked on every optimizer step)."""
    tri.clear_config_cache()
    block = _Block(tri).eval()
    x = torch.randn(2, 4, 8, 6)
    opt = torch.optim.AdamW(block.parameters(), lr=0.5, fused=True)
    loss = block(torch.randn(2, 4, 8, 6)).square().mean()
    with torch.no_grad():
        block(x)
        block(x)
    assert len(tri._plans), "the kernel never ran"
    loss.backward()
    opt.step()
    with torch.no_grad():
        got, want = block(x), block.stock(x)
    torch.testing.assert_close(got, want)


def test_training_under_torch_compile_then_eager_inference(tri: ModuleType) -> None:
    """A compiled training loop (traced code has no side effects to forget plans with) with a
    fused optimizer, then eager inference: the eager replay made before training must not
    launch the fold of the old BatchNorm parameters."""
    torch._dynamo.reset()
    tri.clear_config_cache()
    block = _Block(tri).eval()
    x = torch.randn(2, 4, 8, 6)
    with torch.no_grad():
        block(x)
        block(x)
    assert len(tri._plans), "the kernel never ran"
    compiled = torch.compile(block, backend="aot_eager")
    opt = torch.optim.AdamW(block.parameters(), lr=0.5, fused=True)
    for _ in range(2):
        compiled(torch.randn(2, 4, 8, 6)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        got, want = block(x), block.stock(x)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("trainable", ["bn_affine", "conv_bias"])
def test_compiled_fine_tuning_with_a_frozen_conv_weight_does_not_fail(
    tri: ModuleType, trainable: str
) -> None:
    """Compiled, a frozen conv weight with a trainable BatchNorm affine (or conv bias) folded
    grad-requiring tensors into the op, which has no autograd formula: the backward raised
    ("no autograd formula was registered"), taking the training run down. The traced path
    asks what the eager one asks (ks.training: the conv's bias and the BatchNorm's
    parameters too)."""
    torch._dynamo.reset()
    tri.clear_config_cache()
    block = _Block(tri).eval()
    if trainable == "conv_bias":
        block.conv.bias = torch.nn.Parameter(torch.randn(4))
        block.bn.requires_grad_(False)
    block.conv.weight.requires_grad_(False)
    compiled = torch.compile(block, backend="aot_eager")
    x = torch.randn(2, 4, 8, 6)
    out = compiled(x)
    out.square().mean().backward()
    want = block.stock(x)
    torch.testing.assert_close(out.detach(), want.detach())


def test_a_training_layer_does_not_replan_every_frozen_layer_each_step(tri: ModuleType) -> None:
    """Fine-tuning a head over a frozen backbone: the frozen layer's calls need no autograd
    and run the kernel; the head's training calls must not make it plan anew at every
    forward (performance only: counted plans, which are by layout: one in four steps)."""
    tri.clear_config_cache()
    frozen, head = _Block(tri).eval(), _Block(tri).eval()
    frozen.requires_grad_(False)
    planned: list[Any] = []
    real = tri.prepare_launch

    def counting(*args: Any) -> Any:
        planned.append(args[0])
        return real(*args)

    tri.prepare_launch = counting
    try:
        x = torch.randn(2, 4, 8, 6)
        for _ in range(4):
            head(frozen(x)).sum().backward()
    finally:
        tri.prepare_launch = real
    assert len(planned) == 1, f"the frozen layer planned {len(planned)} times in 4 steps"
