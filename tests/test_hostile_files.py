"""Hostile files and state, round two (issue 28's files half, issue 32's state items): FIFOs
and links to /dev/zero where rocmfix reads, a tuned file or config variable built to break
the model, a lock someone else holds, runs seen while another one works. Each ends in one
clear line (or a warning and the shipped config, inside a model), never a hang, and nothing
lost."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from test_installs import conda_like_prefix

import releases
from conftest import PYTHONPATH, InstalledEnv, files_under, load_template, run_cli

pytestmark = pytest.mark.network
DROP = "doclayout_yolo/nn/modules/g2l_crm_triton.py"


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.fixture
def doclayout(doclayout_env: Callable[[str], InstalledEnv]) -> InstalledEnv:
    env = doclayout_env("0.0.4")
    applied = env.cli("apply", "--only", "doclayout-yolo")
    assert applied.returncode == 0, applied.stderr
    return env


# ---------------------------------------------------------------------------- item 5


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


@pytest.mark.parametrize("make", [_fifo, _zero], ids=["fifo", "link-to-dev-zero"])
def test_a_dropped_module_replaced_by_a_fifo_or_dev_zero(
    doclayout: InstalledEnv, make: Callable[[Path], None]
) -> None:
    """status and revert read the dropped module to see whether it is still rocmfix's: a
    FIFO there must not block them, a link to /dev/zero must not fill memory."""
    drop = doclayout.site / DROP
    drop.unlink()
    make(drop)
    status = doclayout.cli("status", "--json", timeout=60)
    assert status.returncode == 0, status.stderr
    by_id = {p["id"]: p for p in status.json()["patches"]}
    assert by_id["doclayout-dilated-conv"]["verdict"] == "changed"
    before = files_under(doclayout.site)
    revert = doclayout.cli("revert", timeout=60)
    assert revert.returncode == 1
    assert "use --force" in _one_error_line(revert.stderr)
    assert files_under(doclayout.site) == before
    assert drop.is_symlink() or stat.S_ISFIFO(drop.lstat().st_mode)


# ---------------------------------------------------------------------------- item 6


@pytest.fixture
def gemm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    pytest.importorskip("triton")
    monkeypatch.setenv("ROCMFIX_TUNED_FILE", str(tmp_path / "absent.json"))
    monkeypatch.delenv("ROCMFIX_PATCH_EMBED_CONFIG", raising=False)
    module = load_template("patch_embed_gemm")
    module.clear_config_cache()
    yield module
    module.clear_config_cache()


def _alarm(_signum: int, _frame: object) -> None:
    raise TimeoutError("the kernel config hung on the tuned file")


def _resolve_within(module: ModuleType, seconds: int) -> dict[str, object]:
    before = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(seconds)
    try:
        with pytest.warns(RuntimeWarning, match="rocmfix"):
            config: dict[str, object] = module.resolve_config("cpu")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
    return config


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _tuned_nested(path: Path) -> None:
    path.write_text('{"schema": 1, "kernels": ' + _nested(200_000) + "}")


@pytest.mark.parametrize(
    "make", [_tuned_nested, _fifo, _zero], ids=["deeply-nested", "fifo", "link-to-dev-zero"]
)
@pytest.mark.parametrize("where", ["variable", "xdg"])
def test_a_hostile_tuned_file_leaves_the_shipped_config(
    gemm: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[[Path], None],
    where: str,
) -> None:
    if where == "xdg":
        monkeypatch.delenv("ROCMFIX_TUNED_FILE")
        monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
        path = tmp_path / "config" / "rocmfix" / "tuned.json"
        path.parent.mkdir(parents=True)
    else:
        path = tmp_path / "tuned.json"
        monkeypatch.setenv("ROCMFIX_TUNED_FILE", str(path))
    make(path)
    default = _default(gemm)
    assert _resolve_within(gemm, 20) == default


def _default(module: ModuleType) -> dict[str, object]:
    saved = os.environ.pop("ROCMFIX_TUNED_FILE", None)
    os.environ["ROCMFIX_TUNED_FILE"] = "/nonexistent/rocmfix-tuned.json"
    try:
        module.clear_config_cache()
        config: dict[str, object] = module.resolve_config("cpu")
    finally:
        os.environ.pop("ROCMFIX_TUNED_FILE")
        if saved is not None:
            os.environ["ROCMFIX_TUNED_FILE"] = saved
        module.clear_config_cache()
    return config


def test_a_deeply_nested_config_variable_leaves_the_shipped_config(
    gemm: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    default = _default(gemm)
    monkeypatch.setenv("ROCMFIX_PATCH_EMBED_CONFIG", _nested(100_000))
    assert _resolve_within(gemm, 20) == default


def test_doctor_does_not_hang_on_a_fifo_tuned_file(tmp_path: Path) -> None:
    path = tmp_path / "tuned.json"
    os.mkfifo(path)
    result = run_cli(
        "doctor",
        "--json",
        "--op",
        "patch-embed",
        env={"ROCMFIX_TUNED_FILE": str(path)},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    codes = {w["code"] for w in result.json()["warnings"]}
    assert "tuned-file-corrupt" in codes


# ---------------------------------------------------------------------------- item 7


def test_tune_reset_leaves_a_file_that_is_not_rocmfixs(tmp_path: Path) -> None:
    foreign = tmp_path / "settings.json"
    foreign.write_text('{"theme": "dark"}\n')
    result = run_cli("tune", "--reset", env={"ROCMFIX_TUNED_FILE": str(foreign)})
    assert result.returncode == 1
    assert "not a rocmfix tuned file" in _one_error_line(result.stderr)
    assert foreign.read_text() == '{"theme": "dark"}\n'
    ours = tmp_path / "tuned.json"
    ours.write_text('{"schema": 1, "kernels": {}}\n')
    result = run_cli("tune", "--reset", env={"ROCMFIX_TUNED_FILE": str(ours)})
    assert result.returncode == 0, result.stderr
    assert not ours.exists()


def test_tune_store_refuses_a_file_that_is_not_rocmfixs(tmp_path: Path) -> None:
    from rocmfix import tuned_file
    from rocmfix.errors import RefusedError

    foreign = tmp_path / "settings.json"
    foreign.write_text('{"theme": "dark"}\n')
    entry = tuned_file.TunedEntry("patch_embed_gemm", "gfx1100", "f16", {"BLOCK_M": 32})
    with pytest.raises(RefusedError, match="not a rocmfix tuned file"):
        tuned_file.store(foreign, [entry], {})
    assert foreign.read_text() == '{"theme": "dark"}\n'


# ---------------------------------------------------------------------------- issue 32


def test_a_corrupt_manifest_does_not_stop_status(doclayout: InstalledEnv) -> None:
    manifest = doclayout.state / "manifest.json"
    manifest.write_text('{"schema": 1, "entries": {')
    status = doclayout.cli("status")
    assert status.returncode == 0, status.stderr
    assert "doclayout-dilated-conv" in status.stdout
    assert "not valid JSON" in " ".join(status.stdout.split())
    check = doclayout.cli("status", "--check")
    assert check.returncode == 1


def _stopped(pid: int) -> bool:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return fields[0] == "T"


def test_revert_and_status_during_a_running_apply(
    doclayout_env: Callable[[str], InstalledEnv],
) -> None:
    env = doclayout_env("0.0.4")
    pristine = files_under(env.site)
    args = ("apply", "--only", "doclayout-yolo", "--python", str(env.python))
    apply = subprocess.Popen(
        [sys.executable, "-m", "rocmfix", *args],
        env={
            **os.environ,
            "PYTHONPATH": PYTHONPATH,
            "ROCMFIX_UNSAFE_TEST_HOOKS": json.dumps({"pause_at": 5}),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd="/",
    )
    try:
        deadline = time.monotonic() + 120
        while not _stopped(apply.pid):
            assert apply.poll() is None, apply.communicate()
            assert time.monotonic() < deadline, "the apply never reached its first write"
            time.sleep(0.1)
        revert = env.cli("revert")
        assert revert.returncode == 1, revert.stdout + revert.stderr
        line = _one_error_line(revert.stderr)
        assert f"another rocmfix run (pid {apply.pid})" in line, line
        status = env.cli("status")
        assert status.returncode == 0, status.stderr
        assert f"another rocmfix run (pid {apply.pid})" in " ".join(
            (status.stdout + status.stderr).split()
        )
        assert files_under(env.site) == pristine
    finally:
        os.kill(apply.pid, signal.SIGCONT)
        _out, err = apply.communicate(timeout=120)
    assert apply.returncode == 0, err
    assert env.status("doclayout-dilated-conv")["verdict"] == "applied"


# ---------------------------------------------------------------------------- item 16


def test_the_lock_file_is_not_open_to_everyone(doclayout: InstalledEnv) -> None:
    """flock needs no write access: a lock file others can read is one they can hold."""
    lock = doclayout.state / "lock"
    assert lock.exists()
    assert stat.S_IMODE(lock.stat().st_mode) & 0o007 == 0


def test_a_lock_held_by_a_process_that_is_not_rocmfix(doclayout: InstalledEnv) -> None:
    lock = doclayout.state / "lock"
    lock.write_text("999999999")
    with lock.open("rb") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        result = doclayout.cli("revert")
    assert result.returncode == 1
    line = _one_error_line(result.stderr)
    assert "999999999" in line and "not running" in line, line


# ---------------------------------------------------------------------------- item 15


def _attributes(path: Path) -> dict[str, bytes]:
    return {n: os.getxattr(path, n) for n in os.listxattr(path)}


def test_acls_and_extended_attributes_survive_apply_and_revert(
    doclayout_env: Callable[[str], InstalledEnv],
) -> None:
    env = doclayout_env("0.0.4")
    setfacl = shutil.which("setfacl")
    if setfacl is None:
        pytest.fail("this test needs setfacl (apt-get install acl), as .ci/run installs it")
    subprocess.run([setfacl, "-m", "u:nobody:rw", str(env.target)], check=True)
    os.setxattr(env.target, "user.origin", b"installed by hand")
    before = _attributes(env.target)
    mode = env.target.stat().st_mode
    assert "system.posix_acl_access" in before
    applied = env.cli("apply", "--only", "doclayout-yolo")
    assert applied.returncode == 0, applied.stderr
    assert env.target.read_bytes() != env.original
    assert _attributes(env.target) == before
    reverted = env.cli("revert")
    assert reverted.returncode == 0, reverted.stderr
    assert env.target.read_bytes() == env.original
    assert _attributes(env.target) == before
    assert env.target.stat().st_mode == mode


# ---------------------------------------------------------------------------- item 9


def _no_final_newline(record: bytes) -> bytes:
    return record.rstrip(b"\n")


def _mixed_line_endings(record: bytes) -> bytes:
    # pip writes RECORD with csv's CRLF; half its lines end in LF alone here.
    lines = record.replace(b"\r\n", b"\n").split(b"\n")
    return b"\n".join(line + b"\r" if i % 2 and line else line for i, line in enumerate(lines))


def _a_line_for_the_drop(record: bytes) -> bytes:
    return record + DROP.encode() + b",,\n"


@pytest.mark.parametrize(
    "shape",
    [_no_final_newline, _mixed_line_endings, _a_line_for_the_drop],
    ids=["no-final-newline", "mixed-line-endings", "a-line-for-the-drop"],
)
def test_record_is_byte_identical_after_apply_and_revert(
    doclayout_env: Callable[[str], InstalledEnv], shape: Callable[[bytes], bytes]
) -> None:
    env = doclayout_env("0.0.4")
    (record,) = env.site.glob("doclayout_yolo-*.dist-info/RECORD")
    record.write_bytes(shape(record.read_bytes()))
    pristine = files_under(env.site)
    applied = env.cli("apply", "--only", "doclayout-yolo")
    assert applied.returncode == 0, applied.stderr
    assert record.read_bytes() != pristine[str(record.relative_to(env.site))]
    reverted = env.cli("revert")
    assert reverted.returncode == 0, reverted.stderr
    assert files_under(env.site) == pristine
    assert not env.state.exists()


# ---------------------------------------------------------------------------- item 4


def test_apply_refuses_a_target_folder_that_links_out(
    doclayout_env: Callable[[str], InstalledEnv],
) -> None:
    env = doclayout_env("0.0.4")
    modules = env.target.parent
    outside = env.root.parent / "outside-modules"
    modules.rename(outside)
    modules.symlink_to(outside)
    before = files_under(outside)
    site_before = files_under(env.site)
    result = env.cli("apply", "--only", "doclayout-yolo")
    assert result.returncode == 1
    line = _one_error_line(result.stderr)
    assert "nothing was changed" in line and "link out of the environment" in line, line
    assert files_under(outside) == before
    assert files_under(env.site) == site_before
    assert not env.state.exists() or not (env.state / "manifest.json").exists()


def test_a_folder_linked_out_after_a_killed_apply_is_not_blamed_on_the_journal(
    doclayout_env: Callable[[str], InstalledEnv],
) -> None:
    env = doclayout_env("0.0.4")
    killed = env.cli(
        "apply",
        "--only",
        "doclayout-yolo",
        env={"ROCMFIX_UNSAFE_TEST_HOOKS": json.dumps({"kill_at": 9})},
    )
    assert killed.returncode != 0
    assert json.loads((env.state / "manifest.json").read_text())["pending"] is not None
    modules = env.target.parent
    real = env.root.parent / "moved-modules"
    modules.rename(real)
    modules.symlink_to(real)
    refused = env.cli("revert")
    assert refused.returncode == 1
    line = _one_error_line(refused.stderr)
    assert "linked folder" in line and "journal" not in line, line
    assert "put the real folder back" in refused.stderr
    modules.unlink()
    real.rename(modules)
    restored = env.cli("revert")
    assert restored.returncode == 0, restored.stderr
    assert env.target.read_bytes() == env.original


# ---------------------------------------------------------------------------- share/


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if "__pycache__" not in p.parts}


@pytest.mark.parametrize("point", [1, 2, 3, 4])
def test_a_kill_at_the_first_write_points_leaves_no_share_folder(
    doclayout_env: Callable[[str], InstalledEnv], point: int
) -> None:
    env = doclayout_env("0.0.4")
    assert not (env.root / "share").exists()
    before = _tree(env.root)
    hooks = {"ROCMFIX_UNSAFE_TEST_HOOKS": json.dumps({"kill_at": point})}
    killed = env.cli("apply", "--only", "doclayout-yolo", env=hooks)
    assert killed.returncode != 0
    result = env.cli("revert")
    assert result.returncode == 0, result.stderr
    assert _tree(env.root) == before


# ---------------------------------------------------------------------------- item 3

SYSTEM_PYTHON = Path("/usr/bin/python3")


def _pip_target(folder: Path) -> None:
    wheel = releases.wheel("mineru-vl-utils", "0.1.13")
    pip = (sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile")
    subprocess.run([*pip, "--target", str(folder), str(wheel)], check=True)


def _system_python() -> Path:
    if not SYSTEM_PYTHON.exists():
        pytest.skip("needs a system Python at /usr/bin/python3 with the user site enabled")
    return SYSTEM_PYTHON


def test_the_user_site_keeps_its_own_record(tmp_path: Path) -> None:
    """Targets in the user site get state in the user base, not in the interpreter's prefix
    (/usr/share/rocmfix, which a user cannot write and every other tree would share)."""
    python = _system_python()
    version = subprocess.run(
        [str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    base = tmp_path / "userbase"
    site = base / "lib" / f"python{version}" / "site-packages"
    _pip_target(site)
    target = site / "mineru_vl_utils/vlm_client/vllm_async_engine_client.py"
    original = target.read_bytes()
    system_state = Path("/usr/share/rocmfix")
    existed = system_state.exists()
    env = {"PYTHONUSERBASE": str(base)}
    applied = run_cli("apply", "--only", "mineru-tokenizer", "--python", str(python), env=env)
    assert applied.returncode == 0, applied.stderr
    assert target.read_bytes() != original
    assert (base / "share" / "rocmfix" / "manifest.json").is_file()
    assert system_state.exists() == existed
    reverted = run_cli("revert", "--python", str(python), env=env)
    assert reverted.returncode == 0, reverted.stderr
    assert target.read_bytes() == original
    assert not (base / "share").exists()


def test_a_package_tree_on_pythonpath_is_refused_with_the_reason(tmp_path: Path) -> None:
    python = _system_python()
    tree = tmp_path / "tree"
    _pip_target(tree)
    before = files_under(tree)
    env = {"PYTHONPATH": f"{PYTHONPATH}{os.pathsep}{tree}"}
    result = run_cli("apply", "--only", "mineru-tokenizer", "--python", str(python), env=env)
    assert result.returncode == 1, result.stderr
    line = _one_error_line(result.stderr)
    assert "nothing was changed" in line and "PYTHONPATH" in line, line
    assert files_under(tree) == before
    assert not Path("/usr/share/rocmfix/manifest.json").exists()


def test_a_tree_on_pythonpath_never_reads_the_environments_record(tmp_path: Path) -> None:
    """Two trees under one interpreter: the venv's own site-packages (A, applied) and a
    ``pip install --target`` tree on PYTHONPATH (B) that shadows it. B must not read A's
    record (a false `stale`), and a revert that sees B must not drop A's entry."""
    python = releases.make_venv(tmp_path / "venv")
    releases.pip_install(python, releases.wheel("mineru-vl-utils", "0.1.13"))
    site = releases.site_packages(python)
    rel = "mineru_vl_utils/vlm_client/vllm_async_engine_client.py"
    pristine = files_under(site)
    cli = ("--only", "mineru-tokenizer", "--python", str(python))
    applied = run_cli("apply", *cli)
    assert applied.returncode == 0, applied.stderr
    patched = files_under(site)
    assert patched[rel] != pristine[rel]
    manifest = (tmp_path / "venv/share/rocmfix/manifest.json").read_bytes()
    tree = tmp_path / "tree"
    _pip_target(tree)
    tree_before = files_under(tree)
    shadowed = {"PYTHONPATH": f"{PYTHONPATH}{os.pathsep}{tree}"}
    status = run_cli("status", "--json", *cli, env=shadowed)
    assert status.returncode == 0, status.stderr
    (found,) = [p for p in status.json()["patches"] if p["id"] == "mineru-tokenizer"]
    assert found["verdict"] == "applicable", found
    assert str(tree) in found["path"], found
    reverted = run_cli("revert", *cli, env=shadowed)
    assert reverted.returncode == 1, reverted.stderr
    line = _one_error_line(reverted.stderr)
    assert "nothing was changed" in line and str(tree) in line, line
    assert files_under(tree) == tree_before
    assert files_under(site) == patched
    assert (tmp_path / "venv/share/rocmfix/manifest.json").read_bytes() == manifest
    # Without the tree, A's record still reverts A byte for byte.
    reverted = run_cli("revert", *cli)
    assert reverted.returncode == 0, reverted.stderr
    assert files_under(site) == pristine
    assert not (tmp_path / "venv/share").exists()


