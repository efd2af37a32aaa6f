"""``rocmfix profile`` reads what it knows of ops from the registry (issue 40, item 1): which
recorded calls are an op's (Op.matches), the forms its replay runs for them (Op.replay, each
scheme's public entry, through doctor's worker with the recorded call as the case) and which
scheme a winning form names. Nothing in rocmfix/profile or in the guest's replay names an op
or a template."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from rocmfix.ops import OPS
from rocmfix.profile import analyse, replay
from rocmfix.profile.model import Form, OpStat

from conftest import ROOT


def test_the_profile_and_its_replay_name_no_op_and_no_template() -> None:
    """Adding an op touches no file there: they hold no op's name, scheme table or template."""
    files = [*sorted((ROOT / "rocmfix/profile").glob("*.py")),
             ROOT / "rocmfix/guest/harness/call.py", ROOT / "rocmfix/guest/doctor.py"]  # fmt: skip
    for path in files:
        text = path.read_text(encoding="utf-8")
        for op in OPS:
            assert f'"{op.name}"' not in text, (path.name, op.name)
            for template in {t for scheme in op.schemes for t in scheme.templates}:
                assert template.removesuffix(".py") not in text, (path.name, template)


def _call(x: list[int], w: list[int], concrete: list[Any], name: str = "aten::conv2d") -> Any:
    return {"name": name, "shapes": [x, w, []], "concrete": [None, None, None, *concrete]}


DW = [[1, 64, 40, 40], [64, 1, 5, 5]]
CALLS = [
    (_call([1, 8, 32, 32], [8, 8, 3, 3], [[1, 1], [2, 2], [2, 2], 1]), "dilated-conv"),
    (_call(*DW, [[1, 1], [2, 2], [1, 1], 64]), "depthwise-conv"),
    (_call(*DW, [[1, 1], [4, 4], [2, 2], 64]), "dilated-conv"),  # a dilated depthwise conv
    (_call([6, 3, 2, 14, 14], [32, 3, 2, 14, 14], [[2, 14, 14], [0], [1], 1], "aten::conv3d"),
     "patch-embed"),
    (_call([1, 16, 9, 9], [16, 4, 2, 2], [[2, 2], [0, 0], [0, 0], 1, [1, 1]],
           "aten::conv_transpose2d"), "conv-transpose"),
    # A 1x1 is the pointwise op's, whatever its groups or dilation; strided, it is no op's.
    (_call([1, 64, 8, 8], [64, 1, 1, 1], [[1, 1], [0, 0], [1, 1], 64]), "pointwise-conv"),
    (_call([1, 64, 8, 8], [32, 64, 1, 1], [[1, 1], [0, 0], [3, 3], 1]), "pointwise-conv"),
    (_call([1, 64, 8, 8], [32, 64, 1, 1], [[2, 2], [0, 0], [2, 2], 1]), "dilated-conv"),
    (_call([1, 8, 32, 32], [8, 8, 3, 3], [[1, 1], [1, 1], [1, 1], 1]), None),
    (_call([1, 16, 9, 9], [16, 4, 2, 2], [[2, 2], [1, 1], [0, 0], 1, [1, 1]],
           "aten::conv_transpose2d"), None),
    (_call([1, 8, 32], [8, 8, 3], [[1], [2], [2], 1], "aten::conv1d"), None),
]  # fmt: skip


def _hot(call: Any) -> OpStat:
    shapes = tuple(tuple(s) for s in call["shapes"])
    return OpStat(key=str(id(call)), op=call["name"], shapes=shapes,
                  dtypes=("float32",) * len(shapes), layout="-", conv=analyse.conv_params(call),
                  calls=2, total_ms=2.0, first_ms=1.0, steady_ms=1.0, share=1.0, flops=None,
                  bytes=None, tflops=None, gbps=None, roofline=None, modules=(), source=None,
                  kernels=(), pids=(1,))  # fmt: skip


@pytest.mark.parametrize("call, kind", CALLS)
def test_each_recorded_conv_is_the_one_op_whose_rule_takes_it(call: Any, kind: str | None) -> None:
    assert analyse.conv_kind(call) == kind
    params = analyse.conv_params(call)
    assert params is not None
    x, w = call["shapes"][:2]
    assert sum(bool(op.matches and op.matches(params, x, w)) for op in OPS) == (kind is not None)
    # The replay's case names the op, whose schemes it runs (a transposed conv no op
    # computes is not replayed).
    row = _hot(dict(call, dtypes=["float"] * 3, strides=[]))
    calls = analyse.replay_calls([row], {row.key: _Group(dict(call, dtypes=[], strides=[]))})
    if kind is None and params["transposed"]:
        assert calls == {}
    else:
        assert calls[row.key].op == (kind or "")


class _Group:
    def __init__(self, op: Any) -> None:
        self.op = op


