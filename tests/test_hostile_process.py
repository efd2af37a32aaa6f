"""Hostile round two, the processes and the probe (issue 28): code in the folder rocmfix
runs from, an interpreter that answers with anything at all, output the shell evaluates,
metadata that does not parse, code nested too deep to read, settings out of range, a git
that hangs, and signals that must reach the children rocmfix started.

Each test reproduces the defect as it was reported, with the real CLI in a subprocess and
real environments; one error line and exit 1 where rocmfix must refuse, and nothing left
running or written where it must not be."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import (
    NO_GPU,
    PYTHONPATH,
    InstalledEnv,
    fake_torch,
    files_under,
    measured_vit,
    require,
    run_cli,
)

pytestmark = pytest.mark.network
PATCH = "mineru-tokenizer"


@pytest.fixture
def env(mineru_env: Callable[[str], InstalledEnv]) -> InstalledEnv:
    return mineru_env("0.1.13")


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr and "bug in rocmfix" not in stderr, stderr
    return lines[0]


def _warnings(result_json: dict[str, object]) -> list[str]:
    found = result_json["warnings"]
    assert isinstance(found, list)
    return [str(w["message"]) for w in found]


def _by_id(result_json: dict[str, object], patch: str) -> dict[str, object]:
    patches = result_json["patches"]
    assert isinstance(patches, list)
    return next(p for p in patches if p["id"] == patch)


# ------------------------------------------------- 1: code from the current folder never runs


@pytest.mark.parametrize("module", ["base64", "json"])
def test_a_module_in_the_current_folder_never_runs(
    env: InstalledEnv, tmp_path: Path, module: str
) -> None:
    """The compile check ran ``TARGET -c CODE`` in rocmfix's folder, which put that folder
    first on sys.path: a ``base64.py`` there ran (as root, inside apply)."""
    project = tmp_path / "project"
    project.mkdir()
    ran = tmp_path / "ran"
    (project / f"{module}.py").write_text(
        f"open({str(ran)!r}, 'a').write(__file__ + '\\n')\nraise SystemExit(7)\n"
    )
    # -P: rocmfix itself starts the way its console script does, without the folder on
    # sys.path; what is tested is the children it starts from there.
    done = subprocess.run(
        [sys.executable, "-P", "-m", "rocmfix", "apply", "--python", str(env.python)],
        capture_output=True,
        text=True,
        cwd=project,
        env={**os.environ, "PYTHONPATH": PYTHONPATH, **NO_GPU},
        timeout=300,
        check=False,
    )
    assert not ran.exists(), ran.read_text()
    assert done.returncode == 0, done.stderr
    assert env.status(PATCH)["verdict"] == "applied"


# ------------------------------------------------------ 2: `eval "$(rocmfix env)"` is inert


FLAG = "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"
# Each shell evaluates the script the way the README tells its users to, then prints the flag.
SHELLS = {
    "bash": ["bash", "-c", f'eval "$(cat "$1")"; printf %s "${FLAG}"', "bash"],
    "zsh": ["zsh", "-c", f'eval "$(cat "$1")"; printf %s "${FLAG}"', "zsh"],
    "fish": ["fish", "-c", f"eval (cat $argv[1] | string collect); printf %s ${FLAG}"],
}


@pytest.mark.parametrize("shell", sorted(SHELLS))
def test_env_output_runs_nothing_it_read(env: InstalledEnv, tmp_path: Path, shell: str) -> None:
    """torch's ``__version__`` and the interpreter's path went into ``#`` lines as they
    were: a newline in either was a command the shell ran. Now a control character anywhere
    in the probe's answer refuses it: one error line, nothing on stdout for the shell."""
    require(shutil.which(shell) is not None, f"{shell} is not installed")

    def evaluated(python: Path) -> tuple[Any, str | None]:
        gfx1100 = {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}
        result = run_cli("env", "--shell", shell, "--python", str(python), env=gfx1100)
        if result.returncode != 0:
            return result, None
        script = tmp_path / "script"
        script.write_bytes(result.stdout_bytes)
        done = subprocess.run(
            [*SHELLS[shell], str(script)],
            capture_output=True,
            text=True,
            cwd=tmp_path,  # a command that gets through makes a file here
            env={k: v for k, v in os.environ.items() if k != FLAG},
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return result, done.stdout

    fake_torch(env.site, "2.5.0", hip="6.2")
    measured_vit("2.5.0", "6.2", {"sdpa-aotriton": 4.0})
    # The assignment does what it is for (where doctor measured the flag faster).
    assert evaluated(env.python)[1] == "1"
    version = "2.5.0\ntouch pwned-version\n"
    (env.site / "torch" / "version.py").write_text(
        f"__version__ = {version!r}\nhip = '6.2'\ncuda = None\n"
    )
    # An interpreter whose path holds a newline and a command (outside the venv, so it
    # sees no torch: each of the two is tried on its own).
    odd = tmp_path / "bin\ntouch pwned-path\n"
    odd.mkdir()
    (odd / "python").symlink_to(env.python)
    for python in (env.python, odd / "python"):
        result, flag = evaluated(python)
        assert (result.returncode, flag, result.stdout) == (1, None, ""), result.stderr
        assert "control character" in _one_error_line(result.stderr)
        assert not list(tmp_path.glob("pwned*"))


# --------------------------------------------- 8: one malformed RECORD row, in any dist-info


BAD_ROWS = {
    "blank-line": "flash_attn/__init__.py,,\n\nflash_attn-2.0.0.dist-info/RECORD,,\n",
    "fourth-column": "flash_attn/__init__.py,sha256=abc,12,extra\n",
    "size-not-a-number": "flash_attn/__init__.py,sha256=abc,twelve\n",
}


@pytest.mark.parametrize("record", sorted(BAD_ROWS))
def test_a_malformed_record_row_elsewhere_is_a_warning(env: InstalledEnv, record: str) -> None:
    """One bad row in an unrelated flash-attn made status, apply and revert all fail, with a
    hint that blamed the interpreter."""
    info = env.site / "flash_attn-2.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: flash-attn\nVersion: 2.0.0\n")
    (info / "RECORD").write_text(BAD_ROWS[record])
    status = env.cli("status", "--json")
    assert status.returncode == 0, status.stderr
    doc = status.json()
    assert _by_id(doc, PATCH)["verdict"] == "applicable"
    said = [w for w in _warnings(doc) if "flash-attn" in w]
    assert len(said) == 1 and "RECORD line" in said[0], doc["warnings"]
    assert env.cli("apply").returncode == 0
    revert = env.cli("revert")
    assert revert.returncode == 0, revert.stderr
    assert env.target.read_bytes() == env.original


