"""Replay the hot ops in the target interpreter, each under a time limit (a MIOpen search or a
native kernel that takes minutes is killed, not waited on): :mod:`rocmfix.guest.profile_replay`
through :mod:`rocmfix.supervise`'s worker loop."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rocmfix import guest, supervise
from rocmfix._resources import data_dir

REPLAY_LIMIT_S = 120.0
_MAX_RESTARTS = 8


@dataclass
class Replayed:
    device_name: str | None = None
    calibration: dict[str, Any] | None = None
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    fatal: str | None = None


def run(
    python: str,
    items: Sequence[Mapping[str, Any]],
    device: str,
    backend: Mapping[str, Any],
    limit_s: float = REPLAY_LIMIT_S,
) -> Replayed:
    out = Replayed()
    outcome = supervise.WorkerRun()
    finished: set[str] = set()
    ids = {"calibrate", *(str(i["id"]) for i in items)}

    def on_event(event: dict[str, Any]) -> None:
        if event.get("event") == "hello":
            out.device_name = str(event.get("device") or "") or None
        elif event.get("event") == "item":
            if event.get("id") == "calibrate":
                if event.get("status") == "ok":
                    out.calibration = event
            else:
                out.results[str(event.get("id"))] = event

    # SIGTERM/SIGINT to rocmfix kill the worker's group first: it runs in a session of its
    # own, holding the GPU, and would outlive a `timeout` or a cancelled CI job.
    with supervise.forwarding():
        for _attempt in range(_MAX_RESTARTS):
            request = {
                "device": device,
                "backend": dict(backend),
                "ops": list(items),
                "templates": str(data_dir("templates")),
                "skip": sorted(finished),
            }
            encoded = base64.b64encode(json.dumps(request).encode("utf-8")).decode("ascii")
            ended, _current = supervise.one_worker(
                guest.command(python, "profile_replay", encoded),
                lambda _item: limit_s,
                on_event,
                max(limit_s, 300.0),
                outcome,
                finished,
            )
            if ended or outcome.fatal is not None or finished >= ids:
                break
    out.fatal = outcome.fatal
    return out
