"""The profile report a user can trust and read (issues 39.6 and 43): a real HGNetV2 backbone
(transformers 5.24.0, built from its config, random weights, on the CPU) profiled under a
pseudo-terminal of 80 columns and piped at 200; nothing from a trace reaches the terminal as a
control sequence; the replay gives no verdict where it did not reproduce the run; rates show
their digits; a patch that routes an op is named with what it does and why it is or is not
proposed here; torch's own profiler warning does not open the report."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import releases
from conftest import ROOT, require, run_cli

PY = sys.executable
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")

HGNET = r"""
import torch
torch.set_num_threads(1)
from transformers.models.hgnet_v2 import HGNetV2Backbone, HGNetV2Config
torch.manual_seed(0)
model = HGNetV2Backbone(HGNetV2Config(out_features=["stage4"])).eval()  # random weights
with torch.no_grad():
    for _ in range(3):
        model(torch.randn(1, 3, 224, 224))
print("hgnet ran")
"""


def _paths() -> str:
    folders = [releases.importable("transformers", "5.24.0"),
               releases.importable("huggingface-hub", "1.33.0"),
               releases.importable("tokenizers", "0.23.3")]  # fmt: skip
    return os.pathsep.join([str(ROOT), *map(str, folders)])


def _at_terminal(columns: int, args: list[str], env: dict[str, str], timeout: int = 900) -> str:
    """stdout and stderr as a terminal of ``columns`` shows them, through script(1)."""
    require(shutil.which("script") is not None, "script(1) is needed for a pseudo-terminal")
    command = " ".join(shlex.quote(a) for a in (PY, "-m", "rocmfix", *args))
    full = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    full.update({"TERM": "xterm-256color", "CUDA_VISIBLE_DEVICES": "", **env})
    done = subprocess.run(
        ["script", "-qec", f"stty cols {columns} rows 60; {command}", "/dev/null"],
        capture_output=True, env=full, cwd="/", timeout=timeout, check=False,
    )  # fmt: skip
    screen = ANSI.sub("", done.stdout.decode("utf-8", "replace")).replace("\r", "")
    assert done.returncode == 0, screen[-3000:]
    return screen


def _document(stdout: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(stdout[stdout.index('{\n  "schema"') :])
    return doc


def _disagree(one: dict[str, Any], two: dict[str, Any]) -> list[str]:
    """The ops two runs of one script judge differently beyond the noise at the threshold: one
    flags it, the other neither flags it, nor gave no verdict (a replay that did not reproduce
    its run says so), nor measured its best alternative within 1.25x of the 2x threshold (an op
    at 2.06x in one run and 1.9x in the next is the same op, measured twice)."""
    from rocmfix.profile.model import FLAG_SPEEDUP

    def rows(doc: dict[str, Any]) -> dict[str, Any]:
        return {f"{r['op']} {r['shapes'][:2]} {r['source']}": r for r in doc["ops"]}

    out = []
    a, b = rows(one), rows(two)
    for key in a.keys() & b.keys():
        x, y = a[key], b[key]
        if x["flagged"] == y["flagged"] or x["replay_note"] or y["replay_note"]:
            continue
        near = [r["speedup"] for r in (x, y) if r["speedup"] is not None]
        if not (near and all(FLAG_SPEEDUP / 1.25 <= v <= FLAG_SPEEDUP * 1.25 for v in near)):
            out.append(f"{key}: {x['reason'] or x['speedup']} / {y['reason'] or y['speedup']}")
    return out


@pytest.mark.network
def test_an_hgnet_v2_report_is_whole_piped_and_at_80_columns(tmp_path: Path) -> None:
    script = tmp_path / "hgnet.py"
    script.write_text(HGNET)
    env = {"PYTHONPATH": _paths()}
    # Every op row: which ops take the most time varies with the host (CI's 2 cores once left
    # the depthwise convs out of the top 12).
    piped = run_cli("profile", "--json", "--top", "200", "--", PY, str(script), env=env,
                    timeout=900)  # fmt: skip
    assert piped.returncode == 0, piped.stderr[-3000:]
    doc = _document(piped.stdout)
    report = piped.stderr
    # rocmfix's line opens the report; torch's own profiler warning does not.
    assert report.lstrip("\n").startswith("rocmfix profile · 1 torch process · CPU"), report[:600]
    assert "UserWarning" not in report
    # Piped, nothing is cut: every module, source line and kernel whole on its line.
    assert "…" not in report
    lines = report.splitlines()
    assert all(line == line.rstrip() for line in lines), report
    for row in doc["ops"]:
        for text in (
            row["modules"][:1],
            [row["source"]] if row["source"] else [],
            row["kernels"][:1],
        ):
            assert not text or any(text[0] in line for line in lines), (text, report)
    # Rates with the prefix that shows their digits.
    assert "0.00 TFLOP/s" not in report and " 0 GB/s" not in report
    assert re.search(r"matmul fp32 [\d.]+ [kMGT]?FLOP/s · copy [\d.]+ [kMGT]?B/s", report), report
    # The depthwise convs name the patch that routes them, what it does and why not here.
    depthwise = [r for r in doc["ops"] if r["conv"] and r["conv"]["groups"] > 1]
    assert depthwise, [(r["op"], r["shapes"][:2]) for r in doc["ops"]]
    for row in depthwise:
        assert row["patch"] == "transformers-hgnet-v2"
        fix = row["fix"]
        assert fix["kind"] == "none" and fix["patch_id"] == "transformers-hgnet-v2", fix
        assert "depthwise convs" in fix["why"] and "CPU inputs take the stock path" in fix["why"]
        assert f"patch transformers-hgnet-v2: {fix['why']}" in map(str.strip, lines), report
    # The same report at an 80-column terminal: every line fits, nothing is cut, every number,
    # verdict, source line and kernel name is there whole (wrapped between words, a long path at
    # its slashes).
    out = tmp_path / "out"
    screen = _at_terminal(80, ["profile", "--top", "12", "--out", str(out), "--", PY,
                               str(script)], env)  # fmt: skip
    body = screen[screen.index("rocmfix profile") :]
    assert max(len(line) for line in body.splitlines()) <= 80, body
    assert "…" not in body
    flat = re.sub(r"\s+", "", body)
    again = json.loads((out / "profile.json").read_text())
    assert re.sub(r"\s+", "", f"{_ms(again['total_ms'])} of CPU time") in flat
    for row in again["ops"]:
        facts = [row["source"], *row["modules"][:1], *row["kernels"][:1], row["reason"] or "",
                 _ms(row["total_ms"] / row["calls"]), f"{row['share']:.1%}"]  # fmt: skip
        if row["fix"] and row["fix"]["why"]:
            facts.append(row["fix"]["why"])
        for fact in facts:
            assert re.sub(r"\s+", "", fact or "") in flat, (fact, body)
    # Two runs of the same script flag the same ops (beyond the noise at the threshold).
    assert not _disagree(doc, again), _disagree(doc, again)


DET_HEAD = r"""
import importlib.util, sys, types
import torch
torch.set_num_threads(1)
# MinerU's package __init__ pulls its document stack (docvortex); the OCR head needs none of it.
spec = importlib.util.find_spec("mineru")
sys.modules["mineru"] = pkg = types.ModuleType("mineru")
pkg.__path__ = list(spec.submodule_search_locations)
from mineru.model._internal.pytorchocr.modeling.heads.det_db_head import Head
torch.manual_seed(0)
head = Head(64).eval()  # random weights
with torch.no_grad():
    for _ in range(4):
        head(torch.randn(1, 64, 120, 84))
