"""The protocol between rocmfix and its worker (rocmfix/guest/protocol.py): every message
survives JSON both ways, what is not the protocol is refused in one line, and a worker of
another rocmfix is refused by its version, not half understood."""

from __future__ import annotations

import base64
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rocmfix import guest, worker
from rocmfix.errors import EXIT_FAILED
from rocmfix.guest import protocol
from rocmfix.ops import OPS

DEVICE = protocol.DeviceFacts(
    kind="gpu",
    backend="hip",
    name="Radeon PRO W7900",
    arch="gfx1100",
    count=2,
    torch="2.9.0+rocm7.1",
    hip="7.1.0",
    cuda=None,
    triton="3.5.0",
    triton_error=None,
    conv_library="MIOpen 3.5.0",
    memory_gib=44.98,
    cc_major=11,
)
ROW = protocol.CandidateRow(
    config={"BLOCK_M": 64, "num_warps": 4},
    role="shipped",
    status="ok",
    ms=0.05,
    kernel_ms=0.03,
    rel_err=1e-4,
    message=None,
    compiled={"arch": "gfx1100", "registers": 96, "spills": 0},
)
# One of each event, every field away from its default.
EVENTS: list[protocol.Event] = [
    protocol.Hello(
        pid=4242,
        python="/opt/conda/bin/python",
        device=DEVICE,
        overrides={"ROCMFIX_DILATED_CONV_CONFIG": '{"BLOCK_M": 64}'},
    ),
    protocol.Start(id="patch-embed/gemm"),
    protocol.First(id="patch-embed/gemm", ms=812.5),
    protocol.Measured(
        id="patch-embed/gemm",
        status="timeout",
        config={"BLOCK_M": 128},
        first_ms=812.5,
        ms=0.05,
        kernel_ms=0.04,
        rel_err=2e-3,
        tolerance=1e-2,
        message="the worker died",
        traceback="Traceback ...",
        limit_s=10.0,
    ),
    protocol.Graphs(
        status="failed",
        message="RuntimeError: capture refused",
        shapes=["1x3x960x672 fp32"],
        held_bytes=[75 << 20],
        caps={"MIN_SEEN": 3},
    ),
    protocol.KernelWarning(code="kernel", message="rocmfix: the tuned file is corrupt"),
    protocol.Fatal(message="cannot import torch", traceback="Traceback ..."),
    protocol.End(),
    protocol.Plan(id="patch-embed", total=12),
    protocol.Tried(id="patch-embed", index=3, total=12, status="rejected", ms=None),
    protocol.Tuned(
        id="patch-embed",
        status="ok",
        message="m",
        traceback="t",
        kernel="patch_embed_gemm",
        arch="gfx1100",
        key="k1536_f16",
        precision="f16",
        shape={"m": 4096, "dtype": "bfloat16"},
        tolerance=1e-2,
        method="user",
        candidates=[ROW, dataclasses.replace(ROW, role="grid", status="failed")],
    ),
    protocol.Resolved(id="patch-embed", arch="gfx1100", key="k", config={"A": 1}, error="e"),
    protocol.Checked(
        op="patch-embed",
        scheme="gemm",
        shape="patch-embed",
        dtype="float16",
        arch="gfx942",
        template="patch_embed_triton.py",
        ok=False,
        problems=["spills registers"],
        config={"BLOCK_M": 256},
        id="patch-embed/gemm",
        kernel="_gemm_kernel",
        operands="f16",
        options={"num_warps": 8},
        constexprs={"BLOCK_M": 256},
        error="e",
        traceback="t",
        registers=256,
        spills=12,
        sgpr_spills=3,
        scratch=64,
        shared=65536,
        shared_limit=65536,
        waves=1,
        matrix=8,
        matrix_wanted="v_mfma",
    ),
]


def _wire(message: protocol.Message) -> Any:
    """What crosses the pipe: the JSON text, decoded again."""
    return json.loads(json.dumps(message.to_json()))


def test_every_event_kind_is_covered_here() -> None:
    assert {type(e) for e in EVENTS} == set(protocol.EVENTS.values())


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.EVENT)
def test_every_event_round_trips(event: protocol.Event) -> None:
    assert protocol.parse_event(_wire(event)) == event
    # The defaults round-trip too (a field left at its default is still sent).
    fields = dataclasses.fields(event)
    required = {f.name: getattr(event, f.name) for f in fields if _required(f)}
    bare = type(event)(**required)
    assert protocol.parse_event(_wire(bare)) == bare


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


