"""``rocmfix profile`` through the real CLI on CPU: real commands, real models (DocLayout-YOLO
from its shipped yaml, a transformers Qwen2-VL vision tower from a small config, random
weights, no hub), child processes started by multiprocessing (spawn and fork), a failing
command, a command without torch. The target environment's files must not change."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

import releases
from conftest import run_cli

PY = sys.executable

CHILDREN = r"""
import multiprocessing as mp, sys
import torch, torch.nn as nn
torch.set_num_threads(1)  # GNU OpenMP's threads do not survive a fork


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(8, 16, 3, padding=2, dilation=2), nn.ReLU())

    def forward(self, x):
        return self.body(x)


def work(tag):
    torch.manual_seed(0)
    m = Net().eval()
    with torch.no_grad():
        for _ in range(3):
            m(torch.randn(1, 8, 64, 64))
    print("done", tag, flush=True)


if __name__ == "__main__":
    work("main")
    for method in ("spawn", "fork"):
        p = mp.get_context(method).Process(target=work, args=(method,))
        p.start()
        p.join()
    print("to stderr", file=sys.stderr)
    sys.exit(3)
"""

MODELS = r"""
import importlib, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
yolo = importlib.import_module("doclayout_yolo")
tasks = importlib.import_module("doclayout_yolo.nn.tasks")
cfg = Path(yolo.__file__).parent / "cfg/models/v10/yolov10m-doclayout.yaml"
torch.manual_seed(0)
model = tasks.YOLOv10DetectionModel(str(cfg), nc=10, verbose=False).eval()
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel
config = Qwen2VLVisionConfig(depth=1, embed_dim=64, hidden_size=64, num_heads=2, mlp_ratio=2,
                             in_channels=3, patch_size=14, spatial_merge_size=2,
                             temporal_patch_size=2)
tower = Qwen2VisionTransformerPretrainedModel._from_config(config).eval()
with torch.no_grad():
    model(torch.randn(1, 3, 128, 128))
    tower(torch.randn(64, 3 * 2 * 14 * 14), grid_thw=torch.tensor([[1, 8, 8]]))
print("models ran")
"""


# Two convs issued from two lines of one forward, and a custom op whose first call sleeps (a
# stand-in for a MIOpen Find or a cuDNN autotune: a search on the first call only).
LINES = r"""
import time, torch, torch.nn as nn
import torch.nn.functional as F
torch.set_num_threads(1)
seen = []
lib = torch.library.Library("rocmfixtest", "DEF")
lib.define("warm(Tensor x) -> Tensor")


def _warm(x):
    if not seen:
        seen.append(1)
        time.sleep(1.0)
    return x * 2


lib.impl("warm", _warm, "CPU")
warm = torch.ops.rocmfixtest.warm


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(8, 8, 3, padding=1)
        self.w = nn.Parameter(torch.randn(8, 8, 3, 3))

    def forward(self, x):
        y = self.a(x)  # first
        y = F.conv2d(y, self.w, padding=1)  # second
        return warm(y)


m = Two().eval()
with torch.no_grad():
    for _ in range(6):
        m(torch.randn(1, 8, 48, 48))
"""


def _split(stdout: str) -> tuple[str, dict[str, Any]]:
    """The command's own stdout, and the JSON document printed after it."""
    start = stdout.index('{\n  "schema"')
    return stdout[:start], json.loads(stdout[start:])


