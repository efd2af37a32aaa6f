"""``rocmfix profile`` through the real CLI on CPU: real commands, real models (DocLayout-YOLO
from its shipped yaml, a transformers Qwen2-VL vision tower from a small config, random
weights, no hub), child processes started by multiprocessing (spawn and fork), a failing
command, a command without torch. The target environment's files must not change."""

from __future__ import annotations

import hashlib
import json
import os
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
    # The forward of the innermost module outside torch, at its def line.
    line = CHILDREN.splitlines().index("    def forward(self, x):") + 1
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
        assert "/doclayout_yolo/nn/modules/g2l_crm.py:" in row["source"]
        assert row["source"].endswith(" DilatedBlock.forward")
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
