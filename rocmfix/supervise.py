"""Every child rocmfix starts, and the signals that must reach it. Nothing here prints.

Every child rocmfix starts in a target interpreter runs from ``/`` in a session of its own
(:func:`capped` for the short ones: the probe, the compile check; :func:`start` for the
worker, which :mod:`rocmfix.worker` holds to its time limits), so that a SIGTERM or
SIGINT to rocmfix would not reach it: :func:`forwarding` kills those groups first, then lets
the signal do what it would have done.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import IO, Any

# The process groups of the children running now, for a signal handler to kill.
_LIVE: set[int] = set()
_FORWARDED = (signal.SIGTERM, signal.SIGINT)


# While a child is being started: the signals that arrived meanwhile, handled once it is
# registered (see start).
_HOLDING: list[bool] = [False]
_HELD: list[int] = []


def _kill_live(signum: int, frame: FrameType | None) -> None:
    if _HOLDING[0]:
        _HELD.append(signum)
        return
    for group in list(_LIVE):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    _LIVE.clear()
    # Then what the signal would have done without us: end rocmfix (SIGTERM) or raise
    # KeyboardInterrupt (SIGINT), so the exit status still says which signal it was.
    handler = _PREVIOUS.get(signum, signal.SIG_DFL)
    signal.signal(signum, handler)
    if callable(handler):
        handler(signum, frame)
    else:
        os.kill(os.getpid(), signum)


_PREVIOUS: dict[int, Any] = {}


@contextlib.contextmanager
def _handling(
    signums: Sequence[int], handler: Callable[[int, FrameType | None], None]
) -> Iterator[dict[int, Any]]:
    """While inside, ``handler`` handles ``signums`` (yields the handlers it replaced). A
    signal rocmfix was started to ignore (nohup) stays ignored, for the children too; off the
    main thread, where no handler can be set, nothing changes."""
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in signums:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                previous[signum] = signal.signal(signum, handler)
    try:
        yield previous
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


@contextlib.contextmanager
def forwarding() -> Iterator[None]:
    """While inside, SIGTERM and SIGINT kill the children's groups before they act."""
    if _PREVIOUS:  # another forwarding() holds the handlers
        yield
        return
    with _handling(_FORWARDED, _kill_live) as previous:
        _PREVIOUS.update(previous)
        try:
            yield
        finally:
            _PREVIOUS.clear()


# What a user's stop request can be: a terminal's Ctrl-C, `timeout`/`kill`, a closed terminal.
_PASSED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


@dataclass(frozen=True)
class Ran:
    """How the user's command ended: its exit code (128 + N for signal N, as a shell says
    it), and the first signal rocmfix received and passed on to it, if any."""

    code: int
    passed: int | None = None


def run_passing_signals(argv: Sequence[str], env: Mapping[str, str]) -> Ran:
    """Run the user's command, whose output and terminal are its own, in a process group of
    its own, and wait for it. SIGTERM, SIGHUP and SIGINT to rocmfix are passed on to that
    group (unlike :func:`forwarding`, which kills rocmfix's own helpers): the command decides
    how it ends, as it would under a shell. Where rocmfix is the terminal's foreground job, the
    command's group is made the foreground (Ctrl-C and Ctrl-Z reach it; a stopped command
    stops rocmfix too, and `fg` resumes both), and the terminal is taken back afterwards.

    Raises OSError when ``argv[0]`` cannot be run."""
    tty = _foreground_tty()
    received: list[int] = []
    group: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        if group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group[0], signum)

    def child() -> None:  # between fork and exec: system calls only
        os.setpgid(0, 0)
        if tty is not None:
            signal.signal(signal.SIGTTOU, signal.SIG_IGN)
            with contextlib.suppress(OSError):
                os.tcsetpgrp(tty, os.getpid())
            signal.signal(signal.SIGTTOU, signal.SIG_DFL)

    try:
        with _handling(_PASSED, on_signal):
            proc = subprocess.Popen(list(argv), env=dict(env), preexec_fn=child)
            with contextlib.suppress(OSError):
                os.setpgid(proc.pid, proc.pid)  # also here: the signal handler may need it first
            group.append(proc.pid)
            if received:  # arrived while it was being started
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, received[0])
            code = _wait_foreground(proc, tty)
    finally:
        if tty is not None:
            _give_terminal(tty, os.getpgrp())
            os.close(tty)
    return Ran(128 - code if code < 0 else code, received[0] if received else None)