def test_a_malformed_row_in_the_targets_own_record_is_read_around(env: InstalledEnv) -> None:
    record = next(env.site.glob("mineru_vl_utils-*.dist-info")) / "RECORD"
    record.write_bytes(record.read_bytes() + b"\nnot,a,valid,row\n")
    status = env.cli("status", "--json")
    assert status.returncode == 0, status.stderr
    doc = status.json()
    assert _by_id(doc, PATCH)["verdict"] == "applicable"
    assert any("mineru-vl-utils" in w and "RECORD line" in w for w in _warnings(doc)), doc
    before = record.read_bytes()
    apply = env.cli("apply")
    assert apply.returncode == 0, apply.stderr
    revert = env.cli("revert")
    assert revert.returncode == 0, revert.stderr
    assert env.target.read_bytes() == env.original
    assert record.read_bytes() == before


# ------------------------------------------------- 10: a --python that answers with anything


def _answer(tmp_path: Path) -> dict[str, object]:
    """A well-formed answer for an empty environment under ``tmp_path``."""
    prefix = str(tmp_path / "prefix")
    return {
        "probe": 1,
        "python": {
            "executable": str(tmp_path / "python"),
            "version": "3.11.0",
            "implementation": "cpython",
            "prefix": prefix,
            "base_prefix": prefix,
            "purelib": prefix + "/lib/python3.11/site-packages",
            "platlib": prefix + "/lib/python3.11/site-packages",
        },
        "distributions": {},
        "extras": {},
        "torch": None,
    }


def _fake_python(tmp_path: Path, stdout: str) -> Path:
    """An interpreter that runs Python where rocmfix checks it does (the version check)
    but answers the probe with ``stdout`` (a file, written as it is)."""
    answer = tmp_path / "answer"
    answer.write_text(stdout)
    fake = tmp_path / "python"
    fake.write_text(
        f'#!/bin/sh\ncase "$2" in *version_info*) exec python3 "$@";; esac\nexec cat {answer}\n'
    )
    fake.chmod(0o755)
    return fake


