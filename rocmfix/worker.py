"""The worker ``doctor``, ``tune``, ``kernels`` and the profile's replay run in the target
interpreter (:mod:`rocmfix.guest.worker`): the request every run starts from, the run held to
its time limits (a child of :mod:`rocmfix.supervise`), the worker's answer parsed once as it
arrives (:mod:`rocmfix.guest.protocol`), the device it reports, and the errors for a worker
that never started or answered out of protocol."""

from __future__ import annotations

import base64
import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, TypeVar

from . import guest, supervise, tuned_file
from ._resources import data_dir
from .environment import Environment
from .errors import RefusedError
from .guest import protocol
from .ops import Op

# done, total, label: how doctor, tune and kernels report a long run while it goes.
Progress = Callable[[int, int, str], None]
_E = TypeVar("_E", bound=protocol.Event)
_EOF = object()
# Importing torch and initialising the GPU happen before the first event.
STARTUP_LIMIT_S = 300.0
_MAX_RESTARTS = 16


def needs_torch(env: Environment, what: str) -> None:
    """Refuse a worker run in an interpreter without torch: there is nothing to ``what``."""
    if env.torch is None:
        raise RefusedError(
            f"torch is not installed in {env.python.executable}: there is nothing to {what}",
            hint="point --python at the interpreter that runs MinerU",
        )


def request(mode: str, ops: Sequence[Op], **extra: Any) -> protocol.Request:
    """What every worker run is told: the ops (as data) and where their templates are."""
    return protocol.Request(
        mode=mode,
        templates_dir=str(data_dir("templates")),
        templates=sorted({s.entry for op in ops for s in op.schemes if s.entry}),
        ops={op.name: op.request() for op in ops},
        tuned_file=str(tuned_file.tuned_path()),
        **extra,
    )


@dataclass(frozen=True)
class Answer:
    """Every event of one worker run (those of the items it could not finish written by
    :func:`run`), and what went wrong outside any item."""

    hello: protocol.Hello | None = None
    events: tuple[protocol.AnyEvent, ...] = ()
    fatal: str | None = None
    stderr_tail: str = ""

    @property
    def device(self) -> protocol.DeviceFacts:
        return self.hello.device if self.hello is not None else protocol.DeviceFacts()

    def of(self, *kinds: type[_E]) -> list[_E]:
        return [e for e in self.events if isinstance(e, kinds)]

    def by_id(self) -> dict[str, protocol.Measured]:
        """Doctor's items by id."""
        return {e.id: e for e in self.of(protocol.Measured)}


class WorkerError(RefusedError):
    """The worker never got as far as saying hello: torch or the GPU would not start."""

    def __init__(self, python: str, answer: Answer) -> None:
        lines = [line for line in answer.stderr_tail.strip().splitlines() if line.strip()]
        super().__init__(
            f"could not start the worker in {python}: {answer.fatal or 'it did not start'}",
            hint=lines[-1][:300] if lines else None,
        )


class ProtocolRefusal(RefusedError):
    """The worker answered something that is not the protocol: nothing it said is used."""

    def __init__(self, python: str, error: protocol.ProtocolError) -> None:
        super().__init__(
            f"the worker in {python} sent a malformed answer: {error}",
            hint="is the rocmfix in that interpreter another version? reinstall rocmfix",
        )


def run(
    python: str,
    body: protocol.Request,
    *,
    limit_for: Callable[[str], float],
    listen: Callable[[protocol.AnyEvent], None] = lambda _event: None,
    item_ids: Sequence[str] = (),
    idle_limit_s: float = 600.0,
    need_hello: bool = True,
    env: Mapping[str, str] | None = None,
) -> Answer:
    """Run the worker until it ends, restarting it after each item it could not finish
    (``item_ids``: every item, to know when none is left). Each event is parsed once as it
    arrives and handed to ``listen``. ``limit_for(item)`` gives an item's time limit in
    seconds, counted from its :class:`~protocol.Start`; ``idle_limit_s`` bounds the wait for
    any event at all; ``env``, where given, is the worker's whole environment.

    Raises :class:`ProtocolRefusal` for an event out of protocol and, with ``need_hello``,
    :class:`WorkerError` for a worker that never said hello."""
    state = _Run(python, limit_for, listen, idle_limit_s)
    with supervise.forwarding():
        for _restart in range(_MAX_RESTARTS + 1):
            encoded = base64.b64encode(
                json.dumps({**body.to_json(), "skip": sorted(state.finished)}).encode("utf-8")
            ).decode("ascii")
            stopped_in = state.one(guest.command(python, "worker", encoded), env)
            # A fresh worker carries on only after an item it was stopped in, while items
            # are left.
            if stopped_in is None or state.fatal is not None:
                break
            if item_ids and state.finished >= set(item_ids):
                break
        else:
            state.fatal = f"the worker was restarted {_MAX_RESTARTS} times; giving up"
    answer = Answer(state.hello, tuple(state.events), state.fatal, state.stderr_tail)
    if need_hello and answer.hello is None:
        raise WorkerError(python, answer)
    return answer


