"""What ``doctor``, ``tune`` and ``kernels`` share about the worker they run in the target
interpreter (:mod:`rocmfix.guest.worker`): the request every run starts from, the worker's
answer parsed once as it arrives (:mod:`rocmfix.guest.protocol`), the device it reports, and
the errors for a worker that never started or answered out of protocol."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from . import supervise, tuned_file
from ._resources import data_dir
from .environment import Environment
from .errors import RefusedError
from .guest import protocol
from .ops import Op

# done, total, label: how doctor, tune and kernels report a long run while it goes.
Progress = Callable[[int, int, str], None]
_E = TypeVar("_E", bound=protocol.Event)


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
    :mod:`rocmfix.supervise`), and what went wrong outside any item."""

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
    """Run the worker (:func:`rocmfix.supervise.run`), each event parsed once as it arrives
    and handed to ``listen``. Raises :class:`ProtocolRefusal` for an event out of protocol
    and, with ``need_hello``, :class:`WorkerError` for a worker that never said hello."""
    events: list[protocol.AnyEvent] = []
    hello: list[protocol.Hello] = []

    def on_event(raw: Mapping[str, Any]) -> None:
        try:
            event = protocol.parse_event(raw)
        except protocol.ProtocolError as exc:
            raise ProtocolRefusal(python, exc) from None
        if isinstance(event, protocol.Hello):
            hello.append(event)
        events.append(event)
        listen(event)

    outcome = supervise.run(
        python,
        body.to_json(),
        limit_for=limit_for,
        on_event=on_event,
        item_ids=item_ids,
        idle_limit_s=idle_limit_s,
        env=env,
    )
    answer = Answer(
        hello=hello[0] if hello else None,
        events=tuple(events),
        fatal=outcome.fatal,
        stderr_tail=outcome.stderr_tail,
    )
    if need_hello and answer.hello is None:
        raise WorkerError(python, answer)
    return answer