print("head ran")
"""


@pytest.mark.network
def test_ocr_dets_transposed_convs_name_mineru_ocr_db_head_and_why(tmp_path: Path) -> None:
    # MinerU 4.0.12's own DB head (PP-OCR det): two ConvTranspose2d, kernel 2, stride 2.
    script = tmp_path / "det.py"
    script.write_text(DET_HEAD)
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(releases.importable("mineru", "4.0.12"))])}
    done = run_cli("profile", "--json", "--top", "4", "--", PY, str(script), env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = _document(done.stdout)
    ups = [r for r in doc["ops"] if r["op"] == "conv_transpose2d"]
    assert len(ups) == 2, [(r["op"], r["source"]) for r in doc["ops"]]
    lines = [line.strip() for line in done.stderr.splitlines()]
    for row in ups:
        assert "/heads/det_db_head.py:" in row["source"] and row["patch"] == "mineru-ocr-db-head"
        fix = row["fix"]
        assert fix["kind"] == "none" and fix["patch_id"] == "mineru-ocr-db-head", fix
        assert fix["why"].startswith("Route det_db_head.py's transposed convs around MIOpen; ")
        assert fix["why"].endswith("not proposed here: CPU inputs take the stock path (its "
                                   "routes take GPU inputs only)")  # fmt: skip
        assert f"patch mineru-ocr-db-head: {fix['why']}" in lines, done.stderr


def _ms(value: float) -> str:
    from rocmfix.render.profile import _ms as ms

    return ms(value)


EVIL = r"""
import sys, warnings
import torch, torch.nn as nn
import torch.profiler.profiler as pp
torch.set_num_threads(1)

