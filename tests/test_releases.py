"""tests/releases.py's installs are what pip writes: the suite's environments are real ones."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest

import releases

pytestmark = pytest.mark.network


def _installed(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), stat.S_IMODE(p.stat().st_mode))
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def _both_ways(root: Path, *wheels: Path, before: tuple[Path, ...] = ()) -> None:
    """The same venv path installed through pip_install and through pip itself."""
    found = []
    for install in (releases.pip_install, lambda python, *w: releases._pip(python, w)):
        shutil.rmtree(root, ignore_errors=True)
        python = releases.make_venv(root)
        if before:
            releases._pip(python, before)
        install(python, *wheels)
        found.append(_installed(root))
    assert found[0] == found[1]


def test_a_repeated_install_writes_what_pip_writes(tmp_path: Path) -> None:
    # Console scripts (their #! line names the venv's python, and RECORD hashes them), a
    # direct_url.json naming the wheel, two wheels at once.
    wheels = (
        releases.wheel("doclayout-yolo", "0.0.4"),
        releases.wheel("mineru-vl-utils", "0.1.13"),
    )
    releases.pip_install(releases.make_venv(tmp_path / "first"), *wheels)
    _both_ways(tmp_path / "a-venv-at-another-path", *wheels)
    assert any(name.startswith("bin/yolo") for name in _installed(tmp_path / "first"))


def test_an_upgrade_over_an_installed_release_is_pips_own(tmp_path: Path) -> None:
    wheel = releases.wheel("doclayout-yolo", "0.0.4")
    releases.pip_install(releases.make_venv(tmp_path / "first"), wheel)
    _both_ways(tmp_path / "upgrade", wheel, before=(releases.wheel("doclayout-yolo", "0.0.3"),))