def _foreground_tty() -> int | None:
    """A descriptor on the controlling terminal when this process's group is its foreground."""
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if os.tcgetpgrp(fd) == os.getpgrp():
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _give_terminal(tty: int, pgid: int) -> None:
    # From a background group tcsetpgrp would stop rocmfix with SIGTTOU.
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(tty, pgid)
    finally:
        signal.signal(signal.SIGTTOU, previous)


def _wait_foreground(proc: subprocess.Popen[bytes], tty: int | None) -> int:
    """The command's return code as Popen gives it; a stop (Ctrl-Z) stops rocmfix as well."""
    while True:
        _pid, status = os.waitpid(proc.pid, os.WUNTRACED if tty is not None else 0)
        if tty is not None and os.WIFSTOPPED(status):
            _give_terminal(tty, os.getpgrp())
            os.kill(os.getpid(), signal.SIGSTOP)
            # `fg` continued rocmfix: the command gets the terminal back and goes on too.
            _give_terminal(tty, proc.pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGCONT)
            continue
        proc.returncode = os.waitstatus_to_exitcode(status)
        return proc.returncode


@dataclass(frozen=True)
class Finished:
    """What a child said, at most ``limit`` bytes of each stream; ``returncode`` is None
    when it was killed: it ran past its time (``timed_out``) or said too much."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    overflow: bool = False


def start(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``Popen(argv)`` from ``/`` in a session of its own, its group registered for the signal
    handler, with SIGTERM and SIGINT held meanwhile: handled inside Popen (after the fork) one
    would leave a child nobody kills, and handled before the registration it would kill every
    group but the new one. A signal held here acts once the child is registered."""
    _HOLDING[0] = True
    try:
        proc = subprocess.Popen(argv, cwd="/", start_new_session=True, **kwargs)
        _LIVE.add(proc.pid)
        return proc
    finally:
        _HOLDING[0] = False
        if _HELD:
            signum = _HELD[0]
            _HELD.clear()
            _kill_live(signum, None)


def _feed(stream: IO[bytes], data: bytes) -> None:
    with contextlib.suppress(OSError):
        stream.write(data)
    with contextlib.suppress(OSError):
        stream.close()


def capped(
    argv: Sequence[str], *, timeout: float, limit: int, stdin: bytes | None = None
) -> Finished:
    """Run ``argv`` from ``/`` in a session of its own and collect what it says, bounded in
    time and size; whatever is left of its process group afterwards is killed.

    Raises OSError when ``argv[0]`` cannot be run.
    """
    deadline = time.monotonic() + timeout
    with forwarding():
        proc = start(
            argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            return _collect(proc, deadline, limit, stdin)
        finally:
            stop(proc)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()


def _collect(
    proc: subprocess.Popen[bytes], deadline: float, limit: int, stdin: bytes | None
) -> Finished:
    assert proc.stdout is not None and proc.stderr is not None
    if stdin is not None:
        assert proc.stdin is not None
        threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
    chunks: dict[int, list[bytes]] = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}
    sizes = dict.fromkeys(chunks, 0)
    with selectors.DefaultSelector() as selector:
        for stream in (proc.stdout, proc.stderr):
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return Finished(None, b"", b"", timed_out=True)
            for key, _ in selector.select(timeout=left):
                data = os.read(key.fd, 65536)
                if not data:
                    selector.unregister(key.fileobj)
                    continue
                sizes[key.fd] += len(data)
                if sizes[key.fd] > limit:
                    return Finished(None, b"", b"", overflow=True)
                chunks[key.fd].append(data)
    # Both streams are closed; wait for the exit without reaping, so the group can still be
    # killed by its id (a reaped leader's id could already name another process).
    while True:
        if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            break
        if time.monotonic() >= deadline:
            return Finished(None, b"", b"", timed_out=True)
        time.sleep(0.01)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    code = proc.wait()
    return Finished(
        code, b"".join(chunks[proc.stdout.fileno()]), b"".join(chunks[proc.stderr.fileno()])
    )


def _kill(proc: subprocess.Popen[bytes]) -> None:
    # start_new_session made the worker a group leader: its compile helpers die with it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Unregister a child :func:`start` made and kill its group where it has not ended."""
    _LIVE.discard(proc.pid)
    if proc.returncode is None:
        _kill(proc)