def _local_tree(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A venv and a site folder of its own base outside it (Debian's /usr/local beside
    /usr)."""
    python = releases.make_venv(tmp_path / "venv")
    site = releases.site_packages(python)
    local = tmp_path / "local"
    tree = local / site.relative_to(tmp_path / "venv")
    _pip_target(tree)
    return python, local, tree


def test_another_site_folder_keeps_a_record_of_its_own_beside_the_prefixs(
    tmp_path: Path,
) -> None:
    """The venv's copy applied (its record under the prefix, current for it), and another
    site folder on PYTHONPATH holding the same release: that folder gets a record of its
    own, and the venv's record is neither read for it nor moved there."""
    python, local, tree = _local_tree(tmp_path)
    releases.pip_install(python, releases.wheel("mineru-vl-utils", "0.1.13"))
    site = releases.site_packages(python)
    pristine, tree_pristine = files_under(site), files_under(tree)
    cli = ("--only", "mineru-tokenizer", "--python", str(python))
    applied = run_cli("apply", *cli)
    assert applied.returncode == 0, applied.stderr
    record = tmp_path / "venv/share/rocmfix/manifest.json"
    manifest = record.read_bytes()
    env = {"PYTHONPATH": f"{PYTHONPATH}{os.pathsep}{tree}"}
    status = run_cli("status", "--json", *cli, env=env)
    assert status.returncode == 0, status.stderr
    (found,) = [p for p in status.json()["patches"] if p["id"] == "mineru-tokenizer"]
    assert found["verdict"] == "applicable", found
    assert run_cli("apply", *cli, env=env).returncode == 0
    assert record.read_bytes() == manifest
    assert (local / "share/rocmfix/manifest.json").is_file()
    assert run_cli("revert", *cli, env=env).returncode == 0
    assert files_under(tree) == tree_pristine and not (local / "share").exists()
    assert record.read_bytes() == manifest
    assert run_cli("revert", *cli).returncode == 0
    assert files_under(site) == pristine


# ---------------------------------------------------------------------------- issue 32 item 10


def test_revert_puts_back_the_bytecode_pip_wrote(tmp_path: Path) -> None:
    python = releases.make_venv(tmp_path / "venv")
    wheel = releases.wheel("mineru-vl-utils", "0.1.13")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
    )
    site = releases.site_packages(python)
    target = site / "mineru_vl_utils/vlm_client/vllm_async_engine_client.py"
    (pyc,) = (target.parent / "__pycache__").glob(f"{target.stem}.*.pyc")
    everything = {str(p.relative_to(site)): p.read_bytes() for p in site.rglob("*") if p.is_file()}
    mtime = target.stat().st_mtime_ns
    cli = ("--only", "mineru-tokenizer", "--python", str(python))
    applied = run_cli("apply", *cli)
    assert applied.returncode == 0, applied.stderr
    assert not pyc.exists(), "the patched module's old bytecode must go"
    reverted = run_cli("revert", *cli)
    assert reverted.returncode == 0, reverted.stderr
    after = {str(p.relative_to(site)): p.read_bytes() for p in site.rglob("*") if p.is_file()}
    assert after == everything
    # Valid again: the source's mtime is the one the bytecode was compiled against.
    assert target.stat().st_mtime_ns == mtime
    header = pyc.read_bytes()
    flags = int.from_bytes(header[4:8], "little")
    if flags == 0:
        assert int.from_bytes(header[8:12], "little") == int(mtime // 10**9) & 0xFFFFFFFF


# ---------------------------------------------------------------------------- item 14

_GROUP, _OWNER, _MEMBER = 61000, 61001, 61002


def _as_user(uid: int, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as another member of the shared group, umask 002, reading everything
    (DAC_READ_SEARCH: this Python lives under /root) and writing only what the group may."""
    return subprocess.run(
        [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={_GROUP}",
            f"--groups={_GROUP}",
            "--inh-caps=+dac_read_search",
            "--ambient-caps=+dac_read_search",
            "sh",
            "-c",
            'umask 002 && exec "$@"',
            "sh",
            sys.executable,
            "-m",
            "rocmfix",
            *args,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": PYTHONPATH, "XDG_CACHE_HOME": "/nonexistent"},
        cwd="/",
        check=False,
    )


def test_a_group_shared_environment_stays_shared() -> None:
    """setgid 2775, umask 002: what one member applies, the owner (or any member) reverts."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv(1) to act as two members of one group")
    top = Path(tempfile.mkdtemp(prefix="rocmfix-group-", dir="/tmp"))
    try:
        top.chmod(0o755)
        # A copied interpreter: the other users may not execute this one under /root.
        python = conda_like_prefix(top / "env")
        releases.pip_install(python, releases.wheel("mineru-vl-utils", "0.1.13"))
        root = top / "env"
        shutil.rmtree(root / "share")  # conda ships one; this test is about making it
        for path in [root, *root.rglob("*")]:
            os.lchown(path, _OWNER, _GROUP)
            if path.is_symlink():
                continue
            mode = stat.S_IMODE(path.stat().st_mode)
            path.chmod((mode | 0o2070) if path.is_dir() else (mode | 0o060))
        before = files_under(root)
        applied = _as_user(_MEMBER, "apply", "--python", str(python))
        assert applied.returncode == 0, applied.stderr
        state = root / "share" / "rocmfix"
        for folder in (root / "share", state):
            info = folder.stat()
            assert info.st_gid == _GROUP, folder
            assert info.st_mode & stat.S_ISGID and info.st_mode & 0o020, oct(info.st_mode)
        reverted = _as_user(_OWNER, "revert", "--python", str(python))
        assert reverted.returncode == 0, reverted.stderr
        assert files_under(root) == before
        assert not state.exists()
    finally:
        shutil.rmtree(top, ignore_errors=True)
