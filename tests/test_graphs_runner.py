"""The graph runner (templates/rocmfix_graphs.py) on a CPU.

With torch's own backend a CPU input is a pass-through: the model runs once per call and its
outputs come back as they are. The capture logic (when to capture, what a replay returns, the
caps, every fallback) is run through :class:`CpuGraphs`, a stand-in for ``torch.cuda``'s graphs
that keeps their contract: a capture runs the forward into fixed output tensors, a replay
writes the same tensors again from the captured inputs. The GPU side is bench/graphs_gpu.py's
(``--check`` and the timings).
"""

from __future__ import annotations

import subprocess
import sys
import warnings
import weakref
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch
from graphs_fake import CpuGraphs, leaves
from torch import nn

from conftest import ROOT, load_template


class Net(nn.Module):
    """Counts its forwards; returns a dict holding a tensor, a tuple and a constant, like
    PP-OCRv6 rec's ``{"ctc_logits": ..., "ctc_use_raw_logits": True}``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.calls = 0

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> dict[str, Any]:
        self.calls += 1
        y = self.conv(x) * scale
        return {"maps": y, "pair": (y.sum(1), [y.amax(1)]), "raw": True}


@pytest.fixture
def graphs() -> ModuleType:
    """The runner, capturing at a shape's 2nd sighting and never stopping for payback: what
    follows a capture is tested from there; the capture policy's own tests set theirs."""
    runner = load_template("rocmfix_graphs", interpret=None)
    runner.MIN_SEEN, runner.PAYBACK = 2, 0
    return runner


@pytest.fixture
def fake(graphs: ModuleType, monkeypatch: pytest.MonkeyPatch) -> CpuGraphs:
    backend = CpuGraphs()
    backend.inside = graphs._capturing
    monkeypatch.setattr(graphs, "_BACKEND", backend)
    return backend


Caught = list[warnings.WarningMessage]


@pytest.fixture
def told() -> Iterator[Caught]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("error")  # what python -W error sets: the runner must not raise
        yield caught


def said(caught: Caught) -> list[str]:
    return [str(w.message) for w in caught]


def _same(a: Any, b: Any) -> bool:
    return all(torch.equal(x, y) for x, y in zip(leaves(a), leaves(b), strict=True))


def test_cpu_inputs_pass_through(graphs: ModuleType, told: Caught) -> None:
    net = Net().eval()
    x = torch.randn(1, 3, 8, 8)
    with torch.inference_mode():
        for _ in range(4):
            out = graphs.forward(net, x)
            assert _same(out, net(x)) and out["raw"] is True
    assert net.calls == 8  # each call ran the model once: nothing captured, nothing skipped
    assert graphs.stats(net)["graphs"] == 0 and graphs.held_bytes(net) == 0
    assert not said(told)


def test_second_sighting_captures_and_later_calls_replay(
    graphs: ModuleType, fake: CpuGraphs
) -> None:
    net = Net().eval()
    xs = [torch.randn(2, 3, 8, 8) for _ in range(4)]
    with torch.inference_mode():
        outs = [graphs.forward(net, x, scale=0.5) for x in xs]
        for x, out in zip(xs, outs, strict=True):
            assert _same(out, net(x, scale=0.5))
    # Call 1 eager; call 2 captured (warm-up, capture) and replayed; 3 and 4 replayed.
    assert fake.captures == 1 and fake.replays == 3
    st = graphs.stats(net)
    assert (st["graphs"], st["held_bytes"]) == (1, fake.per_capture + xs[0].nbytes)
    assert st["counts"] == {"eager": 1, "captured": 1, "replayed": 3}
    # What a call returned is the caller's: later replays do not write into it.
    assert not _same(outs[2], outs[3])
    assert outs[3]["maps"].data_ptr() != outs[2]["maps"].data_ptr()
    assert isinstance(outs[3]["pair"], tuple) and isinstance(outs[3]["pair"][1], list)