# A torch whose profiler warns at each start, as the H100's 2.11 did under rocmfix profile.
_prepare = pp._KinetoProfile.prepare_trace


def prepare_trace(self):
    warnings.warn("Warning: Profiler clears events at the end of each cycle. Only events from "
                  "the current cycle will be reported.", UserWarning)
    return _prepare(self)


pp._KinetoProfile.prepare_trace = prepare_trace
Evil = type("Evil\x1b]0;owned\x07\x1b[2J\x9b31m", (nn.Module,), {
    "forward": lambda self, x: self.body(x) * 2})
m = Evil()
m.add_module("body", nn.Sequential())
m.body.add_module("c\x1b[41m", nn.Conv2d(8, 8, 3, padding=1))
with torch.no_grad():
    for _ in range(3):
        m(torch.randn(1, 8, 32, 32))
warnings.warn("the user's own warning")
"""


def test_escapes_from_the_trace_never_reach_the_terminal_and_torch_warns_not(
    tmp_path: Path,
) -> None:
    # The class, the module's name and the script's own path carry ESC, BEL and a C1 CSI.
    script = tmp_path / "job\x1b[31m\x9b2J.py"
    script.write_text(EVIL)
    piped = run_cli("profile", "--top", "5", "--", PY, str(script), timeout=600)
    assert piped.returncode == 0, piped.stderr[-3000:]
    # The command's own stderr is its own (Python's warning names the script's path raw).
    report = piped.stderr[piped.stderr.index("\nrocmfix profile") :]
    assert not CONTROL.search(report), repr(report)
    assert "Evil?]0;owned??[2J?31m" in report and "c?[41m (Conv2d)" in report, report
    assert "job?[31m?2J.py" in report
    # The shim's own profiler warning is filtered; the command's own warnings stay.
    assert "Profiler clears events" not in piped.stderr
    assert "UserWarning: the user's own warning" in piped.stderr
    raw = subprocess.run(
        ["script", "-qec", "stty cols 80 rows 60; " + " ".join(shlex.quote(a) for a in (
            PY, "-m", "rocmfix", "profile", "--top", "5", "--", PY, str(script))), "/dev/null"],
        capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm",
                                  "CUDA_VISIBLE_DEVICES": ""}, cwd="/", timeout=600, check=False,
    ).stdout.decode("utf-8", "replace")  # fmt: skip
    report = raw[raw.index("\nrocmfix profile") :]
    assert "\x1b]" not in report and "\x07" not in report and "\x1b[2J" not in report
    assert "\x9b" not in report and "\x1b[41m" not in report


def test_console_escapes_what_every_renderer_prints(capsys: pytest.CaptureFixture[str]) -> None:
    from rocmfix.errors import RocmfixError
    from rocmfix.render import console

    evil = "x\x1b]0;t\x07\x1b[2J\x9b1m\u202ey"
    console.error(RocmfixError(evil, hint=evil))
    console.warning(evil)
    console.failures([evil], f"line one\n  {evil}\n")
    con = console.err()
    console.grid(con, ["a", "b"], [[(evil, ""), (evil, "")]])
    with console.progress("t") as step:
        step(1, 2, evil)
    err = capsys.readouterr().err
    assert not CONTROL.search(err) and "\u202e" not in err, repr(err)
    assert err.count("x?]0;t??[2J?1m?y") >= 6, err


def _row(**kw: Any) -> Any:
    from rocmfix.profile.model import OpStat

    fields: dict[str, Any] = dict(
        key="k", op="conv2d", shapes=((1, 384, 8, 8), (384, 384, 1, 1), ()), dtypes=("float32",),
        layout="contiguous", conv={"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1],
        "groups": 1, "transposed": False, "output_padding": [0]}, calls=10, total_ms=55.0,
        first_ms=5.5, steady_ms=5.5, share=0.3, flops=2.0 * 384 * 384 * 64, bytes=1e6,
        tflops=0.0254, gbps=0.381, roofline=0.41, modules=("m.c (Conv2d)",), source="job.py:9 f",
        kernels=("aten::mkldnn_convolution",), pids=(1,),
    )  # fmt: skip
    fields.update(kw)
    return OpStat(**fields)


def _forms(as_run: float, others: dict[str, float] | None = None, **more: float) -> Any:
    from rocmfix.profile.model import Form

    forms = {
        "as run": as_run,
        **(others or {}),
        **{k.replace("_", " "): v for k, v in more.items()},
    }
    return [Form(label, ms, ok=True) for label, ms in forms.items()]


def test_a_replay_that_does_not_reproduce_the_run_gives_no_verdict() -> None:
    from rocmfix.profile import analyse

    row = _row()
    # The run's steady calls took 5.5 ms; the replay's "as run" 36 ms (a loaded 2-core CPU).
    noisy = analyse.verdict(row, _forms(36.0, channels_last=0.3), None, False, "cpu", False, {},
                            total_ms=200.0)  # fmt: skip
    assert not noisy["flagged"] and noisy["speedup"] is None and noisy["best"] is None
    assert "36.00ms" in noisy["replay_note"] and "5.50ms" in noisy["replay_note"]
    assert f"more than {analyse.REPLAY_AGREES:.0f}x" in noisy["replay_note"]
    # A replay that agrees with the run is compared against the run's own time as well: a form
    # 2.5x faster than both is flagged, at the figure the run's own time supports.
    agrees = analyse.verdict(row, _forms(5.0, channels_last=2.0), None, False, "cpu", False, {},
                             total_ms=200.0)  # fmt: skip
    assert agrees["flagged"] and agrees["speedup"] == pytest.approx(2.5)
    slower = analyse.verdict(_row(steady_ms=3.0), _forms(5.0, channels_last=2.0), None, False,
                             "cpu", False, {}, total_ms=200.0)  # fmt: skip
    assert not slower["flagged"] and slower["speedup"] == pytest.approx(1.5)


def test_a_patch_that_routes_an_op_is_named_with_why_it_is_or_is_not_proposed() -> None:
    from rocmfix.profile import analyse
    from rocmfix.registry import all_patches

    head = next(p for p in all_patches() if p.id == "mineru-ocr-db-head")
    up = _row(op="conv_transpose2d", shapes=((1, 16, 240, 168), (16, 16, 2, 2), ()),
              conv={"stride": [2, 2], "padding": [0, 0], "dilation": [1, 1], "groups": 1,
                    "transposed": True, "output_padding": [0, 0]},
              first_ms=400.0, steady_ms=4.0, total_ms=436.0)  # fmt: skip
    # On a CPU: flagged (its first call), and the patch is named, with why it is not the fix.
    cpu = analyse.verdict(up, _forms(4.0, rocmfix_GEMM_plus_shuffle=3.0), head, False, "cpu",
                          False, {}, total_ms=600.0)  # fmt: skip
    assert cpu["flagged"] and cpu["fix"].kind == "none" and cpu["fix"].patch_id == head.id
    assert cpu["fix"].why.startswith(head.summary)
    assert cpu["fix"].why.endswith(
        "CPU inputs take the stock path (its routes take GPU inputs only)"
    )
    # On a ROCm GPU where the vendor op ran about as fast as the patch's formulation.
    even = _row(op="conv_transpose2d", shapes=up.shapes, conv=up.conv)
    gpu = analyse.verdict(even, _forms(5.0, {"rocmfix GEMM + shuffle": 4.0}), head, False, "cuda",
                          True, {}, total_ms=200.0)  # fmt: skip
    assert not gpu["flagged"] and gpu["fix"].patch_id == head.id
    assert "its rocmfix GEMM + shuffle form measured 1.2x the op as it ran here" in gpu["fix"].why
    # Where it is the fix, the fix says what the patch does.
    fast = analyse.verdict(even, _forms(5.0, {"rocmfix GEMM + shuffle": 1.0}), head, False, "cuda",
                           True, {}, total_ms=200.0)  # fmt: skip
    assert fast["fix"].kind == "patch" and fast["fix"].why == head.summary
    # A first call that dwarfs the steady ones is not what a patch removes: said so.
    slow_first = analyse.verdict(up, _forms(4.0, {"rocmfix GEMM + shuffle": 1.0}), head, False,
                                 "cuda", False, {}, total_ms=600.0)  # fmt: skip
    assert slow_first["flagged"] and slow_first["fix"].kind == "none"
    assert "its first call took 400ms, which the patch does not change" in slow_first["fix"].why


def test_rates_show_their_digits_and_piped_lines_are_whole() -> None:
    from rocmfix.profile.model import Calibration, ProfileReport, Window
    from rocmfix.render.profile import profile_table

    path = "/very/long/site-packages/" + "deep/" * 30 + "modeling.py:97 Layer.forward"
    row = _row(source=path)
    report = ProfileReport(("python", "job.py"), 0, "cpu", "CPU (x86_64, 1 thread)", (), 200.0,
                           Calibration({"float32": 0.0621}, 14.3), (row,), Window())  # fmt: skip
    stream = io.StringIO()
    profile_table(report, stream)
    text = stream.getvalue()
    assert "matmul fp32 62.1 GFLOP/s · copy 14.3 GB/s" in text
    assert "25.4 GFLOP/s, 381 MB/s" in text
    assert f"m.c (Conv2d) · {path}" in text.splitlines()[6], text
    assert "…" not in text


def test_a_call_whose_replay_as_run_gave_no_time_gives_no_verdict() -> None:
    """Each form has its own time limit: where the call as it ran was killed at it (a MIOpen
    search), the other forms' times are kept, and no verdict is drawn from them."""
    from rocmfix.profile import analyse
    from rocmfix.profile.model import Form

    forms = [Form("as run", None, error="killed at its time limit (120 s)"),
             Form("channels-last", 0.1, ok=True)]  # fmt: skip
    done = analyse.verdict(_row(), forms, None, False, "cuda", True, {}, total_ms=200.0)
    assert not done["flagged"] and done["best"] is None and done["speedup"] is None
    assert done["replay_note"] == "the call as it ran: killed at its time limit (120 s)"
    assert len(done["forms"]) == 2


