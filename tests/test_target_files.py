"""What apply and revert do to the target files and dropped modules: a read-only site folder,
files edited before or after apply, links where files should be, a target that no longer
parses or is not UTF-8, a user's file at a drop path, file modes, and all or nothing when
one patch of a run is refused.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import (
    PYTHONPATH,
    ROOT,
    VLLM_TARGETS,
    InstalledEnv,
    files_under,
    one_error_line,
    run_cli_readonly,
)

pytestmark = pytest.mark.network
PATCH = "mineru-tokenizer"
DOCLAYOUT = "doclayout-dilated-conv"


def test_readonly_site_packages(env: InstalledEnv) -> None:
    before = files_under(env.root)
    result = run_cli_readonly([env.target.parent], "apply", "--python", str(env.python))
    assert result.returncode == 1, result.stderr
    line = one_error_line(result.stderr)
    expected = "read-only file system" if os.geteuid() == 0 else "not writable"
    assert expected in line
    assert "nothing was changed" in line
    # Root on a read-only mount was told to run rocmfix as the user who owns the environment
    # (issue 43): no user can write there.
    owner = "as the user who owns that environment" in result.stderr
    assert owner == (os.geteuid() != 0), result.stderr
    if os.geteuid() == 0:
        assert "hint: no user can write there until the file system is mounted read-write" in (
            result.stderr
        )
    assert files_under(env.root) == before, "nothing may be half-written"


def test_apply_refuses_a_file_modified_since_install(env: InstalledEnv) -> None:
    env.target.write_bytes(env.original.replace(b"import asyncio", b"import asyncio  # local"))
    status = env.status(PATCH)
    assert status["verdict"] == "changed"
    assert status["pristine"] == "modified"
    refused = env.cli("apply")
    assert refused.returncode == 1
    assert "use --force" in one_error_line(refused.stderr)
    forced = env.cli("apply", "--force")
    assert forced.returncode == 0, forced.stderr
    assert env.status(PATCH)["verdict"] == "applied"
    assert env.cli("revert").returncode == 0
    assert b"# local" in env.target.read_bytes(), "revert restores what was there before"


def test_edit_after_apply_blocks_revert_until_forced(env: InstalledEnv) -> None:
    assert env.cli("apply").returncode == 0
    edited = env.target.read_bytes() + b"# someone else's edit\n"
    env.target.write_bytes(edited)
    assert env.status(PATCH)["verdict"] == "changed"

    refused = env.cli("revert")
    assert refused.returncode == 1
    assert "changed by someone else" in one_error_line(refused.stderr)
    assert env.target.read_bytes() == edited

    forced = env.cli("revert", "--force")
    assert forced.returncode == 0, forced.stderr
    assert env.target.read_bytes() == env.original
    assert not env.state.exists()


def test_one_refused_patch_refuses_the_whole_run(
    vllm_env: Callable[..., InstalledEnv],
) -> None:
    env = vllm_env("0.11.0", torch="2.9.1+rocm6.4", hip="6.4.43482")
    # qwen2.5-vl's file becomes a patch embed rocmfix does not know (kernel != stride).
    other = env.site / VLLM_TARGETS[1]
    other.write_text((ROOT / "tests" / "golden" / "vllm_stride.py").read_text())
    before = files_under(env.root)
    verdicts = {p["id"]: p["verdict"] for p in env.cli("status", "--json").json()["patches"]}
    assert verdicts["vllm-qwen2-vl"] == "applicable" and verdicts["vllm-qwen3-vl"] == "applicable"
    # Edited since pip installed it: refused unless forced, and forced, its shape is unknown.
    assert verdicts["vllm-qwen2.5-vl"] == "changed"
    for forced in ((), ("--force",)):
        refused = env.cli("apply", *forced)
        assert refused.returncode == 1, forced
        assert "nothing was changed" in refused.stderr and "vllm-qwen2.5-vl" in refused.stderr
        # Forced, the rewrite finds no patch embed it knows in the edited file.
        assert ("cannot rewrite" in refused.stderr) == bool(forced), refused.stderr
        assert files_under(env.root) == before
    # Named alone, the others apply; repeated --only selects both.
    both = env.cli(
        "apply", "--scheme", "linear", "--only", "vllm-qwen2-vl", "--only", "vllm-qwen3-vl"
    )
    assert both.returncode == 0, both.stderr
    after = {p["id"]: p["verdict"] for p in env.cli("status", "--json").json()["patches"]}
    assert after["vllm-qwen2-vl"] == after["vllm-qwen3-vl"] == "applied"
    assert other.read_text() == (ROOT / "tests" / "golden" / "vllm_stride.py").read_text()


@pytest.mark.parametrize("record", ["pristine", "modified"])
def test_target_that_no_longer_parses(env: InstalledEnv, record: str) -> None:
    # Cut inside the call's parentheses: the rest of the file is lost, as after a full disk.
    broken = env.original[: env.original.index(b"get_lora_tokenizer(") + 19]
    env.target.write_bytes(broken)
    if record == "pristine":
        # As if the package itself shipped a file this Python cannot parse.
        info = next(env.site.glob("mineru_vl_utils-*.dist-info")) / "RECORD"
        lines = info.read_bytes().splitlines(keepends=True)
        digest = base64.urlsafe_b64encode(hashlib.sha256(broken).digest()).rstrip(b"=")
        key = env.target.relative_to(env.site).as_posix().encode() + b","
        info.write_bytes(
            b"".join(
                key + b"sha256=" + digest + b",%d\r\n" % len(broken) if ln.startswith(key) else ln
                for ln in lines
            )
        )
    before = files_under(env.root)
    status = env.status(PATCH)
    assert status["verdict"] == "unsupported"
    assert "does not parse" in str(status["reason"])
    for args in (("apply",), ("apply", "--force")):
        result = env.cli(*args)
        assert result.returncode == 1, result.stderr
        assert "does not parse" in one_error_line(result.stderr)
    assert files_under(env.root) == before
    assert env.cli("revert").returncode == 0


def test_a_target_with_a_stray_latin1_byte_reads_as_unsupported(env: InstalledEnv) -> None:
    env.target.write_bytes(env.original.replace(b"# ", b"# caf\xe9 ", 1))
    result = env.cli("status", "--json")
    assert result.returncode == 0, result.stderr
    verdicts = {p["id"]: p for p in result.json()["patches"]}
    assert verdicts[PATCH]["verdict"] in ("unsupported", "changed")


# ---------------------------------------------------------------- links and drop paths


def test_symlinked_target_is_left_alone(env: InstalledEnv, canary: Path) -> None:
    real = canary.parent / "client.py"
    real.write_bytes(env.original)
    env.target.unlink()
    env.target.symlink_to(real)
    before = files_under(env.root)
    status = env.status(PATCH)
    assert status["verdict"] == "unsupported"
    assert "symbolic link" in str(status["reason"])
    result = env.cli("apply")
    assert result.returncode == 1
    line = one_error_line(result.stderr)
    assert "symbolic link" in line and "nothing was changed" in line
    forced = env.cli("apply", "--force")
    assert forced.returncode == 1, "not even --force writes through a link"
    assert files_under(env.root) == before
    assert real.read_bytes() == env.original
    assert env.target.is_symlink()
    assert not env.state.exists()


def test_symlink_where_a_dropped_file_goes(
    doclayout_env: Callable[[str], InstalledEnv], tmp_path: Path
) -> None:
    env = doclayout_env("0.0.4")
    elsewhere = tmp_path / "elsewhere.py"
    elsewhere.write_text("# not rocmfix's\n")
    drop = env.target.parent / "g2l_crm_triton.py"
    drop.symlink_to(elsewhere)
    before = files_under(env.root)
    refused = env.cli("apply", "--only", "doclayout-yolo")
    assert refused.returncode == 1
    assert "is a symbolic link; rocmfix will not write there" in one_error_line(refused.stderr)
    assert files_under(env.root) == before

    # Not even --force writes through a link or over one: the link is the user's.
    forced = env.cli("apply", "--only", "doclayout-yolo", "--force")
    assert forced.returncode == 1
    assert "symbolic link" in one_error_line(forced.stderr)
    assert files_under(env.root) == before
    assert drop.is_symlink() and elsewhere.read_text() == "# not rocmfix's\n"


def test_force_over_a_users_file_at_a_drop_path_is_reverted_to_it(
    doclayout_env: Callable[[str], InstalledEnv],
) -> None:
    env = doclayout_env("0.0.4")
    mine = env.target.parent / "g2l_crm_triton.py"
    mine.write_bytes(b"# my own kernels, not rocmfix's\n")
    refused = env.cli("apply", "--only", DOCLAYOUT)
    assert refused.returncode == 1 and "did not put it there" in refused.stderr
    assert env.cli("apply", "--only", DOCLAYOUT, "--force").returncode == 0
    assert mine.read_bytes() != b"# my own kernels, not rocmfix's\n"
    switched = env.cli("apply", "--only", DOCLAYOUT, "--scheme", "linear")
    assert switched.returncode == 0, switched.stderr
    assert env.cli("revert").returncode == 0
    assert mine.read_bytes() == b"# my own kernels, not rocmfix's\n"
    assert not env.state.exists()


# ------------------------------------------------------------------- modes and folders


def test_modes_follow_the_package_whatever_the_umask(
    doclayout_env: Callable[[str], InstalledEnv],
) -> None:
    env = doclayout_env("0.0.4")
    target_mode = stat.S_IMODE(env.target.stat().st_mode)
    done = subprocess.run(
        ["sh", "-c", 'umask 077 && exec "$@"', "sh", *_cli_argv(env, "apply", "--only", DOCLAYOUT)],
        capture_output=True,
        text=True,
        env=_cli_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    modules = env.target.parent
    for name in ("g2l_crm.py", "g2l_crm_triton.py", "rocmfix_kernel_config.py"):
        assert stat.S_IMODE((modules / name).stat().st_mode) == target_mode, name
    for path in [env.state, *env.state.rglob("*")]:
        # Whoever can read the package can read rocmfix's record of it; not its lock, which
        # whoever can open can hold (tests/test_hostile_files.py).
        if path.name != "lock":
            assert stat.S_IMODE(path.stat().st_mode) & 0o044 == 0o044, path


def _cli_env() -> dict[str, str]:

    return {**os.environ, "PYTHONPATH": PYTHONPATH}


def _cli_argv(env: InstalledEnv, *args: str) -> list[str]:
    import sys

    return [sys.executable, "-m", "rocmfix", *args, "--python", str(env.python)]


def test_an_empty_share_folder_the_environment_had_stays(env: InstalledEnv) -> None:
    share = env.root / "share"
    share.mkdir()
    assert env.cli("apply").returncode == 0
    assert env.cli("revert").returncode == 0
    assert share.is_dir() and not any(share.iterdir())