class _Run:
    """One run of the worker across its restarts: its events (those of the items it could not
    finish written here), the items finished, and what went wrong outside any item.

    The worker streams JSON lines, read on a thread so that a deadline can stop the wait. An
    item (one native op, one scheme, one kernel's search) that outlasts its limit is not
    waited on: the worker's whole process group is killed (a GPU library blocked in C cannot
    be interrupted any other way) and a fresh worker carries on with the items left. A worker
    that dies inside an item is handled the same way, once per item. Lines that are not JSON
    objects (a library printing to the pipe) are skipped."""

    def __init__(
        self,
        python: str,
        limit_for: Callable[[str], float],
        listen: Callable[[protocol.AnyEvent], None],
        idle_limit_s: float,
    ) -> None:
        self.python = python
        self.limit_for = limit_for
        self.listen = listen
        self.idle_limit_s = idle_limit_s
        self.hello: protocol.Hello | None = None
        self.events: list[protocol.AnyEvent] = []
        self.finished: set[str] = set()
        self.fatal: str | None = None
        self.stderr_tail = ""

    def seen(self, event: protocol.AnyEvent) -> None:
        if isinstance(event, protocol.Hello) and self.hello is None:
            self.hello = event
        self.events.append(event)
        self.listen(event)

    def stopped(self, event: protocol.Measured) -> str:
        """The item the worker was stopped in, written as the item event it never sent."""
        self.seen(event)
        self.finished.add(event.id)
        return event.id

    def one(self, argv: list[str], env: Mapping[str, str] | None) -> str | None:
        """One worker process held to its limits; the item it was stopped in, if any."""
        with tempfile.TemporaryFile() as errors:
            try:
                proc = supervise.start(
                    argv, stdout=subprocess.PIPE, stderr=errors, stdin=subprocess.DEVNULL, env=env
                )
            except OSError as exc:
                self.fatal = f"cannot run {argv[0]}: {exc.strerror or exc}"
                return None
            assert proc.stdout is not None
            lines: queue.Queue[object] = queue.Queue()
            thread = threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True)
            thread.start()
            try:
                return self._follow(proc, lines, errors)
            finally:
                supervise.stop(proc)
                thread.join(timeout=5)
                proc.stdout.close()

    def _follow(
        self, proc: subprocess.Popen[bytes], lines: queue.Queue[object], errors: IO[bytes]
    ) -> str | None:
        current: str | None = None
        started = 0.0
        first_ms: float | None = None
        last = time.monotonic()
        limit = STARTUP_LIMIT_S
        while True:
            now = time.monotonic()
            wait = (started + limit - now) if current is not None else (last + limit - now)
            wait = min(wait, last + self.idle_limit_s - now)
            try:
                raw = lines.get(timeout=max(0.0, wait))
            except queue.Empty:
                supervise.stop(proc)
                if current is not None:
                    return self.stopped(
                        protocol.Measured(current, "timeout", first_ms=first_ms, limit_s=limit)
                    )
                self.fatal = (
                    f"the worker sent nothing for {limit:.0f} s"
                    if self.hello is None
                    else f"the worker stopped answering for {self.idle_limit_s:.0f} s"
                )
                self.stderr_tail = _tail(errors)
                return None
            if raw is _EOF:
                code = proc.wait()
                self.stderr_tail = _tail(errors)
                if current is not None:
                    return self.stopped(
                        protocol.Measured(
                            current,
                            "crashed",
                            message=f"the worker died ({_exit_reason(code)}) inside this item",
                        )
                    )
                if self.fatal is None:
                    self.fatal = f"the worker ended early ({_exit_reason(code)})"
                return None
            assert isinstance(raw, bytes)
            last = time.monotonic()
            try:
                data = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(data, dict):
                continue
            try:
                event = protocol.parse_event(data)
            except protocol.ProtocolError as exc:
                raise ProtocolRefusal(self.python, exc) from None
            if isinstance(event, protocol.Start):
                current, started, first_ms = event.id, last, None
                limit = self.limit_for(current)
            elif isinstance(event, protocol.First):
                first_ms = event.ms
            elif isinstance(event, protocol.Measured | protocol.Tuned):
                self.finished.add(event.id)
                current, limit = None, self.idle_limit_s
            elif isinstance(event, protocol.Hello):
                limit = self.idle_limit_s
            elif isinstance(event, protocol.Fatal):
                self.fatal = event.message
                if event.traceback:
                    self.stderr_tail = event.traceback[-3000:]
            self.seen(event)
            if isinstance(event, protocol.End):
                proc.wait()
                return None


def _reader(stream: IO[bytes], lines: queue.Queue[object]) -> None:
    for raw in stream:
        lines.put(raw)
    lines.put(_EOF)


def _tail(handle: IO[bytes], limit: int = 3000) -> str:
    handle.seek(0, os.SEEK_END)
    size = handle.tell()
    handle.seek(max(0, size - limit))
    return handle.read().decode("utf-8", "replace")


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"
