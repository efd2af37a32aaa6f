"""The DocLayout-YOLO patch against every real release, through the real CLI."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rocmfix.ops import DILATED_CONV

import releases
from conftest import DOCLAYOUT_TARGET as TARGET
from conftest import ROOT, InstalledEnv, files_under, patch_p1

pytestmark = pytest.mark.network

PATCH = "doclayout-dilated-conv"
DROP = "doclayout_yolo/nn/modules/g2l_crm_triton.py"
TEMPLATES = {s.name: s.entry for s in DILATED_CONV.schemes}


# Every release there is (tests/test_compat.py checks the list against the index), named here
# so that collecting this file reads no index.
RELEASES = ("0.0.2b1", "0.0.3", "0.0.4")


# The three ship one byte-identical g2l_crm.py, and the compat sample round-trips all three:
# here the newest, with this patch's own checks.
@pytest.mark.parametrize("version", RELEASES[-1:])
def test_release_round_trip_every_scheme(
    version: str, doclayout_env: Callable[[str], InstalledEnv]
) -> None:
    env = doclayout_env(version)
    before = files_under(env.site)
    status = env.status(PATCH)
    assert status["verdict"] == "applicable", status
    assert status["pristine"] == "record"

    for scheme in TEMPLATES:
        applied = env.cli("apply", "--scheme", scheme, "--only", PATCH)
        assert applied.returncode == 0, applied.stderr
        # Where the files are: site-packages, not the environment's prefix.
        assert f" file(s) changed in {env.site}." in applied.stderr
        source = env.target.read_bytes()
        compile(source, TARGET, "exec")
        text = source.decode()
        assert "from .g2l_crm_triton import dilated_conv2d as _rocmfix_dilated_conv2d" in text
        assert "_rocmfix_dilated_conv2d(x, weight, dilation, padding, bn=bn, act=act)" in text
        # The CPU path keeps the release's own conv line, byte for byte.
        stock = [line for line in env.original.decode().splitlines() if "F.conv2d(" in line]
        assert len(stock) == 1 and stock[0] in text.splitlines()
        assert (env.site / DROP).read_bytes() == (
            ROOT / "templates" / TEMPLATES[scheme]
        ).read_bytes()
        assert env.status(PATCH)["scheme"] == scheme
        snapshot = files_under(env.site)
        again = env.cli("apply", "--scheme", scheme, "--only", PATCH)
        assert again.returncode == 0 and "unchanged" in again.stderr
        assert files_under(env.site) == snapshot

    reverted = env.cli("revert")
    assert reverted.returncode == 0, reverted.stderr
    assert files_under(env.site) == before
    assert not env.state.exists()


def test_original_has_no_trailing_newline_and_keeps_it(
    doclayout_env: Callable[[str], InstalledEnv], tmp_path: Path
) -> None:
    """g2l_crm.py ends without a newline: the rewrite and the dry-run diff keep that."""
    env = doclayout_env("0.0.4")
    assert not env.original.endswith(b"\n")
    dry = env.cli("apply", "--dry-run", "--only", PATCH)
    assert dry.returncode == 0, dry.stderr
    copy = tmp_path / "copy"
    releases.copy_tree(env.site, copy)
    assert patch_p1(dry.stdout_bytes, copy) == 0
    assert env.cli("apply", "--only", PATCH).returncode == 0
    assert not env.target.read_bytes().endswith(b"\n")
    assert (copy / TARGET).read_bytes() == env.target.read_bytes()
