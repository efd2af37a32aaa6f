"""Measured verdicts end to end: a real MinerU 4.0.12 wheel installed with pip, a ROCm torch's
metadata, a stored doctor result for a fake GPU arch, and the real CLI reading it."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rocmfix import doctor, measured
from rocmfix.ops import op
from rocmfix.patch import TorchInfo
from rocmfix.system import System

from conftest import InstalledEnv, fake_torch, files_under, install_release

MINERU = "4.0.12"
OCR = "mineru/model/_internal/pytorchocr/modeling"
DEPTHWISE = ("mineru-ocr-lcnetv4", "mineru-ocr-hgnetv2", "mineru-ocr-replkfpn")
TRANSPOSE = "mineru-ocr-db-head"
TORCH, HIP = "2.9.1+rocm7.2", "7.2.26015-fc0010cf6a"
# What MinerU 4's small models need to run in torch (mineru/model/runtime/device.py).
TORCH_STACK = ("torchvision", "transformers", "accelerate", "safetensors")


def fake_dist(site: Path, name: str, version: str) -> None:
    """A distribution's metadata and nothing else: what the probe reads."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("")


@pytest.fixture
def mineru_rocm(tmp_path: Path) -> InstalledEnv:
    env = install_release(tmp_path / "mineru", "mineru", MINERU, f"{OCR}/heads/det_db_head.py")
    fake_torch(env.site, TORCH, hip=HIP)
    for name in TORCH_STACK:
        fake_dist(env.site, name, "1.0")
    return env


def measured_file() -> Path:
    return Path(os.environ["XDG_CONFIG_HOME"]) / "rocmfix" / "measured.json"


def store(entries: dict[str, dict[str, Any]]) -> None:
    ops = {
        name: {"k": {"torch": TORCH, "hip": HIP, "measured_at": "2026-12-01", **e}}
        for name, e in entries.items()
    }
    measured_file().parent.mkdir(parents=True, exist_ok=True)
    measured_file().write_text(json.dumps({"schema": 1, "ops": ops}))


# The GPU the CLI sees: the ROCm runtime's own override of every GPU's arch (measured.gpu_archs).
ON_GFX1100 = {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}


def verdicts(env: InstalledEnv, *extra: str, gpu: dict[str, str] = ON_GFX1100) -> dict[str, Any]:
    result = env.cli("status", "--json", *extra, env=gpu)
    assert result.returncode == 0, result.stderr
    return {p["id"]: p for p in result.json()["patches"] if p["id"].startswith("mineru-ocr")}


def test_unmeasured_until_doctor_ran(mineru_rocm: InstalledEnv) -> None:
    found = verdicts(mineru_rocm)
    for pid in DEPTHWISE:
        assert found[pid]["verdict"] == "unmeasured", found[pid]
        assert "rocmfix doctor --op depthwise-conv" in found[pid]["reason"]
    assert "rocmfix doctor --op conv-transpose" in found[TRANSPOSE]["reason"]
    # A measurement with another torch build says so, and is not followed.
    store({"depthwise-conv": {"arch": "gfx1100", "scheme": "triton", "speedup": 6.1}})
    data = json.loads(measured_file().read_text())
    data["ops"]["depthwise-conv"]["k"]["torch"] = "2.8.0+rocm6.4"
    measured_file().write_text(json.dumps(data))
    found = verdicts(mineru_rocm)
    assert found[DEPTHWISE[0]]["verdict"] == "unmeasured"
    assert "not with this torch build" in found[DEPTHWISE[0]]["reason"]


def test_status_and_apply_follow_the_measurement(mineru_rocm: InstalledEnv) -> None:
    store(
        {
            "depthwise-conv": {"arch": "gfx1100", "scheme": "triton", "speedup": 6.1},
            "conv-transpose": {"arch": "gfx1100", "scheme": "linear", "speedup": 1.02},
        }
    )
    found = verdicts(mineru_rocm)
    for pid in DEPTHWISE:
        assert found[pid]["verdict"] == "applicable", found[pid]
        assert found[pid]["reason"] == (
            "measured 6.1x faster (triton) on gfx1100, ROCm 7.2, 2026-12-01"
        )
    assert found[TRANSPOSE]["verdict"] == "not-needed"
    assert found[TRANSPOSE]["reason"].startswith("the vendor op measured as fast here")

    before = files_under(mineru_rocm.site)
    result = mineru_rocm.cli("apply", "--scheme", "channels-last", env=ON_GFX1100)
    assert result.returncode == 0, result.stderr
    assert "mineru-ocr-db-head: skipped: the vendor op measured as fast here" in result.stderr
    after = files_under(mineru_rocm.site)
    changed = {k for k in after if before.get(k) != after[k]}
    assert f"{OCR}/backbones/rec_lcnetv4.py" in changed
    assert f"{OCR}/rocmfix_depthwise_conv.py" in changed
    assert f"{OCR}/heads/det_db_head.py" not in changed
    found = verdicts(mineru_rocm)
    assert {found[p]["verdict"] for p in DEPTHWISE} == {"applied"}

    # --only patches a named one whatever was measured.
    result = mineru_rocm.cli("apply", "--only", TRANSPOSE, env=ON_GFX1100)
    assert result.returncode == 0, result.stderr
    assert verdicts(mineru_rocm)[TRANSPOSE]["verdict"] == "applied"

    result = mineru_rocm.cli("revert")
    assert result.returncode == 0, result.stderr
    assert files_under(mineru_rocm.site) == before


