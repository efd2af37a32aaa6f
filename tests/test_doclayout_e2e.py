"""The patched DocLayout-YOLO package, run for real: the released model built from its shipped
yaml, before and after `rocmfix apply`, through the rewritten `dilated_conv`.

The rewrite routes only GPU inputs to the dropped module. On the CPU a tensor subclass that
reports ``is_cuda`` carries the input down that route, so the exact code a GPU takes runs here:
the phase split natively in float64, the Triton kernel in Triton's interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest

from conftest import InstalledEnv

pytestmark = pytest.mark.network

_FORWARD = textwrap.dedent(
    """
    import json, sys
    import torch
    import doclayout_yolo
    from doclayout_yolo.nn.tasks import YOLOv10DetectionModel
    from torch.utils._python_dispatch import TorchDispatchMode

    class Routed(torch.Tensor):
        "A CPU tensor that takes the rewrite's GPU branch."
        @property
        def is_cuda(self):
            return True

    class Dilations(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            # Under inference_mode aten.conv2d arrives undecomposed; both carry dilation at 5.
            if func in (torch.ops.aten.convolution.default, torch.ops.aten.conv2d.default):
                self.seen.append(max(args[5]) if len(args) > 5 else 1)
            return func(*args, **(kwargs or {}))

    dtype = getattr(torch, sys.argv[1])
    height, width = int(sys.argv[2]), int(sys.argv[3])
    cfg = f"{doclayout_yolo.__path__[0]}/cfg/models/v10/yolov10m-doclayout.yaml"
    torch.manual_seed(0)
    model = YOLOv10DetectionModel(cfg, nc=10, verbose=False).eval().to(dtype)
    x = torch.rand(1, 3, height, width, dtype=dtype)
    results = {"patched": "_rocmfix_dilated_conv2d" in open(
        sys.modules["doclayout_yolo.nn.modules.g2l_crm"].__file__).read()}
    with torch.inference_mode():
        for name, inp in (("plain", x), ("routed", x.as_subclass(Routed))):
            spy = Dilations()
            with spy:
                out = model(inp)
            maps = out["one2one"][1]
            flat = torch.cat([m.as_subclass(torch.Tensor).flatten(1) for m in maps], 1)
            results[name] = flat.double().flatten().tolist()[:20000]
            results[name + "_dilations"] = sorted(set(spy.seen))
    print(json.dumps(results))
    """
)


def _forward(env: InstalledEnv, dtype: str, size: tuple[int, int], interpret: bool) -> dict:
    run_env = {**os.environ, "PYTHONPATH": str(env.site)}
    if interpret:
        run_env["TRITON_INTERPRET"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", _FORWARD, dtype, str(size[0]), str(size[1])],
        capture_output=True,
        text=True,
        env=run_env,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _rel(a: list[float], b: list[float]) -> float:
    num = sum((x - y) ** 2 for x, y in zip(a, b, strict=True)) ** 0.5
    return num / max(sum(y * y for y in b) ** 0.5, 1e-300)


@pytest.mark.parametrize(
    ("scheme", "dtype", "size", "interpret", "tolerance"),
    [
        # float64 through the phase split: the same function up to rounding.
        ("linear", "float64", (256, 192), False, 1e-12),
        # The Triton kernel in the interpreter: small page, fp32 ("ieee" on the CPU).
        ("gemm", "float32", (64, 64), True, 1e-5),
    ],
)
def test_patched_model_matches_stock(
    scheme: str,
    dtype: str,
    size: tuple[int, int],
    interpret: bool,
    tolerance: float,
    doclayout_env: Callable[[str], InstalledEnv],
) -> None:
    env = doclayout_env("0.0.4")
    stock = _forward(env, dtype, size, interpret)
    assert not stock["patched"]
    assert max(stock["plain_dilations"]) == 5, "the stock model runs dilated convs"
    assert stock["routed"] == stock["plain"], "an unpatched file has no GPU branch"

    applied = env.cli("apply", "--scheme", scheme, "--only", "doclayout-dilated-conv")
    assert applied.returncode == 0, applied.stderr
    patched = _forward(env, dtype, size, interpret)
    assert patched["patched"]
    assert patched["plain"] == stock["plain"], "the CPU path is the stock code"
    assert patched["routed_dilations"] == [1], "no convolution with dilation > 1 on the route"
    error = _rel(patched["routed"], stock["plain"])
    assert error < tolerance, error
