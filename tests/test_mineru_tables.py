"""MinerU's table models on AMD's ONNX Runtime providers: the real MinerU wheels patched and
reverted byte for byte, and the patched table session called on the CPU under each real
onnxruntime build, whose provider lists are real data even without the GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from patches import mineru_tables
from rocmfix.system import ONNXRUNTIME_BUILDS

import releases
from conftest import InstalledEnv

pytestmark = pytest.mark.network

ORT = {
    "onnxruntime": "1.32.0",
    "onnxruntime-rocm": "1.22.2.post3",
    "onnxruntime-migraphx": "1.27.1",
}
LOGURU = "0.7.3"
SESSION = "mineru/model/runtime/onnx.py"
UNET = "mineru/model/table/rec/unet_table/utils.py"
CLS = "mineru/model/table/cls/paddle_table_cls.py"


def _env(tmp_path: Path, mineru: str, ort: str | None) -> InstalledEnv:
    python = releases.make_venv(tmp_path / f"mineru-{mineru}-{ort}")
    wheels = [releases.wheel("mineru", mineru)]
    if ort is not None:
        wheels.append(releases.wheel(ort, ORT[ort]))
    releases.pip_install(python, *wheels)
    site = releases.site_packages(python)
    return InstalledEnv(tmp_path, python, site, site, b"")


def _verdicts(env: InstalledEnv) -> dict[str, dict[str, object]]:
    result = env.cli("status", "--json")
    assert result.returncode == 0, result.stderr
    return {p["id"]: p for p in result.json()["patches"] if p["id"].startswith("mineru-table")}


@pytest.mark.parametrize(
    ("mineru", "applicable"),
    [
        ("3.4.5", {"mineru-table-unet": UNET, "mineru-table-cls": CLS}),
        ("4.0.12", {"mineru-table-session": SESSION}),
    ],
)
def test_apply_and_revert_round_trip(
    tmp_path: Path, mineru: str, applicable: dict[str, str]
) -> None:
    env = _env(tmp_path, mineru, "onnxruntime-migraphx")
    verdicts = _verdicts(env)
    for patch_id, item in verdicts.items():
        want = "applicable" if patch_id in applicable else "not-needed"
        assert item["verdict"] == want, item
    before = {rel: (env.site / rel).read_bytes() for rel in applicable.values()}
    applied = env.cli("apply", *(f"--only={p}" for p in applicable))
    assert applied.returncode == 0, applied.stderr
    for rel, data in before.items():
        after = (env.site / rel).read_bytes()
        assert after != data and b"_rocmfix_table_session(" in after
    assert all(v["verdict"] == "applied" for k, v in _verdicts(env).items() if k in applicable)
    reverted = env.cli("revert")
    assert reverted.returncode == 0, reverted.stderr
    assert {rel: (env.site / rel).read_bytes() for rel in before} == before


def test_no_amd_onnxruntime_leaves_the_tables_alone(tmp_path: Path) -> None:
    env = _env(tmp_path, "4.0.12", "onnxruntime")
    item = _verdicts(env)["mineru-table-session"]
    assert item["verdict"] == "not-needed", item
    assert item["reason"] == mineru_tables.NO_AMD_BUILD


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value: int | str | bytes) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def identity_model() -> bytes:
    """An ONNX model (protobuf written by hand: no onnx package): y = Identity(x), float[2]."""

    def value(name: str) -> bytes:
        shape = _field(2, _field(1, _field(1, 2)))
        return _field(1, name) + _field(2, _field(1, _field(1, 1) + shape))

    node = _field(1, "x") + _field(2, "y") + _field(4, "Identity")
    graph = _field(1, node) + _field(2, "g") + _field(11, value("x")) + _field(12, value("y"))
    return _field(1, 8) + _field(7, graph) + _field(8, _field(2, 13))


# Loads the patched onnx.py by path (not MinerU's package, whose __init__ needs its whole
# stack), records the providers each InferenceSession is asked for, and runs each model.
_CALL = """
import importlib.util, json, sys
import numpy, onnxruntime
asked = []
class Recording(onnxruntime.InferenceSession):
    def __init__(self, path, *args, **kwargs):
        asked.append(kwargs.get("providers"))
        super().__init__(path, *args, **kwargs)