def test_the_replay_kills_a_form_at_its_limit_and_keeps_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real worker, on this CPU: the call as it ran blocks past its limit (the test hook
    stands in for a MIOpen search); it is killed, the worker starts again without it, and
    the call's other forms and the calibration are still measured."""
    import sys

    from rocmfix.guest.protocol import Call
    from rocmfix.profile import replay

    monkeypatch.setenv("ROCMFIX_UNSAFE_TEST_HOOKS", '{"sleep": {"op0/native": 60}}')
    call = Call(name="aten::conv2d", shapes=[[1, 4, 12, 12], [4, 4, 3, 3], []],
                dtypes=["float32"] * 2, stride=[1, 1], padding=[1, 1], dilation=[1, 1])  # fmt: skip
    done = replay.run(sys.executable, {"k": call}, "cpu", {"num_threads": 1}, limit_s=5.0)
    forms = {f.label: f for f in done.forms["k"]}
    assert forms["as run"].ms is None and forms["as run"].error is not None
    assert "time limit (5 s)" in forms["as run"].error
    assert forms["channels-last"].ok and forms["channels-last"].ms is not None
    assert done.calibration is not None and done.fatal is None


@pytest.mark.parametrize(
    ("shape", "strides", "word"),
    [
        ([2, 3, 4, 5], [60, 20, 5, 1], "contiguous"),
        ([1, 3, 1, 5], [99, 5, 7, 1], "contiguous"),  # size-1 dims: any stride
        ([2, 3, 4, 5], [60, 1, 15, 3], "channels-last"),
        ([2, 3, 4, 5, 6], [360, 1, 90, 18, 3], "channels-last"),  # channels_last_3d
        ([2, 3, 4, 5], [60, 20, 1, 4], "strided"),  # H and W swapped
        ([3, 4], [1, 3], "strided"),
        ([2, 3], [], "-"),
    ],
)
def test_the_layout_is_named_as_torch_names_it(
    shape: list[int], strides: list[int], word: str
) -> None:
    from rocmfix.profile.collect import layout

    assert layout(shape, strides) == word
