"""The CLI in a process of its own, without an interpreter start and imports per call.

Most of the suite's time was `python -m rocmfix` importing typer, rich and libcst before every
one of ~2000 calls. A server process imports ``rocmfix.cli`` once; for each call it forks a
child that takes the call's environment, working directory and standard streams and runs
``rocmfix`` as ``python -m rocmfix`` does (``runpy``, ``sys.exit`` through a normal interpreter
exit, so atexit handlers and thread joins happen). The child is a real process: a fault hook
can kill it, its exit status is the status a subprocess reports (``-9`` for SIGKILL), and
nothing it does reaches the server or the test process.

What an interpreter reads only at its start (``PYTHON*``, the locale) cannot change in a fork:
:func:`usable` sends calls that set those differently to a real ``subprocess.run``.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

# Read by the interpreter (or the C library's locale) when it starts, not when rocmfix runs.
_STARTUP = ("PYTHON", "LC_", "LANG")

_SERVER = r"""
import json, os, runpy, sys
import rocmfix.cli  # the imports every call would make: typer, rich, libcst, the engine

def serve():
    requests = os.fdopen(0, "rb", buffering=0)
    while True:
        line = b""
        while not line.endswith(b"\n"):
            chunk = requests.read(1)
            if not chunk:
                return None
            line += chunk
        call = json.loads(line)
        pid = os.fork()
        if pid == 0:
            return call
        os.write(1, b"%d\n" % pid)
        _, status = os.waitpid(pid, 0)
        os.write(1, b"%d\n" % os.waitstatus_to_exitcode(status))

call = serve()
if call is not None:
    os.setpgid(0, 0)  # a timeout kills the call's whole group
    os.chdir(call["cwd"])
    os.environ.clear()
    os.environ.update(call["env"])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                            (1, call["out"], os.O_WRONLY | os.O_TRUNC),
                            (2, call["err"], os.O_WRONLY | os.O_TRUNC)):
        target = os.open(path, flags)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = ["rocmfix", *call["args"]]
    runpy.run_module("rocmfix", run_name="__main__", alter_sys=True)
"""


class _Server:
    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        # A process forked from this one (a process pool) inherits the list, not the server.
        self.owner = os.getpid()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self.env,
            cwd="/",
        )

    def _line(self, deadline: float | None) -> int:
        assert self.proc.stdout is not None
        line = b""
        while not line.endswith(b"\n"):
            if deadline is not None:
                ready, _, _ = select.select([self.proc.stdout], [], [], deadline)
                if not ready:
                    raise TimeoutError
            chunk = os.read(self.proc.stdout.fileno(), 1)
            if not chunk:
                raise RuntimeError("the CLI fork server exited")
            line += chunk
        return int(line)

    def run(self, args: list[str], env: Mapping[str, str], out: Path, err: Path,
            timeout: float) -> int:  # fmt: skip
        assert self.proc.stdin is not None
        request = {"args": args, "env": dict(env), "cwd": "/", "out": str(out), "err": str(err)}
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        pid = self._line(None)
        try:
            return self._line(timeout)
        except TimeoutError:
            os.killpg(pid, signal.SIGKILL)
            self._line(None)
            raise subprocess.TimeoutExpired(["rocmfix", *args], timeout) from None

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


_lock = threading.Lock()
_idle: list[_Server] = []
_all: list[_Server] = []


def usable(env: Mapping[str, str], base: Mapping[str, str]) -> bool:
    """Whether a forked child can stand for a fresh ``python -m rocmfix`` under ``env``: every
    variable read at interpreter start is as the servers were started with."""
    keys = {k for k in (*env, *base) if k.startswith(_STARTUP)}
    return all(env.get(k) == base.get(k) for k in keys)


def run(args: list[str], env: Mapping[str, str], base: Mapping[str, str], out: Path,
        err: Path, timeout: float) -> int:  # fmt: skip
    """Exit code of ``python -m rocmfix *args`` under ``env``; stdout and stderr to ``out``
    and ``err``. One server per concurrent caller, each started with ``base``."""
    with _lock:
        mine = (s for s in _idle if s.owner == os.getpid() and s.env == dict(base))
        server = next(mine, None)
        if server is not None:
            _idle.remove(server)
    if server is None:
        server = _Server(base)
        with _lock:
            _all.append(server)
    try:
        code = server.run(args, env, out, err, timeout)
    except BaseException:
        with _lock:
            _all.remove(server)
        server.proc.kill()
        raise
    with _lock:
        _idle.append(server)
    return code


@atexit.register
def _close() -> None:
    for server in _all:
        if server.owner != os.getpid():
            continue
        try:
            server.close()
        except Exception:  # noqa: BLE001  # a server that will not exit is killed
            server.proc.kill()