def _hostile(case: str, tmp_path: Path) -> str:
    answer = _answer(tmp_path)
    python = answer["python"]
    assert isinstance(python, dict)
    if case == "deeply-nested":
        return '{"probe": 1, "python": ' + "[" * 100_000 + "]" * 100_000 + "}"
    if case == "integer-version":
        python["version"] = 311
    elif case == "missing-key":
        del python["prefix"]
    elif case == "nul-in-prefix":
        python["prefix"] = str(tmp_path / "pre\0fix")
    elif case == "prefix-is-root":
        python["prefix"] = "/"
    elif case == "relative-prefix":
        python["prefix"] = "prefix"
    elif case == "target-outside-its-folder":
        answer["distributions"] = {
            "mineru-vl-utils": {
                "name": "mineru-vl-utils",
                "version": "0.1.13",
                "dist_info": None,
                "location": str(tmp_path),
                "editable": False,
                "editable_url": None,
                "installer": "pip",
                "record": None,
                "package_roots": [],
                "requires": [],
                "files": {
                    "mineru_vl_utils/vlm_client/vllm_async_engine_client.py": {
                        "path": "/etc/passwd",
                        "root": str(tmp_path),
                        "record_hash": None,
                    }
                },
            }
        }
    elif case == "escape-in-executable":
        # A terminal escape (a colour, a window title) where rocmfix prints the interpreter.
        python["executable"] = "/usr/bin/python\x1b[31m\x1b]0;owned\x07"
    elif case == "newline-in-torch-version":
        answer["torch"] = {"version": "2.5.0\nnext: rm -rf ~", "hip": "6.2", "cuda": None}
    elif case == "torch-version-is-a-list":
        answer["torch"] = {"version": ["2"], "hip": None, "cuda": None}
    elif case == "extras-not-an-object":
        answer["extras"] = []
    return json.dumps(answer)


HOSTILE = [
    "deeply-nested",
    "integer-version",
    "missing-key",
    "nul-in-prefix",
    "prefix-is-root",
    "relative-prefix",
    "target-outside-its-folder",
    "torch-version-is-a-list",
    "extras-not-an-object",
    "escape-in-executable",
    "newline-in-torch-version",
]


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_answer_is_one_line_and_exit_1(tmp_path: Path, case: str) -> None:
    """A deeply nested answer, an integer version, a missing key, a NUL in the prefix gave
    exit 3 ("a bug in rocmfix"); a prefix of / made /share/rocmfix; a terminal escape in the
    interpreter's path reached the terminal raw, and a newline in a version printed a line of
    the answer's own."""
    fake = _fake_python(tmp_path, _hostile(case, tmp_path))
    for command in ("status", "apply"):
        result = run_cli(command, "--python", str(fake))
        assert result.returncode == 1, (command, result.stderr)
        _one_error_line(result.stderr)
        assert "\x1b" not in result.stdout + result.stderr, (command, result.stderr)
    assert not Path("/share/rocmfix").exists()


def test_the_well_formed_answer_of_those_tests_is_read(tmp_path: Path) -> None:
    # The hostile cases above differ from this one only where they say.
    fake = _fake_python(tmp_path, json.dumps(_answer(tmp_path)))
    result = run_cli("status", "--python", str(fake), "--json")
    assert result.returncode == 0, result.stderr