def test_the_capture_policy_comes_from_the_environment() -> None:
    names = ("ROCMFIX_GRAPHS_AFTER", "ROCMFIX_GRAPHS_PAYBACK", "ROCMFIX_GRAPHS_MAX_MIB")
    runner = load_template("rocmfix_graphs", interpret=None, env=dict.fromkeys(names))
    assert (runner.MIN_SEEN, runner.PAYBACK, runner.MAX_BYTES) == (3, 4, 2 << 30)
    for mib, cap in (("1024", 1 << 30), ("1.5", 2 << 30), ("-3", 2 << 30)):
        runner = load_template("rocmfix_graphs", interpret=None, env={names[2]: mib})
        assert (mib, runner.MAX_BYTES) == (mib, cap)
    # Not a whole number >= 0: the default; no sighting before a capture is the first.
    for after, payback, want in (("5", "0", (5, 0)), ("-1", "2.5", (3, 4)),
                                 ("many", "", (3, 4)), ("0", " 7 ", (1, 7))):  # fmt: skip
        env: dict[str, str | None] = {
            "ROCMFIX_GRAPHS_AFTER": after,
            "ROCMFIX_GRAPHS_PAYBACK": payback,
        }
        runner = load_template("rocmfix_graphs", interpret=None, env=env)
        got = (runner.MIN_SEEN, runner.PAYBACK)
        assert got == want


