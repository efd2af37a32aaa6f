"""Hostile round three, ``rocmfix profile`` (issue 39; issue 43's items 5 and 6): an ``--out``
folder someone else planted links in, signals to rocmfix while the command runs, string
padding, an expanded input, a command that drops the profiler, and a run with nothing to
profile. Each through the real CLI, as the defect was reported."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import NO_GPU, PYTHONPATH, run_cli

PY = sys.executable

MODEL = r"""
import torch, torch.nn as nn
torch.set_num_threads(1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.even = nn.Conv2d(8, 8, 4, padding="same")  # total 3: torch pads the far side more
        self.odd = nn.Conv2d(8, 8, 3, padding="same", dilation=2)
        self.valid = nn.Conv2d(8, 8, 3, padding="valid")
        self.wide = nn.Conv2d(8, 16, 3, padding=1)

    def forward(self, x):
        y = self.valid(self.odd(self.even(x)))
        # An expanded input (stride 0 along H): one row seen 64 times.
        return self.wide(y[:, :, :1, :].expand(-1, -1, 64, -1))


net = Net().eval()
with torch.no_grad():
    for _ in range(4):
        net(torch.randn(1, 8, 96, 96))
"""


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def _split(stdout: str) -> dict[str, Any]:
    start = stdout.index('{\n  "schema"')
    document: dict[str, Any] = json.loads(stdout[start:])
    return document


@pytest.fixture(scope="module")
def model_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path]:
    """One profiled run of MODEL with --json and --out, into a folder of this user's where
    profile.json was planted as a link to a file that must not change."""
    tmp = tmp_path_factory.mktemp("model")
    script = tmp / "job.py"
    script.write_text(MODEL)
    out = tmp / "out"
    out.mkdir(mode=0o700)
    victim = tmp / "victim"
    victim.write_text("not rocmfix's\n")
    (out / "profile.json").symlink_to(victim)
    result = run_cli("profile", "--json", "--top", "8", "--out", str(out), "--", PY,
                     str(script), timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result, out, victim


# ------------------------------------------------------------- 39.1 and 39.4: --out DIR


def test_out_writes_nothing_through_a_link_planted_in_it(model_run: tuple[Any, Path, Path]) -> None:
    """profile.json was written with open(), through a link planted at its name."""
    result, out, victim = model_run
    assert victim.read_text() == "not rocmfix's\n"
    written = out / "profile.json"
    assert not written.is_symlink() and json.loads(written.read_text())["schema"]
    assert _split(result.stdout)["files"], "no trace was copied"


def _plant(tmp_path: Path, case: str) -> Path:
    out = tmp_path / "out"
    if case == "another user's folder":
        out.mkdir(mode=0o755)
        os.chown(out, 65534, 65534)
    elif case == "a folder others can write":
        out.mkdir()
        out.chmod(0o777)
    elif case == "a dangling link":
        out.symlink_to(tmp_path / "nowhere")
    elif case == "a link to this user's folder":
        (tmp_path / "mine").mkdir(mode=0o700)
        out.symlink_to(tmp_path / "mine")
    elif case == "a file":
        out.write_text("")
    elif case == "an uncreatable path":
        (tmp_path / "file").write_text("")
        out = tmp_path / "file" / "out"
    elif case == "under a folder others can write":
        (tmp_path / "open").mkdir()
        (tmp_path / "open").chmod(0o777)  # no sticky bit: another user can rename "out"
        out = tmp_path / "open" / "out"
        out.mkdir(mode=0o700)
    elif case == "under another user's folder":
        (tmp_path / "theirs").mkdir(mode=0o755)
        os.chown(tmp_path / "theirs", 65534, 65534)
        out = tmp_path / "theirs" / "out"
    elif case == "through another user's link":
        (tmp_path / "mine").mkdir(mode=0o700)
        (tmp_path / "via").symlink_to(tmp_path / "mine")
        os.lchown(tmp_path / "via", 65534, 65534)
        out = tmp_path / "via" / "out"
    return out


@pytest.mark.parametrize(
    "case",
    [
        "another user's folder",
        "a folder others can write",
        "a dangling link",
        "a link to this user's folder",
        "a file",
        "an uncreatable path",
        "under a folder others can write",
        "under another user's folder",
        "through another user's link",
    ],
)
def test_an_out_folder_others_could_plant_links_in_is_refused_before_the_command_runs(
    tmp_path: Path, case: str
) -> None:
    """An existing --out was accepted whoever owned it, and a bad one was found only after the
    command had run (hours, for a real job): exit 1 and an unrelated hint."""
    if "another user's" in case and os.geteuid() != 0:
        pytest.skip("needs root to give a folder to another user")
    out = _plant(tmp_path, case)
    mark = tmp_path / "ran"
    result = run_cli("profile", "--out", str(out), "--", "sh", "-c", f"touch {mark}")
    assert result.returncode == 2, result.stderr
    assert len(_errors(result.stderr)) == 1 and "--out" in _errors(result.stderr)[0]
    assert not mark.exists(), "the command ran before --out was checked"
    assert not (tmp_path / "nowhere").exists()
    if (tmp_path / "mine").exists():
        assert not any((tmp_path / "mine").iterdir())


def test_a_new_out_folder_is_made_private_and_a_private_one_is_used(tmp_path: Path) -> None:
    # Under a sticky folder others can write (as /tmp is), no one else can rename the entries.
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared").chmod(0o1777)
    new = tmp_path / "shared" / "a" / "b"
    assert run_cli("profile", "--out", str(new), "--", "true").returncode == 0
    assert new.is_dir() and new.stat().st_mode & 0o077 == 0
    assert run_cli("profile", "--out", str(new), "--", "true").returncode == 0


def test_an_out_folder_opened_to_others_during_the_run_is_a_note_not_a_lost_report(
    tmp_path: Path,
) -> None:
    """Checked again after the command (it may have run for hours): a refusal then must not
    take the report and the command's exit code with it."""
    out = tmp_path / "out"
    result = run_cli("profile", "--out", str(out), "--", "sh", "-c", f"chmod 777 {out}; exit 4")
    assert result.returncode == 4, result.stderr
    assert not _errors(result.stderr) and "nothing was written there" in result.stderr
    assert not any(out.iterdir())


# ------------------------------------------------------------------------ 39.3: signals

GRANDCHILD = r"""
import subprocess, sys
child = subprocess.Popen(["sleep", "300"])
open(sys.argv[1], "w").write(str(child.pid))
child.wait()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_to_rocmfix_reaches_the_command_and_its_exit_code_is_the_commands(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """SIGTERM to rocmfix (timeout, a cancelled CI job, systemd) left the command running under
    init and the private rocmfix-profile-* folder behind; SIGINT did not reach it at all."""
    temp, cwd = tmp_path / "tmp", tmp_path / "cwd"
    temp.mkdir()
    cwd.mkdir()
    pidfile = tmp_path / "pid"
    proc = subprocess.Popen(
        [PY, "-m", "rocmfix", "profile", "--", PY, "-c", GRANDCHILD, str(pidfile)],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": PYTHONPATH, "TMPDIR": str(temp), **NO_GPU},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own group: the signal goes to rocmfix alone
    )
    grandchild = 0
    try:
        deadline = time.monotonic() + 60
        while not pidfile.exists() or not pidfile.read_text():
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.1)
        grandchild = int(pidfile.read_text())
        proc.send_signal(signum)
        _out, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + signum, err
        time.sleep(0.3)
        assert not _alive(grandchild), "the command's child was left running"
        assert not list(temp.glob("rocmfix-profile-*")), "the private folder was left behind"
        # (A Python command's own KeyboardInterrupt traceback is its own output.)
        assert not _errors(err.decode()) and b"bug in rocmfix" not in err, err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if grandchild and _alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_at_a_terminal_the_command_has_it_and_ctrl_c_ends_the_command() -> None:
    """In a process group of its own, the command is still the terminal's foreground job: it
    reads the terminal (not stopped by SIGTTIN), and Ctrl-C reaches it."""
    import pty
    import select

    script = "print('got', input()); import time; time.sleep(60)"
    pid, fd = pty.fork()
    if pid == 0:  # the child: a new session whose controlling terminal is the pty
        os.environ.update({"PYTHONPATH": PYTHONPATH, **NO_GPU})
        os.execv(PY, [PY, "-m", "rocmfix", "profile", "--", PY, "-c", script])
    seen, status = b"", None
    try:
        deadline = time.monotonic() + 60
        os.write(fd, b"hello\r")
        while status is None and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.2)[0]:
                # EIO once every process on the terminal has closed it.
                with contextlib.suppress(OSError):
                    seen += os.read(fd, 4096)
                if b"got hello" in seen and b"\x03" not in seen:
                    os.write(fd, b"\x03")
                    seen += b"\x03"
            done, raw = os.waitpid(pid, os.WNOHANG)
            status = os.waitstatus_to_exitcode(raw) if done else None
        assert b"got hello" in seen, seen
        assert status == 128 + signal.SIGINT, seen
    finally:
        if status is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)


# ------------------------------------------------------------- 39.5: padding="same"/"valid"


def _convs(model_run: tuple[Any, Path, Path]) -> dict[str, dict[str, Any]]:
    result, _out, _victim = model_run
    doc = _split(result.stdout)
    return {op["modules"][0].split(" ")[0]: op for op in doc["ops"] if op["conv"]}


def test_string_padding_is_recorded_and_used_by_the_analysis(
    model_run: tuple[Any, Path, Path],
) -> None:
    """padding="same" was read as 0: a 96x96 output taken for 93x93 in the FLOP count, the
    replay, the repro and the MIOpenDriver line."""
    convs = _convs(model_run)
    even, odd, valid = convs["even"], convs["odd"], convs["valid"]
    assert even["conv"]["padding_mode"] == "same" and even["conv"]["padding"] == [1, 1]
    assert even["conv"]["pad_far"] == [1, 1]
    assert odd["conv"]["padding_mode"] == "same" and odd["conv"]["padding"] == [2, 2]
    assert odd["conv"]["pad_far"] == [0, 0]
    assert valid["conv"]["padding"] == [0, 0]
    # 96x96 out for "same" (8 out channels, 8 * 4 * 4 per output), 94x94 for "valid".
    assert even["flops"] == 2 * 8 * 96 * 96 * 8 * 4 * 4
    assert valid["flops"] == 2 * 8 * 94 * 94 * 8 * 3 * 3
    for row in (even, odd):
        forms = {f["label"]: f for f in row["forms"]}
        assert "as run" in forms and forms["as run"]["ms"] is not None, row


def test_string_padding_reaches_the_repro_and_the_miopen_line() -> None:
    from rocmfix.profile import analyse
    from rocmfix.profile.model import OpStat

    op = {"name": "aten::conv2d", "shapes": [[1, 8, 96, 96], [8, 8, 4, 4]],
          "concrete": [None, None, None, [1, 1], "same", [1, 1], 1]}  # fmt: skip
    conv = analyse.conv_params(op)
    row = OpStat(key="k", op="conv2d", shapes=((1, 8, 96, 96), (8, 8, 4, 4)),
                 dtypes=("float32",), layout="contiguous", conv=conv, calls=2, total_ms=2.0,
                 first_ms=1.0, steady_ms=1.0, share=1.0, flops=None, bytes=None, tflops=None,
                 gbps=None, roofline=None, modules=(), source=None, kernels=(),
                 pids=(1,))  # fmt: skip
    repro = analyse.repro(row, "cpu", {})
    assert "padding='same'" in repro and "far side one more" in repro
    scope: dict[str, Any] = {}
    exec(repro.replace("range(10)", "range(1)"), scope)
    assert tuple(scope["y"].shape) == (1, 8, 96, 96)
    # MIOpen gets the input torch padded on the far side: 97x97, padding 1.
    assert "-H 97 -W 97 " in str(analyse.miopen_driver(row))
    assert " -p 1 -q 1 " in str(analyse.miopen_driver(row))


# ------------------------------------------------------------- 39.9: an expanded input


def test_an_expanded_input_is_replayed_as_the_expanded_view_it_was(
    model_run: tuple[Any, Path, Path],
) -> None:
    """empty_strided with a 0 stride, then normal_(): the replay of the call as it ran failed
    ("more than one element of the written-to tensor refers to a single memory location")."""
    wide = _convs(model_run)["wide"]
    assert wide["layout"] == "strided"
    forms = {f["label"]: f for f in wide["forms"]}
    assert forms["as run"]["error"] is None and forms["as run"]["ms"] is not None, forms


# ------------------------- 39.7 and 43.5: what a run with nothing to profile says, and how


def test_a_command_with_no_python_is_a_note_not_an_error() -> None:
    result = run_cli("profile", "--", "true")
    assert result.returncode == 0
    assert not _errors(result.stderr), result.stderr
    assert "note: nothing to profile" in result.stderr
    assert "did not load" in result.stderr and "imported torch" not in result.stderr


def test_torch_imported_but_no_module_run_says_so() -> None:
    result = run_cli("profile", "--", PY, "-c", "import torch; torch.ones(2) + 1", timeout=300)
    assert result.returncode == 0 and not _errors(result.stderr), result.stderr
    assert "imported torch and ran no nn.Module" in " ".join(result.stderr.split()), result.stderr


def test_a_child_the_profiler_cannot_see_is_not_said_to_have_skipped_torch() -> None:
    """A wrapper ran with the profiler; its `python -I` child imported torch unseen: the report
    said that no process imported torch."""
    child = "import subprocess, sys; subprocess.run([sys.executable, '-I', '-c', 'import torch'])"
    result = run_cli("profile", "--", PY, "-c", child, timeout=300)
    said = " ".join(result.stderr.split())
    assert result.returncode == 0 and not _errors(result.stderr), result.stderr
    assert "no process" not in said and "1 Python process of" in said, said
    assert "none imported torch (a Python that ignores PYTHONPATH" in said, said


@pytest.mark.parametrize(
    "command",
    [
        ["env", "PYTHONPATH=/nonexistent", PY, "-c", "import torch"],
        [PY, "-I", "-c", "import torch"],
        [PY, "-W", "ignore", "-S", "-c", "pass"],
    ],
    ids=["env-PYTHONPATH", "python-I", "python-S"],
)
def test_a_command_that_drops_the_profiler_is_named_before_it_runs(command: list[str]) -> None:
    """The command's own PYTHONPATH (or -I/-S) dropped the shim, and the report said that no
    process imported torch: false, and no word of why."""
    result = run_cli("profile", "--", *command, timeout=300)
    assert result.returncode == 0 and not _errors(result.stderr), result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith("warning: rocmfix's profiler will not load"), result.stderr
    assert "no process" not in result.stderr and "did not load" in result.stderr


@pytest.mark.parametrize(
    ("command", "named"),
    [
        (["python", "job.py"], []),
        (["python3.11", "-W", "error", "-X", "dev", "job.py"], []),
        (["python", "-c", "x", "-I"], []),  # -I is the program's argument there
        (["python", "-WerrorI", "job.py"], []),  # "errorI" is -W's value
        (["python", "-IS", "job.py"], ["-I", "-S"]),
        (["/usr/bin/python3", "-W", "error", "-E", "job.py"], ["-E"]),
        (["env", "A=1", "PYTHONPATH=x", "python", "job.py"], ["env PYTHONPATH="]),
        (["env", "--unset", "PYTHONPATH", "python", "job.py"], ["env -u"]),
        (["env", "-i", "python", "job.py"], ["env -i"]),
        (["env", "A=1", "-i", "job"], []),  # "-i" is the command there
        (["env", "-C", "/tmp", "python", "-I", "job.py"], ["-I"]),
        (["sh", "-c", "python -I job.py"], []),  # inside a script: known only afterwards
    ],
)
def test_the_command_lines_that_drop_the_profiler_are_read_as_python_and_env_read_them(
    command: list[str], named: list[str]
) -> None:
    from rocmfix.profile.launch import shim_blockers

    found = shim_blockers(command)
    assert len(found) == len(named), found
    for why, flag in zip(found, named, strict=True):
        assert flag in why, found


# ------------------------------------------------------------- 43.6: a clean JSON file


def test_json_help_names_the_way_to_a_file_of_json_alone() -> None:
    result = run_cli("profile", "--help")
    assert "DIR/profile.json" in " ".join(result.stdout.split()), result.stdout


_MM = {"name": "aten::mm", "shapes": [[2, 2], [2, 2]], "cpu_us": 1.0, "device_us": 0.0}


def _profile_event_file(body: dict[str, Any]) -> Any:
    write = (
        "import json, os; open(os.path.join(os.environ['ROCMFIX_PROFILE_DIR'], 'events-1.json'),"
        f" 'w').write(json.dumps({body!r}))"
    )
    return run_cli("profile", "--", PY, "-c", write)


@pytest.mark.parametrize(
    "body",
    [
        {"ops": [{"name": "aten::mm", "shapes": [], "cpu_us": 1.0, "device_us": "x"}]},
        {"ops": [{"name": "aten::mm", "shapes": [["a"], [2, 2]], "cpu_us": 1.0, "device_us": 0.0}]},
        {"ops": [{"name": "aten::mm", "shapes": [3], "cpu_us": 1.0, "device_us": 0.0}]},
        {"ops": [_MM], "pid": "x"},
        {"ops": [_MM], "ppid": None},
        {"ops": [_MM], "argv": 5},
        {"ops": [_MM], "backend": [1, 2]},
    ],
)
def test_an_event_file_with_an_op_out_of_shape_is_skipped_not_a_traceback(
    body: dict[str, Any],
) -> None:
    """The event files are the user's processes' data: an op whose device time is a string
    took the collection down with a TypeError before the ops were checked, one whose shapes
    are not lists of numbers the analysis, and a process field of another type (a pid that is
    not a number, an argv that is not a list) the collection."""
    result = _profile_event_file(body)
    assert result.returncode == 0 and not _errors(result.stderr), result.stderr
    assert "Traceback" not in result.stderr and "nothing to profile" in result.stderr


# A device time makes the run a GPU one, whose kernels come from the op's "kernels"; a CPU
# run's from its "leaves".
@pytest.mark.parametrize("extra", [{"kernels": {"k": "x"}, "device_us": 1.0}, {"leaves": [[1]]}])
def test_an_ops_kernels_out_of_shape_are_read_as_nothing_not_a_traceback(
    extra: dict[str, Any],
) -> None:
    result = _profile_event_file({"ops": [{**_MM, **extra}]})
    assert result.returncode == 0 and not _errors(result.stderr), result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