def _snapshot(*folders: Path) -> dict[str, Any]:
    """Every file's bytes under small folders; size and mtime under the interpreter's."""
    seen: dict[str, Any] = {}
    for folder in folders:
        for root, _dirs, files in os.walk(folder):
            for name in files:
                path = Path(root, name)
                if path.is_symlink():
                    continue
                if "site-packages" in str(folder):
                    st = path.stat()
                    seen[str(path)] = (st.st_size, st.st_mtime_ns)
                else:
                    seen[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return seen


def test_children_spawn_and_fork_are_profiled_and_a_failing_command_keeps_its_output(
    tmp_path: Path,
) -> None:
    script = tmp_path / "children.py"
    script.write_text(CHILDREN)
    result = run_cli("profile", "--json", "--top", "3", "--", PY, str(script), timeout=600)
    assert result.returncode == 3, result.stderr
    own, doc = _split(result.stdout)
    assert own == "done main\ndone spawn\ndone fork\n"
    assert result.stderr.startswith("to stderr\n"), result.stderr[:500]
    assert doc["schema"] == "rocmfix-profile/1" and doc["exit_code"] == 3
    assert len(doc["processes"]) == 3, doc["processes"]
    pids = {p["pid"] for p in doc["processes"]}
    conv = next(r for r in doc["ops"] if r["op"] == "conv2d")
    assert set(conv["pids"]) == pids  # every process ran the conv, and each was profiled
    assert conv["calls"] == 9 and conv["shapes"][0] == [1, 8, 64, 64]
    assert conv["conv"]["dilation"] == [2, 2] and conv["layout"] == "contiguous"
    assert conv["modules"] == ["body.0 (Conv2d)"]
    # The line outside torch that issued it (through nn.Sequential and nn.Conv2d).
    line = CHILDREN.splitlines().index("        return self.body(x)") + 1
    assert conv["source"] == f"{script}:{line} Net.forward"
    labels = {f["label"] for f in conv["forms"]}
    assert {"as run", "channels-last", "rocmfix phase split"} <= labels, labels
    assert doc["calibration"]["copy_gbps"] > 0
    assert "take" in doc["summary"] and "the command exited with 3" in result.stderr


def test_a_command_without_torch_has_nothing_to_profile_and_the_env_sitecustomize_runs(
    tmp_path: Path,
) -> None:
    (tmp_path / "sitecustomize.py").write_text("print('the environment sitecustomize ran')\n")
    # The environment's folder goes after rocmfix's (the shell appends it), as a venv's
    # site-packages comes after PYTHONPATH.
    script = f'PYTHONPATH="$PYTHONPATH:{tmp_path}" exec "$0" -c "print(1); raise SystemExit(5)"'
    result = run_cli("profile", "--", "sh", "-c", script, PY)
    assert result.returncode == 5
    assert result.stdout == "the environment sitecustomize ran\n1\n"
    assert "nothing to profile" in result.stderr


@pytest.mark.network
def test_doclayout_and_a_qwen2_vl_tower_are_attributed_to_their_modules_and_lines(
    tmp_path: Path,
) -> None:
    folders = [releases.importable("doclayout-yolo", "0.0.4"),
               releases.importable("transformers", "5.24.0"),
               releases.importable("huggingface-hub", "1.33.0"),
               releases.importable("tokenizers", "0.23.3")]  # fmt: skip
    site = Path(sysconfig.get_paths()["purelib"])
    before = _snapshot(*folders, site)
    script = tmp_path / "models.py"
    script.write_text(MODELS)
    out = tmp_path / "out"
    env = {"PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), *map(str, folders)])}
    result = run_cli("profile", "--json", "--top", "12", "--out", str(out), "--", PY,
                     str(script), env=env, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    own, doc = _split(result.stdout)
    assert own.endswith("models ran\n")  # after doclayout-yolo's own line
    ops = doc["ops"]
    dilated = [r for r in ops if r["conv"] and max(r["conv"]["dilation"]) > 1]
    assert dilated, [(r["op"], r["source"]) for r in ops]
    for row in dilated:
        # DilatedBlock.dilated_conv's F.conv2d line, a helper its forward calls.
        assert "/doclayout_yolo/nn/modules/g2l_crm.py:" in row["source"]
        assert row["source"].endswith(" DilatedBlock.dilated_conv")
        assert all("(DilatedBlock)" in m for m in row["modules"]), row["modules"]
        assert row["patch"] == "doclayout-dilated-conv"
    embed = [r for r in ops if r["op"] == "conv3d"]
    if embed:  # in the top 12 on this machine
        row = embed[0]
        assert row["shapes"][0] == [64, 3, 2, 14, 14] and row["patch"] == "transformers-qwen2-vl"
        assert "/transformers/models/qwen2_vl/modeling_qwen2_vl.py:" in row["source"]
        assert "reshape+matmul" in {f["label"] for f in row["forms"]}
    assert (out / "profile.json").is_file() and list(out.glob("trace-*.json"))
    json.loads(next(out.glob("trace-*.json")).read_text())  # Perfetto reads it
    assert _snapshot(*folders, site) == before


def test_each_conv_is_attributed_to_the_line_that_issued_it_and_first_call_cost_is_flagged(
    tmp_path: Path,
) -> None:
    script = tmp_path / "lines.py"
    script.write_text(LINES)
    result = run_cli("profile", "--json", "--top", "4", "--", PY, str(script), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    _own, doc = _split(result.stdout)
    lines = LINES.splitlines()
    first = lines.index("        y = self.a(x)  # first") + 1
    second = lines.index("        y = F.conv2d(y, self.w, padding=1)  # second") + 1
    convs = {r["source"]: r for r in doc["ops"] if r["op"] == "conv2d"}
    assert set(convs) == {f"{script}:{first} Two.forward", f"{script}:{second} Two.forward"}
    assert all(r["calls"] == 6 for r in convs.values())
    assert convs[f"{script}:{first} Two.forward"]["modules"] == ["a (Conv2d)"]
    warm = next(r for r in doc["ops"] if r["op"] == "rocmfixtest::warm")
    assert warm["calls"] == 6 and warm["first_ms"] >= 1000 > 5 * warm["steady_ms"]
    assert warm["flagged"] and warm["reason"].startswith("first call "), warm["reason"]
    # On a CPU no setting removes a first-call cost: no fix is named (a MIOpen Find's or a
    # cuDNN autotune's is, below).
    assert warm["fix"]["kind"] == "none"


def _row(op: str, shapes: list[list[int]], conv: dict[str, Any] | None, **kw: Any) -> Any:
    from rocmfix.profile.model import OpStat

    fields: dict[str, Any] = dict(
        key=op, op=op, shapes=tuple(tuple(s) for s in shapes), dtypes=("float32",),
        layout="contiguous", conv=conv, calls=10, total_ms=100.0, first_ms=50.0,
        steady_ms=50 / 9, share=0.5, flops=None, bytes=None, tflops=None, gbps=None,
        roofline=None, modules=(), source=None, kernels=(), pids=(1,),
    )  # fmt: skip
    fields.update(kw)
    return OpStat(**fields)


CONV = {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1,
        "transposed": False, "output_padding": [0]}  # fmt: skip


def test_first_call_cost_and_sdpa_math_name_the_setting_that_fixes_them() -> None:
    from rocmfix.profile import analyse

    row = _row("conv2d", [[1, 8, 48, 48], [8, 8, 3, 3]], CONV)
    # ROCm: the first call is a MIOpen Find; FAST is the fix unless the run had it.
    done = analyse.verdict(row, None, None, False, "cuda", True, {}, total_ms=200.0)
    assert done["flagged"] and done["fix"].command == "export MIOPEN_FIND_MODE=FAST"
    assert "(MIOpen Find)" in done["reason"]
    fast = analyse.verdict(row, None, None, False, "cuda", True, {}, total_ms=200.0,
                           env={"MIOPEN_FIND_MODE": "FAST"})  # fmt: skip
    assert fast["flagged"] and fast["fix"].kind == "none"
    # CUDA with cuDNN's benchmark on: the autotune.
    bench = analyse.verdict(row, None, None, False, "cuda", False, {"cudnn.benchmark": True},
                            total_ms=200.0)  # fmt: skip
    assert bench["fix"].command == "torch.backends.cudnn.benchmark = False"
    # A search that runs on the host before any kernel (cuDNN's autotune took 9 s of host
    # time and 8 ms of device time in DocLayout-YOLO's first forward on the H100).
    host = _row("conv2d", [[1, 8, 48, 48], [8, 8, 3, 3]], CONV, first_ms=10.0, steady_ms=10.0,
                host_first_ms=900.0, host_steady_ms=0.05)  # fmt: skip
    done = analyse.verdict(host, None, None, False, "cuda", False, {"cudnn.benchmark": True},
                           total_ms=200.0)  # fmt: skip
    assert done["flagged"] and done["reason"].startswith("first call 900ms (host)")
    # A first call under 5x a steady one is a cold cache, not a search.
    warm = _row("conv2d", [[1, 8, 48, 48], [8, 8, 3, 3]], CONV, first_ms=20.0, steady_ms=80 / 9)
    assert not analyse.verdict(warm, None, None, False, "cuda", True, {}, total_ms=200.0)["flagged"]
    sdpa = _row("scaled_dot_product_attention", [[1, 8, 64, 64]] * 3, None, first_ms=10.0)
    callees = ("aten::_scaled_dot_product_attention_math",)
    math_ = analyse.verdict(sdpa, None, None, False, "cuda", True, {}, total_ms=200.0,
                            callees=callees)  # fmt: skip
    assert math_["flagged"] and math_["fix"].command == 'eval "$(rocmfix env)"'
    assert math_["reason"] == "scaled_dot_product_attention ran SDPA's math kernel"
    on = {"TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL": "1"}
    assert not analyse.verdict(sdpa, None, None, False, "cuda", True, {}, total_ms=200.0,
                               callees=callees, env=on)["flagged"]  # fmt: skip
    assert not analyse.verdict(sdpa, None, None, False, "cuda", False, {}, total_ms=200.0,
                               callees=callees)["flagged"]  # fmt: skip


def test_depthwise_and_kernel_stride_transposed_convs_map_to_their_patches() -> None:
    from rocmfix.profile import analyse
    from rocmfix.profile.model import Form
    from rocmfix.registry import all_patches

    patches = all_patches()
    dw = {"name": "aten::conv2d", "shapes": [[1, 64, 40, 40], [64, 1, 5, 5], []],
          "concrete": [None, None, None, [1, 1], [2, 2], [1, 1], 64]}  # fmt: skip
    hgnet = "/x/site-packages/transformers/models/hgnet_v2/modeling_hgnet_v2.py:97 F"
    patch, routed = analyse.patch_for(dw, hgnet, patches)
    assert patch is not None and patch.id == "transformers-hgnet-v2" and not routed
    dense = dict(dw, shapes=[[1, 64, 40, 40], [64, 64, 5, 5], []])
    assert analyse.patch_for(dense, hgnet, patches) == (None, False)
    up = {"name": "aten::conv_transpose2d", "shapes": [[1, 64, 120, 84], [64, 16, 2, 2], []],
          "concrete": [None, None, None, [2, 2], [0, 0], [0, 0], 1, [1, 1]]}  # fmt: skip
    head = "mineru/model/_internal/pytorchocr/modeling/heads/det_db_head.py:40 H.forward"
    patch, _ = analyse.patch_for(up, head, patches)
    assert patch is not None and patch.id == "mineru-ocr-db-head"
    padded = dict(up, concrete=[None, None, None, [2, 2], [1, 1], [0, 0], 1, [1, 1]])
    assert analyse.patch_for(padded, head, patches) == (None, False)
    # A flagged depthwise conv names the patch with the scheme whose formulation won here.
    row = _row("conv2d", dw["shapes"], analyse.conv_params(dw), first_ms=10.0)
    forms = [Form("as run", 3.0, ok=True), Form("rocmfix Triton", 1.0, ok=True)]
    hg = next(p for p in patches if p.id == "transformers-hgnet-v2")
    done = analyse.verdict(row, forms, hg, False, "cuda", True, {}, total_ms=200.0)
    assert done["flagged"] and done["fix"].command == "rocmfix apply --only transformers-hgnet-v2"
    forms.append(Form("rocmfix channels-last", 0.5, ok=True))
    done = analyse.verdict(row, forms, hg, False, "cuda", True, {}, total_ms=200.0)
    assert done["fix"].command.endswith("--only transformers-hgnet-v2 --scheme channels-last")


LAYOUT = r"""
import torch
torch.set_num_threads(1)
from transformers.models.pp_doclayout_v2 import (
    PPDocLayoutV2Config, PPDocLayoutV2ForObjectDetection)
config = PPDocLayoutV2Config()  # transformers' defaults; random weights, no hub
# The defaults leave the post-processing thresholds to the checkpoint.
config.class_thresholds = [0.5] * config.num_labels
config.class_order = list(range(config.num_labels))
torch.manual_seed(0)
model = PPDocLayoutV2ForObjectDetection(config).eval()
with torch.no_grad():
    for _ in range(2):
        model(pixel_values=torch.randn(1, 3, 128, 128))
print("layout ran")
"""


@pytest.mark.network
def test_pp_doclayout_v2_depthwise_convs_are_hgnet_v2_conv_layers_with_their_patch(
    tmp_path: Path,
) -> None:
    folders = [releases.importable("transformers", "5.24.0"),
               releases.importable("huggingface-hub", "1.33.0"),
               releases.importable("tokenizers", "0.23.3")]  # fmt: skip
    hgnet = folders[0] / "transformers/models/hgnet_v2/modeling_hgnet_v2.py"
    # The line that calls the conv in HGNetV2ConvLayer.forward, read from the release.
    text = hgnet.read_text().splitlines()
    start = text.index("class HGNetV2ConvLayer(nn.Module):")
    line = text.index("        hidden_state = self.convolution(input)", start) + 1
    script = tmp_path / "layout.py"
    script.write_text(LAYOUT)
    env = {"PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), *map(str, folders)])}
    result = run_cli("profile", "--json", "--top", "400", "--", PY, str(script), env=env,
                     timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    own, doc = _split(result.stdout)
    assert own.endswith("layout ran\n")
    depthwise = [r for r in doc["ops"] if r["conv"] and r["conv"]["groups"] > 1]
    assert len(depthwise) >= 4, [(r["op"], r["shapes"][:2]) for r in doc["ops"][:40]]
    for row in depthwise:
        x, w = row["shapes"][0], row["shapes"][1]
        assert row["conv"]["groups"] == x[1] == w[0] and w[1] == 1, row["shapes"]
        assert row["source"] == f"{hgnet}:{line} HGNetV2ConvLayer.forward", row["source"]
        assert all(m.endswith(".convolution (Conv2d)") for m in row["modules"]), row["modules"]
        assert row["patch"] == "transformers-hgnet-v2", row["patch"]
        if row["flagged"] and row["fix"]["kind"] == "patch":
            assert row["fix"]["command"].startswith("rocmfix apply --only transformers-hgnet-v2")
    # The dense convs of the same layer are not the depthwise patch's op.
    dense = [r for r in doc["ops"] if r["conv"] and r["source"] and "modeling_hgnet_v2" in
             r["source"] and r["conv"]["groups"] == 1]  # fmt: skip
    assert dense and all(r["patch"] is None for r in dense)


RAISES = r"""
import torch, torch.nn as nn
from torch.overrides import TorchFunctionMode
torch.set_num_threads(1)


class Boom(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 3, 3)

    def forward(self, x, fail=False):
        y = self.c(x)
        if fail:
            raise ValueError("boom")
        return y


class Mine(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


m, x = Boom(), torch.randn(1, 3, 16, 16)
m(x)
try:
    m(x, fail=True)
except ValueError:
    pass
with Mine():
    m(x)
    print("inside", torch._C._len_torch_function_stack())
m(x)
print("after", torch._C._len_torch_function_stack())
"""


def test_a_forward_that_raises_leaves_the_users_torch_function_modes_as_they_were(
    tmp_path: Path,
) -> None:
    script = tmp_path / "raises.py"
    script.write_text(RAISES)
    plain = subprocess.run([PY, str(script)], capture_output=True, text=True, timeout=300)
    assert plain.stdout == "inside 1\nafter 0\n", plain.stderr[-2000:]
    result = run_cli("profile", "--json", "--top", "2", "--", PY, str(script), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    own, doc = _split(result.stdout)
    assert own == plain.stdout  # the source mode left with each model call, even the raising one
    conv = next(r for r in doc["ops"] if r["op"] == "conv2d")
    assert conv["calls"] == 4 and conv["modules"] == ["c (Conv2d)"]
