"""What ``rocmfix doctor`` says of graph replay: the runner's caps in force in the target
interpreter (its environment sets two of them), and on a GPU the memory each graph of a small
conv net held. Without a GPU, the real CLI and worker say so; the GPU path runs here through
the CPU stand-in of ``torch.cuda``'s graphs (tests/graphs_fake.py), and on a GPU in
bench/graphs_session.sh's device batch."""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import pytest
import torch
from graphs_fake import CpuGraphs
from test_doctor import _embed, _env, _run, _status

from rocmfix import doctor
from rocmfix.guest import context, protocol, templates
from rocmfix.guest import doctor as guest_doctor
from rocmfix.ops import PATCH_EMBED
from rocmfix.render.doctor import doctor_document, doctor_table

from conftest import ROOT, load_template, run_cli

CAPS = {"MIN_SEEN": 3, "PAYBACK": 4, "MAX_GRAPHS": 8, "MAX_CAPTURES": 64, "MAX_BYTES": 2 << 30}


def test_without_a_gpu_doctor_gives_the_caps_in_force() -> None:
    env = {"ROCMFIX_GRAPHS_AFTER": "5", "ROCMFIX_GRAPHS_PAYBACK": "0"}
    result = run_cli("doctor", "--json", "--op", "conv-transpose", env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    graphs = result.json()["graphs"]
    assert graphs == {
        "status": "unavailable",
        "message": "no GPU: nothing to capture",
        "shapes": [],
        "held_bytes": [],
        "caps": {**CAPS, "MIN_SEEN": 5, "PAYBACK": 0},
    }


def _guest(
    monkeypatch: pytest.MonkeyPatch, gpu: bool, fake: CpuGraphs | None = None
) -> protocol.Graphs:
    """The guest's check, with the runner's device side the stand-in where one is given."""
    monkeypatch.setattr(context, "torch", torch)
    monkeypatch.setattr(guest_doctor, "templates", templates)
    if fake is not None:
        runner = load_template("rocmfix_graphs", interpret=None)
        fake.inside = runner._capturing
        runner._BACKEND = fake
        loads = types.SimpleNamespace(load=lambda *a, **k: runner)
        monkeypatch.setattr(guest_doctor, "templates", loads)
    request = types.SimpleNamespace(templates_dir=str(ROOT / "templates"))
    ctx: Any = types.SimpleNamespace(request=request, gpu=gpu, device=torch.device("cpu"))
    return guest_doctor.graphs(ctx)


def test_the_guest_check_on_a_gpu_reports_each_graphs_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = CpuGraphs()
    found = _guest(monkeypatch, gpu=True, fake=fake)
    assert found.status == "ok" and found.caps == CAPS and fake.captures == 2
    assert found.shapes == ["1x3x960x672 fp32", "1x3x736x960 fp32"]
    # Each graph: what its capture grew the pool by, plus its captured input.
    assert found.held_bytes == [
        fake.per_capture + 4 * 3 * h * w for h, w in ((960, 672), (736, 960))
    ]
    # A capture that fails here (a HIP graph refused, say): said, with the runner's reason.
    fake = CpuGraphs()
    fake.fail_capture = RuntimeError("operation not permitted when stream is capturing")
    found = _guest(monkeypatch, gpu=True, fake=fake)
    assert found.status == "failed" and found.held_bytes == [] and found.caps == CAPS
    assert str(found.message).startswith("RuntimeError: operation not permitted")
    # No GPU: the caps only (the real template, loaded from the templates folder).
    found = _guest(monkeypatch, gpu=False)
    assert (found.status, found.caps, found.held_bytes) == ("unavailable", CAPS, [])


def _report(graphs: dict[str, Any] | None) -> Any:
    answer = _run(_embed({"status": "ok", "ms": 0.2}, gemm_ms=0.1, linear_ms=0.1))
    if graphs is not None:
        event = protocol.parse_event({"event": "graphs", **graphs})
        answer = dataclasses.replace(answer, events=(*answer.events, event))
    return doctor.build_report(
        _status(_env(hip="7.1"), {}),
        answer,
        ops=[PATCH_EMBED],
        time_limit=10.0,
        tuned_file="/nonexistent/tuned.json",
    )


def test_the_table_and_the_json_report_it(capsys: pytest.CaptureFixture[str]) -> None:
    ok = {
        "status": "ok",
        "shapes": ["1x3x960x672 fp32", "1x3x736x960 fp32"],
        "held_bytes": [75 << 20, 86 << 20],
        "caps": CAPS,
    }
    report = _report(ok)
    assert report.ok  # what the runner did is information, never a failure of doctor
    doctor_table(report)
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "Graphs replayed equal to eager here; a small conv net's graphs held 75 MiB at "
        "1x3x960x672 fp32, 86 MiB at 1x3x736x960 fp32. Caps in force: a shape is captured once "
        "seen 3 times, and while a model's graphs have been replayed 4 times a capture; at most "
        "8 graphs and 64 captures a model, none new past 2048 MiB held." in text
    )
    assert doctor_document(report)["graphs"] == {"message": None, **ok}
    failed = {"status": "failed", "message": "RuntimeError: capture refused", "caps": CAPS}
    report = _report(failed)
    doctor_table(report)
    assert "Graphs failed: RuntimeError: capture refused. Caps in force" in " ".join(
        capsys.readouterr().out.split()
    )
    # A worker run that ended before the check: no line, null in the JSON.
    report = _report(None)
    doctor_table(report)
    assert "Graphs" not in capsys.readouterr().out
    assert doctor_document(report)["graphs"] is None and report.ok