@pytest.mark.parametrize("mode", protocol.MODES)
def test_every_request_round_trips_with_every_op(mode: str) -> None:
    items = [protocol.MeasureItem(op=op.name, case=c.id, impl="native") for op in OPS
             for c in op.cases]  # fmt: skip
    compiles = [
        protocol.CompileItem(
            op="patch-embed", scheme="gemm", shape="patch-embed", gpu={"m": 1}, dtype="float16",
            arch="gfx1100", config={"BLOCK_M": 64}, id="patch-embed/gemm",
        )
    ]  # fmt: skip
    # The profile's replay: a recorded call as its case, and the run's backend flags.
    calls = {"op0": protocol.Call(name="aten::conv2d", shapes=[[1, 8, 9, 9], [8, 1, 3, 3], []],
                                  dtypes=["float32"] * 2, strides=[[648, 81, 9, 1]],
                                  op="depthwise-conv", stride=[1, 1], padding=[1, 1],
                                  dilation=[1, 1], groups=8, padding_mode="same",
                                  pad_far=[0, 0])}  # fmt: skip
    request = worker.request(
        mode, OPS, skip=["x/native"], items=items, compiles=compiles,
        budget_s=0.5, interpret=True, require_gpu=True, archs=["gfx942"], calls=calls,
        backend={"num_threads": 2, "cudnn.enabled": False},
    )  # fmt: skip
    back = protocol.Request.parse(_wire(request))
    assert back == request
    assert set(back.ops) == {op.name for op in OPS}
    assert back.items[0].id == protocol.item_id(items[0].case, "native")
    # What the guest reads of an op is what the registry says.
    for op in OPS:
        spec = back.ops[op.name]
        assert spec.schemes == {s.name: s.entry for s in op.schemes}
        assert spec.replay == op.replay
        assert list(spec.cases) == [c.id for c in op.cases]
        assert spec.cases[op.cases[0].id].on("cpu") == dict(op.cases[0].cpu)


def test_the_item_id_is_built_in_one_place() -> None:
    item = protocol.MeasureItem(op="dilated-conv", case="dilated-conv-16-3-5", impl="linear")
    assert item.id == protocol.item_id("dilated-conv-16-3-5", "linear")
    assert item.to_json()["id"] == "dilated-conv-16-3-5/linear"


def _hello() -> dict[str, Any]:
    return _wire(EVENTS[0])  # type: ignore[no-any-return]


MALFORMED = [
    # (what is wrong, the event, the one line it is refused with)
    ("not an object", [1, 2], "event: expected a JSON object, got a list"),
    ("no kind", {"id": "x"}, "unknown event 'None'"),
    ("unknown kind", {"event": "reboot"}, "unknown event 'reboot'"),
    ("missing key", {"event": "item", "id": "a/b"}, "item.status is missing"),
    ("wrong type", {"event": "item", "id": "a/b", "status": "ok", "ms": "0.1"},
     "item.ms must be a number, got a string"),
    ("a bool for a number", {"event": "first", "id": "a", "ms": True},
     "first.ms must be a number, got a boolean"),
    ("null where required", {"event": "start", "id": None}, "start.id must be a string, got null"),
    ("extra nesting", {"event": "plan", "id": "p", "total": [12]},
     "plan.total must be an integer, got a list"),
    ("extra nesting in a list", {"event": "tuned", "id": "t", "status": "ok",
                                 "candidates": [[{"config": {}}]]},
     "tuned.candidates[0] must be an object, got a list"),
    ("a nested key", {**_hello(), "device": {**_hello()["device"], "count": "2"}},
     "hello.device.count must be an integer, got a string"),
    ("a map's value", {**_hello(), "overrides": {"A": 1}},
     "hello.overrides['A'] must be a string, got a number"),
    ("a status outside the set", {"event": "item", "id": "a/b", "status": "done"},
     "item.status must be one of ok, failed, error, unavailable, rejected, skipped, timeout, "
     "crashed, missing, got 'done'"),
    ("a candidate's status", {"event": "tuned", "id": "t", "status": "ok",
                              "candidates": [{"config": {}, "role": "grid", "status": 1}]},
     "tuned.candidates[0].status must be one of ok, failed, error, unavailable, rejected, "
     "skipped, timeout, crashed, missing, got a number"),
]  # fmt: skip