def _replay(calls: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each call's forms, replayed by the worker in this interpreter on the CPU."""
    rows = {
        name: _hot(dict(call, dtypes=["float"] * 3, strides=[])) for name, call in calls.items()
    }
    groups = {row.key: _Group(dict(calls[name], dtypes=["float"] * 3, strides=[]))
              for name, row in rows.items()}  # fmt: skip
    done = replay.run(sys.executable, analyse.replay_calls(list(rows.values()), groups), "cpu",  # type: ignore[arg-type]
                      {"num_threads": 1})  # fmt: skip
    assert done.fatal is None and done.calibration is not None
    return {name: {f.label: f for f in done.forms[row.key]} for name, row in rows.items()}


def _err(form: Form) -> float:
    return form.rel_err if form.rel_err is not None else float("inf")


def test_the_replay_runs_an_op_s_own_forms_and_leaves_out_what_they_decline() -> None:
    up = _call([1, 8, 6, 5], [8, 3, 2, 2], [[2, 2], [0, 0], [0, 0], 1, [1, 1]],
               "aten::conv_transpose2d")  # fmt: skip
    up["shapes"][2] = [3]
    odd = _call([1, 4, 20, 14], [4, 4, 2, 2], [[1, 1], "same", [3, 3], 1])
    assert analyse.conv_kind(odd) == "dilated-conv"
    got = _replay({
        "dilated": _call([1, 4, 20, 14], [4, 4, 3, 3], [[1, 1], [2, 2], [2, 2], 1]),
        # padding="same" with an odd total pads one side more: the op's forms decline it.
        "odd": odd,
        "even": _call([1, 4, 20, 14], [4, 4, 3, 3], [[1, 1], "same", [2, 2], 1]),
        # The transposed conv's GEMM and shuffle, with the call's bias.
        "up": up,
        "dw": _call([1, 8, 12, 10], [8, 1, 3, 3], [[2, 2], [1, 1], [1, 1], 8]),
        "pw": _call([1, 576, 20, 14], [192, 3, 1, 1], [[1, 1], [0, 0], [1, 1], 192]),
    })  # fmt: skip
    # The dilated op on a CPU: its phase split, checked against the call; its Triton scheme
    # runs on GPUs only (on a CPU, only in the interpreter).
    forms = got["dilated"]
    assert forms["rocmfix phase split"].ok and _err(forms["rocmfix phase split"]) < 1e-5
    assert "rocmfix Triton" not in forms and forms["as run"].ms is not None
    assert not [label for label in got["odd"] if label.startswith("rocmfix")]
    assert got["even"]["rocmfix phase split"].ok
    assert got["up"]["rocmfix GEMM + shuffle"].ok
    # A depthwise conv on a CPU: its channels-last scheme (the Triton one needs a GPU) beside
    # the call in the other layout.
    assert got["dw"]["rocmfix channels-last"].ok and "rocmfix Triton" not in got["dw"]
    assert got["dw"]["channels-last"].ok
    # DocLayout-YOLO's grouped 1x1 through the pointwise op's GEMM.
    assert got["pw"]["rocmfix GEMM"].ok and _err(got["pw"]["rocmfix GEMM"]) < 1e-6


def test_the_op_s_own_fastest_form_names_the_scheme() -> None:
    """A generic form a hair ahead (reshape + matmul beside the patch embed's F.linear) does
    not hide the fix: the op's own fastest form names it, where it is fast enough itself."""
    from rocmfix.registry import all_patches

    qwen = next(p for p in all_patches() if p.id == "transformers-qwen2-vl")
    call = CALLS[3][0]
    row = OpStat(key="k", op="conv3d", shapes=((6, 3, 2, 14, 14), (32, 3, 2, 14, 14), ()),
                 dtypes=("bfloat16",), layout="contiguous", conv=analyse.conv_params(call),
                 calls=10, total_ms=100.0, first_ms=10.0, steady_ms=10.0, share=0.5,
                 flops=None, bytes=None, tflops=None, gbps=None, roofline=None, modules=(),
                 source=None, kernels=(), pids=(1,))  # fmt: skip

    def fix(**ms: float) -> Any:
        forms = [Form(label, v, ok=True) for label, v in {"as run": 10.0, **ms}.items()]
        return analyse.verdict(row, forms, qwen, False, "cuda", True, {}, total_ms=200.0)

    done = fix(**{"reshape+matmul": 1.0, "rocmfix F.linear": 1.25, "rocmfix Triton": 2.0})
    assert done["best"] == "reshape+matmul" and done["flagged"]
    assert done["fix"].command == "rocmfix apply --only transformers-qwen2-vl --scheme linear"
    assert done["fix"].speedup == pytest.approx(8.0)
    assert fix(**{"rocmfix Triton": 1.0})["fix"].command.endswith(" --only transformers-qwen2-vl")
    # The op's forms too slow for a fix of their own: the faster generic one names none.
    slow = fix(**{"reshape+matmul": 1.0, "rocmfix F.linear": 6.0})
    assert slow["flagged"] and slow["fix"].kind == "none"