def test_onnx_when_the_torch_stack_is_missing(mineru_rocm: InstalledEnv) -> None:
    store({"depthwise-conv": {"arch": "gfx1100", "scheme": "triton", "speedup": 6.1}})
    info = next(mineru_rocm.site.glob("accelerate-*.dist-info"))
    for child in info.iterdir():
        child.unlink()
    info.rmdir()
    found = verdicts(mineru_rocm)
    for pid in (*DEPTHWISE, TRANSPOSE):
        assert found[pid]["verdict"] == "not-needed"
        assert "in ONNX here (no accelerate)" in found[pid]["reason"]


@pytest.mark.parametrize(
    "hostile",
    ["link", "garbage", "schema", "huge", "bad-entry"],
)
def test_a_hostile_file_reads_as_unmeasured(tmp_path: Path, hostile: str) -> None:
    file = tmp_path / "measured.json"
    good = {"arch": "gfx1100", "torch": TORCH, "hip": HIP, "scheme": "triton"}
    good |= {"speedup": 6.1, "measured_at": "2026-12-01"}
    data: Any = {"schema": 1, "ops": {"depthwise-conv": {"k": good}}}
    if hostile == "link":
        (tmp_path / "real.json").write_text(json.dumps(data))
        file.symlink_to(tmp_path / "real.json")
    elif hostile == "garbage":
        file.write_bytes(b"\xff{not json")
    elif hostile == "schema":
        file.write_text(json.dumps({**data, "schema": 2}))
    elif hostile == "huge":
        file.write_text(json.dumps(data) + " " * measured.MAX_BYTES)
    else:
        for bad in ({"speedup": float("inf")}, {"arch": "../x"}, {"measured_at": "soon"}):
            file.write_text(json.dumps({"schema": 1, "ops": {"depthwise-conv": {"k": good | bad}}}))
            assert measured.read(file) == ()
        return
    assert measured.read(file) == ()
    torch = TorchInfo(TORCH, HIP, None)
    assert (
        measured.reading(op("depthwise-conv"), torch, file, frozenset({"gfx1100"})).faster is None
    )


def test_doctor_stores_gpu_results_only(tmp_path: Path) -> None:
    file = tmp_path / "measured.json"
    dw, ct = op("depthwise-conv"), op("conv-transpose")

    def report(kind: str) -> Any:
        device = SimpleNamespace(
            interpreter=kind != "gpu", arch="gfx1201", torch=TORCH, hip=HIP, kind=kind
        )
        ok = SimpleNamespace(failed=False)
        ops = [
            SimpleNamespace(op=dw, cases=[SimpleNamespace(schemes=[ok])], recommended="triton",
                            speedup=3.25, totals={"native": 6.5, "triton": 2.0,
                                                  "channels-last": 2.6}),
            SimpleNamespace(op=ct, cases=[SimpleNamespace(schemes=[ok])], recommended="linear",
                            speedup=0.9, totals={"native": 0.9, "linear": 1.0}),
            SimpleNamespace(op=op("dilated-conv"), cases=[], recommended="gemm", speedup=9.0),
        ]  # fmt: skip
        return SimpleNamespace(device=device, ops=ops)

    assert doctor.remember(report("cpu"), file) is None
    assert not file.exists()
    assert doctor.remember(report("gpu"), file) == file
    today = datetime.date.today().isoformat()
    stored = {(m.op, m.arch, m.scheme, m.speedup, m.measured_at) for m in measured.read(file)}
    assert stored == {
        ("depthwise-conv", "gfx1201", "triton", 3.25, today),
        ("conv-transpose", "gfx1201", "linear", 0.9, today),
    }
    torch, here = TorchInfo(TORCH, HIP, None), frozenset({"gfx1201"})
    assert {m.op: m.speedups for m in measured.read(file)}["depthwise-conv"] == (
        ("channels-last", 2.5),
        ("triton", 3.25),
    )
    assert measured.reading(dw, torch, file, here).faster is True
    assert measured.reading(ct, torch, file, here).faster is False
    # Another arch's result is kept beside it.
    measured.record({"depthwise-conv": ("channels-last", 1.5)}, "gfx942", TORCH, HIP, file)
    assert {m.arch for m in measured.read(file)} == {"gfx1201", "gfx942"}