@pytest.mark.parametrize(("why", "data", "line"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_events_are_refused_in_one_line(why: str, data: Any, line: str) -> None:
    with pytest.raises(protocol.ProtocolError) as caught:
        protocol.parse_event(data)
    assert str(caught.value) == line


def test_unknown_keys_are_ignored() -> None:
    later = {"event": "start", "id": "a", "later": {"x": 1}}
    assert protocol.parse_event(later) == protocol.Start(id="a")


def test_a_worker_of_another_version_is_refused_both_ways() -> None:
    old_hello = {**_hello(), "version": 2}
    with pytest.raises(protocol.ProtocolError, match="the worker speaks protocol 2; this rocmfix"):
        protocol.parse_event(old_hello)
    no_version = {k: v for k, v in _hello().items() if k != "version"}
    with pytest.raises(protocol.ProtocolError, match="speaks protocol \\?"):
        protocol.parse_event(no_version)
    request = {**_wire(worker.request("measure", OPS)), "version": protocol.VERSION + 1}
    newer = f"rocmfix sent protocol {protocol.VERSION + 1}; this worker"
    with pytest.raises(protocol.ProtocolError, match=newer):
        protocol.Request.parse(request)


def test_the_guest_answers_a_request_of_another_version_with_a_fatal_line() -> None:
    """The real worker, in this interpreter: one fatal event, no traceback, nothing run."""
    body = {**_wire(worker.request("measure", OPS)), "version": protocol.VERSION + 1}
    encoded = base64.b64encode(json.dumps(body).encode()).decode()
    done = subprocess.run(
        guest.command(sys.executable, "worker", encoded),
        capture_output=True,
        text=True,
        cwd="/",
        timeout=120,
        check=False,
    )
    assert done.returncode == 0
    events = [protocol.parse_event(json.loads(line)) for line in done.stdout.splitlines()]
    assert len(events) == 1 and isinstance(events[0], protocol.Fatal)
    assert events[0].message.startswith("a request out of protocol: ProtocolError: rocmfix sent")
    assert "Traceback" not in done.stderr


def _fake_worker(tmp_path: Path, lines: list[str]) -> str:
    """An "interpreter" that answers every worker request with ``lines``."""
    answer = tmp_path / "answer.jsonl"
    answer.write_text("".join(line + "\n" for line in lines))
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\nexec cat {answer}\n")
    script.chmod(0o755)
    return str(script)


def test_the_host_refuses_a_malformed_answer_in_one_line(tmp_path: Path) -> None:
    """A worker that says hello wrongly: rocmfix stops with one line (exit 1), never a
    traceback (exit 3), and uses nothing it said."""
    hello = {**_hello(), "pid": "one"}
    python = _fake_worker(tmp_path, [json.dumps(hello), '{"event": "end"}'])
    with pytest.raises(worker.ProtocolRefusal) as caught:
        worker.run(python, worker.request("measure", OPS), limit_for=lambda _item: 30.0)
    error = caught.value
    assert error.exit_code == EXIT_FAILED
    assert error.message == (
        f"the worker in {python} sent a malformed answer: "
        "hello.pid must be an integer, got a string"
    )
    assert "\n" not in error.message


def test_stray_lines_that_are_not_events_are_not_the_protocol(tmp_path: Path) -> None:
    """A line that is not JSON (a library printing to the pipe) is skipped by the transport;
    a JSON object that is not an event is refused."""
    good = [json.dumps(_hello()), "not json at all", '{"event": "end"}']
    answer = worker.run(
        _fake_worker(tmp_path, good), worker.request("measure", OPS), limit_for=lambda _i: 30.0
    )
    assert answer.hello == EVENTS[0] and isinstance(answer.events[-1], protocol.End)
    bad = [json.dumps(_hello()), '{"event": "item", "id": "a/b", "status": 3}']
    with pytest.raises(worker.ProtocolRefusal, match=r"item\.status must be one of"):
        worker.run(
            _fake_worker(tmp_path, bad), worker.request("measure", OPS), limit_for=lambda _i: 30.0
        )


def test_the_protocol_is_python_3_8() -> None:
    """The guest imports it in the user's interpreter: no syntax newer than 3.8 (its
    annotations are never evaluated, so builtin generics and ``X | None`` in them are fine)."""
    import ast

    ast.parse(Path(protocol.__file__).read_text(encoding="utf-8"), feature_version=(3, 8))


def test_the_profiles_replay_parses_its_worker_once_and_a_malformed_answer_is_its_note(
    tmp_path: Path,
) -> None:
    """The replay is the same worker and protocol as doctor (issue 40): its answer is parsed
    as it arrives, a form's `Measured` becomes a typed Form, and an answer out of protocol
    ends the replay with one line that the report keeps as a note, nothing it said used."""
    from rocmfix.profile import replay

    call = protocol.Call(name="aten::conv2d", shapes=[[1, 2, 5, 5], [2, 2, 3, 3], []],
                         dtypes=["float32"] * 2, stride=[1, 1], padding=[0, 0],
                         dilation=[1, 1])  # fmt: skip
    ok = [json.dumps(_hello()),
          json.dumps({"event": "item", "id": "op0/native", "status": "ok", "ms": 2.0}),
          json.dumps({"event": "item", "id": "op0/channels-last", "status": "unavailable"}),
          json.dumps({"event": "item", "id": "op0/contiguous", "status": "timeout",
                      "limit_s": 30.0}),
          '{"event": "end"}']  # fmt: skip
    done = replay.run(_fake_worker(tmp_path, ok), {"k": call}, "cpu", {}, limit_s=30.0)
    assert done.fatal is None and done.calibration is None
    assert [(f.label, f.ms, f.ok) for f in done.forms["k"]] == [
        ("as run", 2.0, True), ("contiguous", None, False)
    ]  # fmt: skip
    assert done.forms["k"][1].error == "killed at its time limit (30 s)"
    bad = [json.dumps(_hello()), '{"event": "item", "id": "op0/native", "status": "ok", "ms": []}']
    done = replay.run(_fake_worker(tmp_path, bad), {"k": call}, "cpu", {}, limit_s=30.0)
    assert done.fatal is not None and "item.ms must be a number, got a list" in done.fatal
    assert done.forms == {} and "\n" not in done.fatal