def test_an_answer_too_big_to_be_one_is_cut_off(tmp_path: Path) -> None:
    """800 MB of output took 2.5 GB of memory; the answer is capped, the rest never read."""
    fake = tmp_path / "python"
    fake.write_text(
        '#!/bin/sh\ncase "$2" in *version_info*) exec python3 "$@";; esac\n'
        "exec head -c 800000000 /dev/zero\n"
    )
    fake.chmod(0o755)
    started = time.monotonic()
    done = subprocess.run(
        [
            "sh",
            "-c",
            'ulimit -v 1500000 && exec "$@"',
            "sh",
            sys.executable,
            "-m",
            "rocmfix",
            "status",
            "--python",
            str(fake),
        ],
        capture_output=True,
        text=True,
        cwd="/",
        env={**os.environ, "PYTHONPATH": PYTHONPATH, **NO_GPU},
        timeout=300,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "MiB" in _one_error_line(done.stderr)
    assert time.monotonic() - started < 60


def _alive(marker: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(proc.name))
    return found


def test_a_hanging_probe_leaves_nothing_running(tmp_path: Path) -> None:
    """On a timeout the probe was killed but its children were left behind."""
    marker = f"rocmfix-probe-child-{os.getpid()}-{time.monotonic_ns()}"
    fake = tmp_path / "python"
    fake.write_text(
        '#!/bin/sh\ncase "$2" in *version_info*) exec python3 "$@";; esac\n'
        f"python3 -c 'import time; time.sleep(60)' {marker} >/dev/null 2>&1 &\n"
        "sleep 60\n"
    )
    fake.chmod(0o755)
    try:
        result = run_cli("status", "--python", str(fake), env={"ROCMFIX_PROBE_TIMEOUT": "2"})
        assert result.returncode == 1, result.stderr
        assert "did not answer within 2 s" in _one_error_line(result.stderr)
        time.sleep(0.5)
        assert _alive(marker) == []
    finally:
        for pid in _alive(marker):
            os.kill(pid, signal.SIGKILL)


# ------------------------------------------------ 11: an interpreter that prints at startup


NOISE = {
    "pth": ("zzz_noise.pth", "import sys; print('hello from a .pth file')\n"),
    "sitecustomize": ("sitecustomize.py", "print('hello from sitecustomize')\n"),
}


@pytest.mark.parametrize("kind", sorted(NOISE))
def test_startup_noise_is_a_warning_not_a_failure(env: InstalledEnv, kind: str) -> None:
    """A .pth or sitecustomize that prints made status, apply and revert fail with
    "answered the probe with something that is not JSON"."""
    name, code = NOISE[kind]
    (env.site / name).write_text(code)
    said = code.split("'")[1]
    status = env.cli("status", "--json")
    assert status.returncode == 0, status.stderr
    doc = status.json()
    assert _by_id(doc, PATCH)["verdict"] == "applicable"
    assert [w for w in _warnings(doc) if said in w] != [], doc["warnings"]
    apply = env.cli("apply")
    assert apply.returncode == 0, apply.stderr
    assert (apply.stdout + apply.stderr).count(said) == 1, apply.stdout + apply.stderr
    revert = env.cli("revert")
    assert revert.returncode == 0, revert.stderr
    assert env.target.read_bytes() == env.original


# --------------------------------------------------- 13: ROCMFIX_PROBE_TIMEOUT out of range


@pytest.mark.parametrize("value", ["inf", "nan", "1e400", "1e12", "-5", "0", "abc"])
def test_a_probe_timeout_it_cannot_use_is_named_once(env: InstalledEnv, value: str) -> None:
    """inf, 1e400 and 1e12 gave exit 3; abc and -5 silently became 60."""
    result = env.cli("status", "--json", env={"ROCMFIX_PROBE_TIMEOUT": value})
    assert result.returncode == 0, result.stderr
    said = [w for w in _warnings(result.json()) if "ROCMFIX_PROBE_TIMEOUT" in w]
    assert len(said) == 1 and value in said[0], said


def test_a_probe_timeout_in_range_is_quiet(env: InstalledEnv) -> None:
    result = env.cli("status", "--json", env={"ROCMFIX_PROBE_TIMEOUT": "90"})
    assert result.returncode == 0, result.stderr
    assert not [w for w in _warnings(result.json()) if "ROCMFIX_PROBE_TIMEOUT" in w]


# ------------------------------------------- 18: a signal to rocmfix reaches its worker too


def _workers(python: Path) -> list[int]:
    """The worker processes started in ``python`` (by their command line)."""
    return [pid for pid in _alive(str(python)) if _cmdline_has(pid, b"worker")]


def _cmdline_has(pid: int, word: bytes) -> bool:
    try:
        return word in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


_SIGNAL_IN_POPEN = """
import os, signal, subprocess, sys
from rocmfix import supervise

real = subprocess.Popen


class Popen(real):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        print(self.pid, flush=True)
        # The signal lands while Popen is still running, after the fork: a handler that ran
        # here killed the groups it knew (not this one) and raised out of Popen.
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))


subprocess.Popen = Popen
try:
    with supervise.forwarding():
        supervise.capped([sys.executable, "-c", "import time; time.sleep(60)"], timeout=50,
                         limit=1000)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _child_left(script: str, arg: str) -> tuple[subprocess.CompletedProcess[str], bool]:
    """Run ``script`` (which prints the pid of the child it starts first, then is signalled),
    and whether that child was still running 10 s after it ended (killed here if so)."""
    done = subprocess.run(
        [sys.executable, "-c", script, arg],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
        timeout=60,
        check=False,
    )
    words = done.stdout.split()
    assert words and words[0].isdigit(), (done.stdout, done.stderr[-2000:])
    child = int(words[0])
    deadline = time.monotonic() + 10
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _running(child)
    if left:
        os.kill(child, signal.SIGKILL)
    return done, left


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_a_signal_while_a_child_starts_kills_that_child_too(signum: str) -> None:
    """A signal that arrived while supervise was starting a child (inside Popen, after the
    fork, before the child's group was registered) killed every group but the new one and
    raised out of Popen: the child ran on with nobody to end it (seen as a worker left
    behind by `rocmfix tune` interrupted on a loaded machine)."""
    done, left = _child_left(_SIGNAL_IN_POPEN, signum)
    words = done.stdout.split()
    assert not left, "the child started as the signal came was left running"
    if signum == "SIGINT":
        assert words[1:] == ["interrupted"], (done.stdout, done.stderr[-2000:])
    else:
        assert done.returncode == -signal.SIGTERM


_PROFILE_REPLAY = """
import os, signal, subprocess, sys, threading
from rocmfix.profile import replay

real = subprocess.Popen


class Popen(real):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        print(self.pid, flush=True)
        # What timeout(1) or a CI cancellation sends while the replay worker runs.
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()


subprocess.Popen = Popen
replay.run(sys.argv[1], {}, "cuda", {}, limit_s=50)
"""


def test_a_signal_during_profiles_replay_ends_its_worker(tmp_path: Path) -> None:
    """`rocmfix profile`'s replay ran its worker without forwarding(): the
    worker runs in a session of its own, so a SIGTERM during the replay ended rocmfix and
    left the worker (a GPU process replaying MIOpen searches) running with nobody to end
    it."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexec sleep 60\n")
    fake.chmod(0o755)
    done, left = _child_left(_PROFILE_REPLAY, str(fake))
    assert done.returncode == -signal.SIGTERM
    assert not left, "the replay worker was left running"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
@pytest.mark.parametrize("command", ["doctor", "tune", "kernels"])
def test_a_signal_to_rocmfix_ends_its_worker(
    env: InstalledEnv, command: str, signum: signal.Signals
) -> None:
    """SIGTERM to `rocmfix doctor` (what timeout(1) and CI cancellation send) left its
    worker running with parent 1."""
    fake_torch(env.site, "2.5.0", hip="6.2")
    # A torch whose import never ends: the worker is caught starting up, as on a GPU host
    # whose driver hangs.
    (env.site / "torch" / "__init__.py").write_text("import time\ntime.sleep(120)\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rocmfix", command, "--python", str(env.python)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd="/",
        env={**os.environ, "PYTHONPATH": PYTHONPATH, **NO_GPU},
    )
    try:
        deadline = time.monotonic() + 60
        while not _workers(env.python):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the worker never started"
            time.sleep(0.1)
        proc.send_signal(signum)
        proc.wait(timeout=30)
        time.sleep(0.5)
        assert _workers(env.python) == []
        assert proc.returncode != 0
    finally:
        proc.kill()
        proc.wait()
        for pid in _workers(env.python):
            os.kill(pid, signal.SIGKILL)


# ------------------------------------------------ 12: valid code nested too deep to read


@pytest.mark.parametrize("terms", [400, 20_000])
def test_code_nested_too_deep_reads_as_unsupported(env: InstalledEnv, terms: int) -> None:
    """A 400-term expression (which CPython compiles) gave exit 3 from libcst's recursion;
    20,000 terms ran past 300 s."""
    deep = "DEEP = " + " + ".join(["1"] * terms) + "\n"
    env.target.write_bytes(env.original + deep.encode())
    for command in ("status", "apply"):
        started = time.monotonic()
        result = env.cli(command, "--json" if command == "status" else "--dry-run", timeout=120)
        assert time.monotonic() - started < 60
        assert "bug in rocmfix" not in result.stderr and "Traceback" not in result.stderr
    status = env.cli("status", "--json")
    assert status.returncode == 0, status.stderr
    found = _by_id(status.json(), PATCH)
    assert found["verdict"] == "unsupported", found
    assert "nests more than" in str(found["reason"]), found


# ------------------------------------------------- 17: an editable install whose git hangs


def test_a_hanging_git_holds_status_for_one_time_limit_only(
    transformers_env: Callable[..., InstalledEnv], tmp_path: Path
) -> None:
    """status was silent for 322 s: 16 targets of an editable install, 20 s of git each.
    Now one time limit holds every git call of the run, and stderr says what it waits on."""
    env = transformers_env("5.24.0")
    info = next(env.site.glob("transformers-*.dist-info"))
    # An editable install has no RECORD to check against: git is asked instead.
    (info / "RECORD").unlink()
    (info / "direct_url.json").write_text(
        json.dumps({"url": f"file://{env.site}", "dir_info": {"editable": True}})
    )
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    marker = f"rocmfix-git-{os.getpid()}-{time.monotonic_ns()}"
    (fake / "git").write_text(
        f"#!/bin/sh\nexec python3 -c 'import time; time.sleep(300)' {marker}\n"
    )
    (fake / "git").chmod(0o755)
    try:
        started = time.monotonic()
        result = env.cli(
            "status",
            "--json",
            env={"PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"},
            timeout=120,
        )
        took = time.monotonic() - started
        assert result.returncode == 0, result.stderr
        assert took < 40, took
        # One line says what the wait is, once it is long enough to wonder about.
        said = [line for line in result.stderr.splitlines() if "asking git" in line]
        assert said == ["rocmfix: asking git about 1 editable install (transformers) ..."], (
            result.stderr
        )
        pristine = {p["id"]: p.get("pristine") for p in result.json()["patches"]}
        assert "transformers-qwen2-vl" in pristine
        time.sleep(0.5)
        assert _alive(marker) == []
    finally:
        for pid in _alive(marker):
            os.kill(pid, signal.SIGKILL)


# ------------------------------------------- issue 43: Ctrl-C during apply says what it left


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[0] == "T"


# DocLayout-YOLO's apply: write points 1-8 make the state folder, the backups and the
# journal; 9-24 are the eight dropped modules (two each: before the temporary file, before
# the replace); 25 is g2l_crm.py's, 29-30 the final record's.
@pytest.mark.parametrize(
    ("point", "said"),
    [(7, "before it changed a file"), (25, "the 8 file(s) it had written are rolled back")],
    ids=["journal", "mid-write"],
)
def test_ctrl_c_during_apply_says_what_state_it_left(
    doclayout_env: Callable[[str], InstalledEnv], point: int, said: str
) -> None:
    """Ctrl-C during apply was silent (exit 130, no line), even mid-write, and left the
    written files and the journal for the next run to roll back (issue 43)."""
    env = doclayout_env("0.0.4")
    pristine = files_under(env.site)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rocmfix", "apply", "--python", str(env.python)],
        env={
            **os.environ,
            "PYTHONPATH": PYTHONPATH,
            **NO_GPU,
            "ROCMFIX_UNSAFE_TEST_HOOKS": json.dumps({"pause_at": point}),
        },
        stderr=subprocess.PIPE,
        cwd="/",
    )
    try:
        deadline = time.monotonic() + 120
        while not _stopped(proc.pid):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the run never reached its write point"
            time.sleep(0.05)
        # The dropped modules are in place at the mid-write point: the test stops where it says.
        assert (files_under(env.site) != pristine) == (point == 25)
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends; it acts once the run goes on
        proc.send_signal(signal.SIGCONT)
        stderr = proc.communicate(timeout=60)[1].decode()
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, stderr
    line = _one_error_line(stderr)
    assert "apply was interrupted" in line and said in line, stderr
    assert "the environment is as it was" in line
    assert files_under(env.site) == pristine
    status = env.cli("status", "--json").json()
    assert status["pending"] is None
    assert _by_id(status, "doclayout-dilated-conv")["verdict"] == "applicable"
    assert not env.state.exists(), "a run cut short leaves no state behind"