onnxruntime.InferenceSession = Recording
spec = importlib.util.spec_from_file_location("mineru_onnx", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
out = {"available": onnxruntime.get_available_providers(), "models": {}}
for path in sys.argv[2:]:
    del asked[:]
    session = module.table_ort_session(path)
    y = session.run(None, {"x": numpy.ones(2, numpy.float32)})[0].tolist()
    first = [p if isinstance(p, str) else p[0] for p in asked[0]]
    out["models"][path.rsplit("/", 1)[1]] = {"asked": first, "got": session.get_providers(),
                                              "y": y}
print(json.dumps(out))
"""


@pytest.fixture
def patched_session(tmp_path: Path) -> Path:
    """MinerU 4.0.12's runtime/onnx.py as ``rocmfix apply`` writes it (through the CLI)."""
    tmp = tmp_path / "tables"
    env = _env(tmp, "4.0.12", "onnxruntime-migraphx")
    applied = env.cli("apply", "--only=mineru-table-session")
    assert applied.returncode == 0, applied.stderr
    path = tmp / "onnx.py"
    path.write_bytes((env.site / SESSION).read_bytes())
    return path


@pytest.mark.parametrize(
    ("build", "first"),
    [
        ("onnxruntime", None),
        ("onnxruntime-rocm", "ROCMExecutionProvider"),
        ("onnxruntime-migraphx", "MIGraphXExecutionProvider"),
    ],
)
def test_patched_session_asks_for_what_the_build_lists(
    tmp_path: Path, patched_session: Path, build: str, first: str | None
) -> None:
    models = {}
    for name in ("unet.onnx", "slanet-plus.onnx"):
        models[name] = tmp_path / name
        models[name].write_bytes(identity_model())
    path = [releases.importable(build, ORT[build]), releases.importable("loguru", LOGURU)]
    done = subprocess.run(
        [sys.executable, "-c", _CALL, str(patched_session), *map(str, models.values())],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": ":".join(map(str, path)), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # What status says each build lists (rocmfix.system) is what the build lists.
    gpu = {
        p for p in out["available"] if p not in ("CPUExecutionProvider", "AzureExecutionProvider")
    }
    assert gpu == set(ONNXRUNTIME_BUILDS[build])
    stock = ["CPUExecutionProvider"]  # what MinerU 4.0.12 asks for where CUDA is not listed
    unet, slanet = out["models"]["unet.onnx"], out["models"]["slanet-plus.onnx"]
    if first is None:
        assert first not in out["available"]
        assert unet["asked"] == stock
    else:
        assert first in out["available"], out
        assert unet["asked"] == [first, *stock]
    # slanet-plus crashes MIGraphX (AMDMIGraphX#5078): it keeps what MinerU asked for.
    assert slanet["asked"] == stock
    # No AMD GPU here: onnxruntime falls back to the CPU itself, and the model still runs.
    assert unet["got"] == slanet["got"] == stock
    assert unet["y"] == slanet["y"] == [1.0, 1.0]
    assert "rocmfix: table model unet.onnx runs on ['CPUExecutionProvider']" in done.stderr
    assert "rocmfix: table model slanet-plus.onnx runs on" in done.stderr


def test_the_table_device_setting_keeps_minerus_choice(
    tmp_path: Path, patched_session: Path
) -> None:
    model = tmp_path / "unet.onnx"
    model.write_bytes(identity_model())
    path = [releases.importable(b, ORT[b]) for b in ("onnxruntime-migraphx",)]
    path.append(releases.importable("loguru", LOGURU))
    done = subprocess.run(
        [sys.executable, "-c", _CALL, str(patched_session), str(model)],
        capture_output=True,
        text=True,
        env={
            "PYTHONPATH": ":".join(map(str, path)),
            "PATH": "/usr/bin:/bin",
            "MINERU_TABLE_DEVICE": "cpu",
        },
        cwd=tmp_path,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["models"]["unet.onnx"]["asked"] == ["CPUExecutionProvider"]
