"""Which targets each MinerU runs, read from its own code: real MinerU wheels, installed with
``--no-deps`` beside the releases of the packages rocmfix patches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import releases
from conftest import TRANSFORMERS_MODELS, InstalledEnv, run_cli

pytestmark = pytest.mark.network

DOCLAYOUT = "doclayout-dilated-conv"
TOKENIZER = "mineru-tokenizer"


def _env(tmp_path: Path, mineru: str) -> InstalledEnv:
    """MinerU ``mineru`` with DocLayout-YOLO 0.0.4 and mineru-vl-utils 0.1.13, both of
    which rocmfix would patch, whatever MinerU pins."""
    python = releases.make_venv(tmp_path / f"mineru-{mineru}")
    releases.pip_install(
        python,
        releases.wheel("mineru", mineru),
        releases.wheel("doclayout-yolo", "0.0.4"),
        releases.wheel("mineru-vl-utils", "0.1.13"),
    )
    site = releases.site_packages(python)
    return InstalledEnv(tmp_path, python, site, site, b"")


def _patches(env: InstalledEnv, *args: str) -> dict[str, dict[str, Any]]:
    result = env.cli("status", "--json", *args)
    assert result.returncode == 0, result.stderr
    return {p["id"]: p for p in result.json()["patches"]}


@pytest.mark.parametrize(
    ("mineru", "layout"),
    [("2.5.4", "applicable"), ("2.7.6", "applicable"), ("3.0.0", "not-needed"),
     ("4.0.12", "not-needed")],
)  # fmt: skip
def test_status_says_what_this_mineru_runs(tmp_path: Path, mineru: str, layout: str) -> None:
    env = _env(tmp_path, mineru)
    patches = _patches(env)
    doclayout, tokenizer = patches[DOCLAYOUT], patches[TOKENIZER]
    assert doclayout["verdict"] == layout, doclayout
    if layout == "not-needed":
        # MinerU 3.0 replaced DocLayout-YOLO with PP-DocLayoutV2: installed, never imported.
        assert doclayout["reason"].startswith(f"mineru {mineru} does not use doclayout-yolo")
        assert "import doclayout_yolo" in doclayout["reason"]
    else:
        says = f"mineru {mineru} runs it: its code imports doclayout_yolo"
        assert any(note.startswith(says) for note in doclayout["notes"]), doclayout
    # Every MinerU from 2.5 runs the vllm-async-engine client.
    assert tokenizer["verdict"] == "applicable", tokenizer
    assert any(n.startswith(f"mineru {mineru} runs it") for n in tokenizer["notes"])
    # Naming the patch is asking for it, whatever MinerU runs.
    asked = _patches(env, "--only", DOCLAYOUT)[DOCLAYOUT]
    assert asked["verdict"] == "applicable", asked
    document = env.cli("status", "--json").json()
    assert document["environment"]["mineru"] == mineru
    table = env.cli("status")
    assert f"MinerU {mineru}" in table.stdout


def test_apply_leaves_what_mineru_never_runs(tmp_path: Path) -> None:
    env = _env(tmp_path, "4.0.12")
    before = (env.site / "doclayout_yolo/nn/modules/g2l_crm.py").read_bytes()
    applied = env.cli("apply")
    assert applied.returncode == 0, applied.stderr
    assert "mineru-tokenizer: applied" in applied.stderr
    assert (env.site / "doclayout_yolo/nn/modules/g2l_crm.py").read_bytes() == before
    # Both of DocLayout-YOLO's patches (its dilated and 1x1 convs), one line for their reason.
    assert (
        "2 patches (doclayout-yolo 2): skipped: mineru 4.0.12 does not use doclayout-yolo"
        in applied.stderr
    ), applied.stderr
    assert env.cli("revert").returncode == 0
    assert run_cli("status", "--python", str(env.python)).returncode == 0


def test_a_model_mineru_never_loads_is_named_where_it_imports_its_package(
    tmp_path: Path,
) -> None:
    """MinerU 2.5.4 imports transformers (its formula and layout-reading models) but not
    HGNetV2: apply said "mineru 2.5.4 does not use transformers" (issue 43)."""
    from rocmfix.registry import all_patches

    python = releases.make_venv(tmp_path / "mineru-2.5.4")
    releases.pip_install(python, releases.wheel("mineru", "2.5.4"))
    files = [p.path for p in all_patches() if p.distribution == "transformers"]
    packages = ["transformers/__init__.py", f"{TRANSFORMERS_MODELS}/__init__.py"]
    packages += [f.rsplit("/", 1)[0] + "/__init__.py" for f in files]
    site = releases.partial_install(python, "transformers", "4.57.6", files + packages)
    env = InstalledEnv(tmp_path, python, site, site, b"")
    hgnet = _patches(env)["transformers-hgnet-v2"]
    assert hgnet["verdict"] == "not-needed", hgnet
    assert hgnet["reason"].startswith(
        "mineru 2.5.4 uses transformers, but not its hgnet_v2 model: its code has no import "
        "transformers.models.hgnet_v2"
    ), hgnet
    applied = env.cli("apply", "--dry-run", "--only", "transformers")
    assert "does not use transformers" not in applied.stderr, applied.stderr
    assert "transformers-hgnet-v2: skipped: mineru 2.5.4 uses transformers, but not" in (
        applied.stderr
    )
    # The eleven files this release does not have (ten models and PP-DocLayoutV2's graph
    # patch) are one line, as status shows them (each had its own "has no X model" line).
    assert not [line for line in applied.stderr.splitlines() if line.endswith(" model")]
    said = "11 patches (transformers 11): skipped: transformers 4.57.6 has none of these files"
    assert said in applied.stderr.splitlines(), applied.stderr