def test_a_shape_is_captured_at_its_kth_sighting(
    graphs: ModuleType, fake: CpuGraphs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(graphs, "MIN_SEEN", 3)
    net = Net().eval()
    a, b = torch.randn(1, 3, 8, 8), torch.randn(1, 3, 8, 16)
    with torch.inference_mode():
        for x in (a, b, a, b):  # each seen twice: eager, nothing captured
            assert _same(graphs.forward(net, x), net(x))
        assert fake.captures == 0
        for x in (a, a, a):  # a's 3rd sighting captures, the 4th and 5th replay
            assert _same(graphs.forward(net, x), net(x))
    assert graphs.stats(net)["counts"] == {"eager": 4, "captured": 1, "replayed": 3}


def test_captures_that_do_not_pay_back_stop_until_the_graphs_do(
    graphs: ModuleType, fake: CpuGraphs, told: Caught, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(graphs, "PAYBACK", 4)
    net = Net().eval()
    shapes = [torch.randn(1, 3, 8, 8 * w) for w in range(1, 7)]
    with torch.inference_mode():
        # A low-repeat mix (bench/page_gpu.py's 2nd pass: each shape once more): the first
        # PAYBACK_AFTER shapes are captured and never replayed again; no capture after them.
        for x in shapes + shapes:
            assert _same(graphs.forward(net, x), net(x))
        assert fake.captures == graphs.PAYBACK_AFTER == 2
        assert graphs.stats(net)["counts"]["not paying"] == 4
        # A shape that repeats replays its graph; once the two graphs have paid back 4
        # replays each, a new shape is captured again.
        for _ in range(7):
            graphs.forward(net, shapes[0])
        graphs.forward(net, shapes[2])
        assert fake.captures == 2  # 7 replays: not yet
        graphs.forward(net, shapes[0])
        graphs.forward(net, shapes[2])
        assert fake.captures == 3
        assert _same(graphs.forward(net, shapes[2]), net(shapes[2]))
    assert not said(told)  # not paying back is a choice, not a failure: nothing to say
    # Off: every shape at its 2nd sighting is captured, whatever it paid.
    monkeypatch.setattr(graphs, "PAYBACK", 0)
    other = Net().eval()
    with torch.inference_mode():
        for x in shapes + shapes:
            graphs.forward(other, x)
    assert graphs.stats(other)["captures"] == 6


def test_each_signature_is_its_own_graph(graphs: ModuleType, fake: CpuGraphs) -> None:
    net = Net().eval()
    a, b = torch.randn(1, 3, 8, 8), torch.randn(1, 3, 8, 16)
    with torch.inference_mode():
        for _ in range(3):
            graphs.forward(net, a)
            graphs.forward(net, b)
            graphs.forward(net, a, scale=2.0)  # a constant is part of the signature
            graphs.forward(net, a.half().float())
        assert _same(graphs.forward(net, a, scale=2.0), net(a, scale=2.0))
    with torch.no_grad():  # not inference mode: another signature (inference tensors differ)
        graphs.forward(net, a)
    assert fake.captures == 3
    assert graphs.stats(net)["graphs"] == 3


def test_nested_inputs(graphs: ModuleType, fake: CpuGraphs) -> None:
    class Pair(nn.Module):
        def forward(self, xs: list[torch.Tensor], *, bias: torch.Tensor) -> torch.Tensor:
            return xs[0] @ xs[1] + bias

    net = Pair().eval()
    with torch.inference_mode():
        for _ in range(3):
            xs = [torch.randn(4, 4), torch.randn(4, 4)]
            bias = torch.randn(4)
            assert torch.equal(graphs.forward(net, xs, bias=bias), net(xs, bias=bias))
    assert fake.replays == 2


def test_a_stale_graph_goes_for_a_new_shape(
    graphs: ModuleType, fake: CpuGraphs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(graphs, "MAX_GRAPHS", 2)
    monkeypatch.setattr(graphs, "STALE_AFTER", 1)
    net = Net().eval()
    a, b, c = (torch.randn(1, 3, 8, w) for w in (8, 16, 24))
    with torch.inference_mode():
        for x in (a, a, b, b, b, b, b, c, c):  # a last replayed 7 calls before c's capture
            assert _same(graphs.forward(net, x), net(x))
        graphs.forward(net, a)  # dropped: counted from 1 again, so eager
    st = graphs.stats(net)
    assert st["graphs"] == 2 and st["counts"]["dropped"] == 1 and fake.captures == 3
    assert st["held_bytes"] == 3 * fake.per_capture + b.nbytes + c.nbytes  # a's given back


def test_shapes_in_turn_past_the_cap_are_not_captured_again_and_again(
    graphs: ModuleType, fake: CpuGraphs, told: Caught, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(graphs, "MAX_GRAPHS", 2)
    net = Net().eval()
    shapes = [torch.randn(1, 3, 8, w) for w in (8, 16, 24, 32)]
    with torch.inference_mode():
        for i in range(40):
            x = shapes[i % 4]
            assert _same(graphs.forward(net, x), net(x))
    # The first two shapes keep their graphs; the other two run eager.
    assert fake.captures == 2 and fake.replays == 2 * 9
    assert graphs.stats(net)["counts"]["past the cap"] == 2 * 9
    (message,) = said(told)
    assert "shape past the cap" in message and "graphs cap" in message


def test_fallbacks_run_eager_and_say_so_once(
    graphs: ModuleType, fake: CpuGraphs, told: Caught
) -> None:
    net = Net().eval()
    x = torch.randn(1, 3, 8, 8)
    for _ in range(3):
        assert _same(graphs.forward(net, x), net(x))  # grad mode
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(3):
            assert _same(graphs.forward(net, x), net(x))
    net.train()
    with torch.inference_mode():
        for _ in range(3):
            assert _same(graphs.forward(net, x), net(x))
    assert fake.captures == 0
    reasons = ("grad mode", "autocast", "training")
    assert [next(r for r in reasons if f"({r}:" in m) for m in said(told)] == list(reasons), said(
        told
    )
    assert all("ROCMFIX_GRAPHS=0" in m for m in said(told))


def test_a_capture_that_raises_leaves_the_model_eager(
    graphs: ModuleType, fake: CpuGraphs, told: Caught
) -> None:
    fake.fail_capture = RuntimeError("operation not permitted when stream is capturing")
    net = Net().eval()
    x = torch.randn(1, 3, 8, 8)
    with torch.inference_mode():
        for _ in range(4):
            assert _same(graphs.forward(net, x), net(x))
        fake.fail_capture = None  # no more captures for that model, whatever the shape
        y = torch.randn(1, 3, 4, 4)
        for _ in range(3):
            assert _same(graphs.forward(net, y), net(y))
    st = graphs.stats(net)
    assert st["broken"].startswith("RuntimeError") and fake.captures == 0
    (message,) = said(told)
    assert "capture failed" in message and "not permitted" in message


def test_a_replay_that_fails_drops_its_graph(
    graphs: ModuleType, fake: CpuGraphs, told: Caught
) -> None:
    net = Net().eval()
    x = torch.randn(1, 3, 8, 8)
    with torch.inference_mode():
        graphs.forward(net, x)
        graphs.forward(net, x)
        fake.fail_replay = RuntimeError("replay failed on purpose")
        for _ in range(3):
            assert _same(graphs.forward(net, x), net(x))
    st = graphs.stats(net)
    assert st["graphs"] == 0 and st["counts"]["replay failed"] == 1
    assert len(said(told)) == 1 and "replay failed on purpose" in said(told)[0]


def test_a_shape_past_the_caps_runs_eager(
    graphs: ModuleType,
    fake: CpuGraphs,
    told: Caught,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(graphs, "MAX_CAPTURES", 2)
    net = Net().eval()
    with torch.inference_mode():
        for w in (8, 16, 24):
            x = torch.randn(1, 3, 8, w)
            for _ in range(3):
                assert _same(graphs.forward(net, x), net(x))
    assert fake.captures == 2 and graphs.stats(net)["counts"]["past the cap"] == 2
    assert len(said(told)) == 1 and "shape past the cap" in said(told)[0]
    # The memory cap: a capture that takes the pool past it is dropped, and no more follow;
    # a model left with no graph holds nothing (its pool goes too).
    fake.per_capture = 8 << 20
    monkeypatch.setattr(graphs, "MAX_BYTES", fake.per_capture // 2)

    class Other(Net):  # a class of its own: the warning is once per class and reason
        pass

    other = Other().eval()
    with torch.inference_mode():
        for w in (8, 8, 8, 16, 16, 16):
            graphs.forward(other, torch.randn(1, 3, 8, w))
    st = graphs.stats(other)
    assert st["graphs"] == 0 and st["held_bytes"] == 0 and st["counts"]["past the cap"] >= 2
    assert fake.captures == 3
    # The warning gives what the capture took, not what is left once its pool went.
    assert "shape past the cap: graph memory 8 MiB" in said(told)[-1]


class Detections:
    """An output the runner cannot take apart."""


def test_outputs_that_are_not_tensors(graphs: ModuleType, fake: CpuGraphs, told: Caught) -> None:
    class Boxes(nn.Module):
        def forward(self, x: torch.Tensor) -> Any:
            return Detections(), x * 2

    net = Boxes().eval()
    x = torch.randn(3)
    with torch.inference_mode():
        for _ in range(3):
            assert torch.equal(graphs.forward(net, x)[1], x * 2)
    assert graphs.stats(net)["graphs"] == 0 and fake.captures == 1
    assert len(said(told)) == 1 and "outputs" in said(told)[0] and "Detections" in said(told)[0]


def test_moved_weights_are_never_replayed(graphs: ModuleType, fake: CpuGraphs) -> None:
    net = Net().eval()
    x = torch.randn(1, 3, 8, 8)
    with torch.inference_mode():
        graphs.forward(net, x)
        graphs.forward(net, x)
    net.conv.weight.data = net.conv.weight.data.clone() * 3  # a new storage: .to(), .half()
    with torch.inference_mode():
        assert _same(graphs.forward(net, x), net(x))
    assert graphs.stats(net)["counts"]["moved"] == 1


def test_compiling_callers_are_left_alone(
    graphs: ModuleType,
    fake: CpuGraphs,
    monkeypatch: pytest.MonkeyPatch,
    told: Caught,
) -> None:
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    net = Net().eval()
    with torch.inference_mode():
        for _ in range(3):
            graphs.forward(net, torch.randn(1, 3, 8, 8))
    assert fake.captures == 0 and net.calls == 3 and not said(told)


def test_the_switch_turns_it_off(fake: CpuGraphs) -> None:
    off = load_template("rocmfix_graphs", interpret=None, env={"ROCMFIX_GRAPHS": "0"})
    off._BACKEND = fake
    net = Net().eval()
    with torch.inference_mode():
        for _ in range(3):
            off.forward(net, torch.randn(1, 3, 8, 8))
    assert not off.ENABLED and fake.captures == 0 and net.calls == 3


def test_a_warning_never_raises_under_w_error() -> None:
    code = (
        "import sys, torch; sys.path.insert(0, sys.argv[1]); import rocmfix_graphs as g\n"
        "net = torch.nn.Linear(2, 2); g._BACKEND.on_device = lambda t: True\n"
        "print(g.forward(net, torch.ones(2)).shape)\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code, str(ROOT / "templates")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "torch.Size([2])"
    assert "RuntimeWarning: rocmfix graphs: Linear runs eager (grad mode" in done.stderr


class Outer(nn.Module):
    """A model whose forward calls another through the runner, as PP-DocLayoutV2's encoder
    calls its backbone inside the whole detector."""

    def __init__(self, graphs: ModuleType, syncs: bool = False) -> None:
        super().__init__()
        self.inner = Net()
        self.graphs = graphs
        self.syncs = syncs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.graphs.forward(self.inner, x)["maps"]
        if self.syncs and getattr(self.graphs._capturing, "on", False):
            # what a host sync does under a capture (on the GPU, only there)
            raise RuntimeError("operation not permitted when stream is capturing")
        return out * 2

    def eager(self, x: torch.Tensor) -> torch.Tensor:
        """The same forward, not through the runner (which would count the inner call)."""
        return self.inner.forward(x)["maps"] * 2


@pytest.mark.parametrize("copies", [1, 2])
def test_a_model_called_inside_a_capture_runs_as_it_is(
    graphs: ModuleType, fake: CpuGraphs, told: Caught, copies: int
) -> None:
    # Two copies: MinerU's layout call and transformers' backbone call each import the runner
    # dropped beside them; the flag is one per process.
    inner_runner = graphs if copies == 1 else load_template("rocmfix_graphs", interpret=None)
    assert inner_runner._capturing is graphs._capturing
    outer = Outer(inner_runner).eval()
    xs = [torch.randn(1, 3, 8, 8) for _ in range(5)]
    with torch.inference_mode():
        assert all(torch.equal(graphs.forward(outer, x), outer.eager(x)) for x in xs)
    # The outer graph holds the inner forward: one capture, no graph of the inner model's own.
    assert fake.captures == 1 and graphs.stats(outer)["counts"]["replayed"] == 4
    assert inner_runner.stats(outer.inner)["graphs"] == 0
    assert not said(told)


def test_where_the_outer_capture_fails_the_inner_model_is_replayed(
    graphs: ModuleType, fake: CpuGraphs, told: Caught
) -> None:
    outer = Outer(graphs, syncs=True).eval()
    x = torch.randn(1, 3, 8, 8)
    with torch.inference_mode():
        # Call 2: the outer capture fails; its eager run is the inner model's 2nd sighting.
        assert all(torch.equal(graphs.forward(outer, x), outer.eager(x)) for _ in range(5))
    assert str(graphs.stats(outer)["broken"]).startswith("RuntimeError: operation not")
    inner = graphs.stats(outer.inner)
    assert (inner["graphs"], inner["counts"]) == (1, {"eager": 1, "captured": 1, "replayed": 4})
    assert [m for m in said(told) if "Outer runs eager (capture failed" in m]


def test_constant_is_the_stock_tensor_made_once(
    graphs: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    order = graphs.constant([3, 1, 2], dtype=torch.int32, device="cpu")
    assert torch.equal(order, torch.tensor([3, 1, 2], dtype=torch.int32))
    assert order.dtype == torch.int32
    assert graphs.constant([3, 1, 2], dtype=torch.int32, device=torch.device("cpu")) is order
    assert graphs.constant([3, 1, 2], dtype=torch.int64, device="cpu") is not order
    # 1, 1.0 and True are equal as keys; each keeps the dtype torch.tensor gives it.
    dtypes = [graphs.constant(v).dtype for v in (1, 1.0, True)]
    assert dtypes == [torch.int64, torch.float32, torch.bool]
    assert graphs.constant([[0.5, 0.25]]).shape == (1, 2)
    # Past its bound, and with the runner off, each call makes the stock tensor afresh.
    monkeypatch.setattr(graphs, "_MAX_CONSTANTS", len(graphs._constants))
    assert graphs.constant(7) is not graphs.constant(7)
    monkeypatch.setattr(graphs, "_MAX_CONSTANTS", 1 << 20)
    monkeypatch.setattr(graphs, "_is_compiling", lambda: True)
    assert graphs.constant([3, 1, 2], dtype=torch.int32, device="cpu") is not order
    monkeypatch.setattr(graphs, "_is_compiling", lambda: False)
    monkeypatch.setattr(graphs, "ENABLED", False)
    assert graphs.constant([3, 1, 2], dtype=torch.int32, device="cpu") is not order


def test_a_short_batch_replays_the_full_batch_graph(graphs: ModuleType, fake: CpuGraphs) -> None:
    net = Net().eval()
    with torch.inference_mode():
        for rows in (6, 6, 4, 4, 5, 3):  # MinerU's rec: batches of 6, a short one at the end
            x = torch.randn(rows, 3, 8, 8)
            out = graphs.forward(net, x)
            want = net(x)
            assert out["maps"].shape[0] == rows and out["pair"][1][0].shape[0] == rows
            assert out["raw"] is True
            # Rows are independent: the padded replay's rows are eager's own.
            assert _same(out, want)
    assert fake.captures == 1 and fake.replays == 5  # one graph, at 6 rows, for all of them
    assert graphs.stats(net)["counts"]["padded"] == 4


def test_padding_is_bounded_and_can_be_turned_off(
    graphs: ModuleType, fake: CpuGraphs, monkeypatch: pytest.MonkeyPatch
) -> None:
    net = Net().eval()
    with torch.inference_mode():
        for rows in (6, 6, 2, 2):  # 2 rows padded to 6 would triple the work: a graph of its own
            graphs.forward(net, torch.randn(rows, 3, 8, 8))
    assert fake.captures == 2 and "padded" not in graphs.stats(net)["counts"]
    monkeypatch.setattr(graphs, "PAD_BATCH", False)
    other = Net().eval()
    with torch.inference_mode():
        for rows in (6, 6, 4, 4):
            graphs.forward(other, torch.randn(rows, 3, 8, 8))
    assert fake.captures == 4 and "padded" not in graphs.stats(other)["counts"]


def test_outputs_without_the_batch_first_turn_padding_off(
    graphs: ModuleType, fake: CpuGraphs
) -> None:
    class Pooled(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.sum(0)  # mixes the rows: padding would not be exact, and is not done

    net = Pooled().eval()
    with torch.inference_mode():
        for rows in (6, 6, 4, 4, 4):
            x = torch.randn(rows, 3, 8)
            assert torch.equal(graphs.forward(net, x), x.sum(0))
    counts = graphs.stats(net)["counts"]
    assert counts["not padded"] == 1 and counts["padded"] == 1  # then 4 rows are their own


def test_no_padding_once_captures_have_failed(
    graphs: ModuleType, fake: CpuGraphs, told: Caught
) -> None:
    fake.fail_capture = RuntimeError("operation not permitted when stream is capturing")
    net = Net().eval()
    with torch.inference_mode():
        for rows in (6, 6, 4, 4):  # the capture at the 2nd call raises: eager for good
            x = torch.randn(rows, 3, 8, 8)
            assert _same(graphs.forward(net, x), net(x))
    assert "padded" not in graphs.stats(net)["counts"]  # no copy made for a graph never run
    assert len(said(told)) == 1 and "capture failed" in said(told)[0]


def test_a_pad_that_fails_runs_the_call_as_it_came(
    graphs: ModuleType, fake: CpuGraphs, told: Caught, monkeypatch: pytest.MonkeyPatch
) -> None:
    net = Net().eval()
    with torch.inference_mode():
        for _ in range(2):
            graphs.forward(net, torch.randn(6, 3, 8, 8))

        def no_memory(*args: Any, **kwargs: Any) -> torch.Tensor:
            raise RuntimeError("CUDA out of memory")

        x = torch.randn(4, 3, 8, 8)
        with monkeypatch.context() as patched:
            patched.setattr(torch.nn.functional, "pad", no_memory)
            out = graphs.forward(net, x)  # eager, unpadded: nothing raised in the forward
        assert _same(out, net(x))
    assert "padded" not in graphs.stats(net)["counts"] and not said(told)


class Lines(nn.Module):
    """A text-line recogniser's shapes: (N, 3, 4, W) in, (N, T, 5) out, T the width taken down
    by a stride of 4 as convs and pools do it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 5, (4, 3), stride=(4, 2), padding=(0, 1))
        self.pool = nn.AvgPool2d((1, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.conv(x)).squeeze(2).transpose(1, 2)


class RecLines(Lines):
    """PP-OCRv6 rec's output: a dict of the CTC logits and a constant."""

    def forward(self, x: torch.Tensor) -> dict[str, Any]:  # type: ignore[override]
        return {"ctc_logits": super().forward(x), "ctc_use_raw_logits": True}


@pytest.mark.parametrize("kind", [Lines, RecLines])
def test_widths_in_one_bucket_run_as_if_padded_to_it_and_replay_one_graph(
    graphs: ModuleType, fake: CpuGraphs, told: Caught, kind: type[nn.Module]
) -> None:
    net = kind().eval()
    with torch.inference_mode():
        for width in (33, 35, 37, 39, 36, 40, 34, 38, 41, 48):  # all in the bucket of 48
            x = torch.randn(6, 3, 4, width)
            out = graphs.forward(net, x, rocmfix_width_bucket=16)
            # What the model gives the batch padded with zeros to 48, eager or replayed.
            want = net(torch.nn.functional.pad(x, (0, 48 - width)))
            assert _same(out, want) and type(out) is type(want), width
    counts = graphs.stats(net)["counts"]
    # (The fixture captures at a shape's 2nd sighting: 33 eager, 35 captured.)
    assert fake.captures == 1
    assert counts == {"bucketed": 9, "eager": 1, "captured": 1, "replayed": 9}
    assert not said(told)


def test_the_stock_call_sees_the_stock_width(
    graphs: ModuleType, fake: CpuGraphs, told: Caught
) -> None:
    net = Lines().eval()
    x = torch.randn(6, 3, 4, 33)
    # Grad mode: the stock call, as it came (and one warning that says why).
    assert _same(graphs.forward(net, x, rocmfix_width_bucket=16), net(x))
    assert graphs.stats(net)["counts"] == {"grad mode": 1} and len(said(told)) == 1


def test_no_bucket_without_the_argument_or_for_other_inputs(
    graphs: ModuleType, fake: CpuGraphs, told: Caught
) -> None:
    net = Lines().eval()
    with torch.inference_mode():
        for width in (33, 35, 37, 33, 35, 37):
            graphs.forward(net, torch.randn(6, 3, 4, width))  # no bucket: a graph per width
        assert fake.captures == 3 and "bucketed" not in graphs.stats(net)["counts"]
        other = Net().eval()
        for _ in range(3):  # a 4-D input, but through a nested call: two tensors, not bucketed
            out = graphs.forward(other, torch.randn(2, 3, 8, 9), scale=torch.ones(()),
                                 rocmfix_width_bucket=16)  # fmt: skip
            assert out["maps"].shape[-1] == 9
        # One argument that holds the tensor (a list): not a batch of images, not widened, and
        # nothing raised in the forward.
        listed = Listed().eval()
        for _ in range(3):
            x = torch.randn(2, 3, 4, 33)
            assert torch.equal(graphs.forward(listed, [x], rocmfix_width_bucket=16), x * 2)
        assert "bucketed" not in graphs.stats(listed)["counts"] and not said(told)


class Listed(nn.Module):
    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return xs[0] * 2


class Maps(nn.Module):
    """A text detector's shapes: (N, 3, H, W) in, DB's ``{"maps": (N, 1, H, W)}`` out, its
    values depending on the neighbourhood (the pad of the grown batch is seen at the edge)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 1, 3, padding=1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"maps": torch.sigmoid(self.conv(x))}


def test_sizes_in_one_bucket_run_on_the_edge_grown_batch_and_are_cut_back(
    graphs: ModuleType, fake: CpuGraphs, told: Caught
) -> None:
    net = Maps().eval()
    with torch.inference_mode():
        for height, width in ((17, 30), (20, 31), (32, 17), (25, 25), (32, 32)):
            x = torch.randn(2, 3, height, width)
            out = graphs.forward(net, x, rocmfix_size_bucket=16)
            # The model on the batch grown to 32x32 by repeating its edge, cut back to x's size.
            grown = torch.nn.functional.pad(x, (0, 32 - width, 0, 32 - height), mode="replicate")
            want = net(grown)["maps"][..., :height, :width]
            assert out["maps"].shape == (2, 1, height, width) and _same(out["maps"], want)
            assert not _same(out["maps"], net(x)["maps"]) or height == width == 32
    counts = graphs.stats(net)["counts"]
    assert fake.captures == 1
    assert counts == {"bucketed": 4, "eager": 1, "captured": 1, "replayed": 4}
    assert not said(told)


def test_an_output_not_the_input_size_ends_the_size_bucket_with_the_stock_values(
    graphs: ModuleType, fake: CpuGraphs, told: Caught
) -> None:
    net = Lines().eval()  # (N, T, 5) out: nothing to cut back
    with torch.inference_mode():
        for width in (33, 35, 37):
            x = torch.randn(6, 3, 4, width)
            assert _same(graphs.forward(net, x, rocmfix_size_bucket=16), net(x)), width
    counts = graphs.stats(net)["counts"]
    # The first call ran grown, then as it came; the rest as they came, a graph per shape.
    assert counts["bucketed"] == 1 and counts["not bucketed"] == 1
    (warning,) = said(told)
    assert "(bucket: _Unsupported: an output is not its input's size)" in warning


@pytest.mark.parametrize("bucket", ["rocmfix_width_bucket", "rocmfix_size_bucket"])
def test_a_grown_batch_that_fails_runs_the_stock_call_and_ends_the_bucket(
    graphs: ModuleType, fake: CpuGraphs, told: Caught, bucket: str
) -> None:
    """Out of memory on the grown batch, say: the call as it came, one warning, and the
    model's next calls at their own size (nothing raised in the forward)."""
    inner = Maps().eval()

    def model(x: torch.Tensor) -> dict[str, torch.Tensor]:
        if x.shape[-1] % 16 == 0:
            raise RuntimeError("CUDA out of memory")
        return inner(x)

    with torch.inference_mode():
        for width in (17, 18, 19):
            x = torch.randn(2, 3, 20, width)
            assert _same(graphs.forward(model, x, **{bucket: 16}), inner(x)), width
    counts = graphs.stats(model)["counts"]
    assert counts["bucketed"] == 1 and counts["not bucketed"] == 1
    (warning,) = said(told)
    assert "(bucket: RuntimeError: CUDA out of memory)" in warning


def test_a_grown_batch_that_fails_is_let_go_before_the_stock_call(
    graphs: ModuleType, fake: CpuGraphs, told: Caught
) -> None:
    """Out of memory on the grown batch: the stock call must not run with the grown copy
    still held (on a GPU near its limit, that memory is what the stock call lacks)."""
    grown: list[weakref.ref[torch.Tensor]] = []
    held: list[bool] = []

    def model(x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] % 16 == 0:
            grown.append(weakref.ref(x))
            raise RuntimeError("CUDA out of memory")
        held.extend(ref() is not None for ref in grown)
        return x * 2

    with torch.inference_mode():
        x = torch.randn(2, 3, 20, 17)
        assert torch.equal(graphs.forward(model, x, rocmfix_size_bucket=16), x * 2)
    assert len(grown) == 1 and held == [False]


def test_a_warning_names_the_callers_line(
    graphs: ModuleType, fake: CpuGraphs, told: Caught
) -> None:
    """Whichever of the runner's functions found the reason, the warning points at the line
    that called the runner (MinerU's), not at one of the runner's own."""
    net = Lines().eval()
    fake.fail_capture = RuntimeError("no capture here")
    with torch.inference_mode():
        for _ in range(2):  # eager, then a capture that raises (found two frames down)
            graphs.forward(net, torch.randn(6, 3, 4, 33))
    x = torch.randn(6, 3, 4, 33)
    graphs.forward(net, x)  # grad mode (found in forward itself)
    assert len(told) == 2 and {w.filename for w in told} == {__file__}, [w.filename for w in told]