def test_another_archs_measurement_never_decides(mineru_rocm: InstalledEnv) -> None:
    """A home folder shared across a cluster's nodes: a gfx942 node's "the vendor op is fast"
    read on a gfx1100 node (issue 39, item 8)."""
    store(
        {
            "depthwise-conv": {"arch": "gfx942", "scheme": "triton", "speedup": 1.01},
            "conv-transpose": {"arch": "gfx942", "scheme": "linear", "speedup": 5.0},
        }
    )
    found = verdicts(mineru_rocm)
    for pid in (*DEPTHWISE, TRANSPOSE):
        assert found[pid]["verdict"] == "unmeasured", found[pid]
        assert found[pid]["reason"].startswith("not measured on this GPU (gfx1100), only on gfx942")
    before = files_under(mineru_rocm.site)
    result = mineru_rocm.cli("apply", env=ON_GFX1100)
    assert result.returncode == 0, result.stderr
    assert "not measured on this GPU (gfx1100)" in result.stderr
    after = files_under(mineru_rocm.site)
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    # Only the graph patches wrote (no measured verdict decides them): no kernel route did.
    graphs = ("rocmfix_graphs.py", "predict_det.py", "predict_rec.py", "predict_cls.py", "RECORD")
    graphs += ("pp_doclayoutv2.py", "base_model.py")  # MinerU's layout call, the encoder's
    assert changed and all(p.endswith(graphs) for p in changed), changed
    # On the gfx942 node itself the same file decides.
    found = verdicts(mineru_rocm, gpu={"HSA_OVERRIDE_GFX_VERSION": "9.4.2"})
    assert found[DEPTHWISE[0]]["verdict"] == "not-needed"
    assert found[TRANSPOSE]["verdict"] == "applicable"


def test_the_nodes_arch_is_read_as_the_rocm_runtime_reads_it(tmp_path: Path) -> None:
    # The probe reads the KFD topology and the variable (tests/test_traps.py); this is what
    # the override makes of them.
    def seen(gfx: tuple[str, ...], override: str | None = None) -> frozenset[str]:
        env = {} if override is None else {"HSA_OVERRIDE_GFX_VERSION": override}
        return measured.gpu_archs(System(gfx=gfx, env=env))

    assert seen(()) == frozenset()
    assert seen(("gfx1100", "gfx90a")) == {"gfx1100", "gfx90a"}
    assert seen(("gfx1100", "gfx90a"), "9.4.2") == {"gfx942"}
    assert seen((), " 11.0.0 ") == {"gfx1100"}
    assert seen(("gfx1100", "gfx90a"), "gfx1100; rm -rf /") == {"gfx1100", "gfx90a"}
    assert seen(("gfx1100",), "9.99.0") == {"gfx1100"}  # no arch the runtime names

    store_file = tmp_path / "measured.json"
    measured.record({"depthwise-conv": ("triton", 6.1)}, "gfx1100", TORCH, HIP, store_file)
    dw, torch = op("depthwise-conv"), TorchInfo(TORCH, HIP, None)
    for archs, says in ((frozenset(), "(none)"), (frozenset({"gfx1100", "gfx90a"}), "gfx90a")):
        found = measured.reading(dw, torch, store_file, archs)
        assert found.faster is None and "no single AMD GPU arch seen here" in found.reason
        assert says in found.reason
    assert measured.reading(dw, torch, store_file, frozenset({"gfx1100"})).faster is True


def test_record_writes_no_link_and_no_folder_of_the_users(tmp_path: Path) -> None:
    """The file is replaced whole (fsops.atomic_write); a link or a folder at its name is the
    user's and stays as it was: the measurement stands, only status will not remember it."""
    real = tmp_path / "dotfiles" / "measured.json"
    real.parent.mkdir()
    real.write_text("mine\n")
    link = tmp_path / "config" / "measured.json"
    link.parent.mkdir()
    link.symlink_to(real)
    folder = tmp_path / "folder" / "measured.json"
    folder.mkdir(parents=True)
    for file in (link, folder):
        assert (
            measured.record({"depthwise-conv": ("triton", 6.1)}, "gfx1100", TORCH, HIP, file)
            is None
        )
    assert link.is_symlink() and real.read_text() == "mine\n"
    assert folder.is_dir() and not list(folder.iterdir())
    written = tmp_path / "new" / "measured.json"
    assert measured.record({"depthwise-conv": ("triton", 6.1)}, "gfx1100", TORCH, HIP, written)
    assert [m.scheme for m in measured.read(written)] == ["triton"]
