"""Written for rocmfix's tests: engine arguments from before the tower's backend was one."""

from dataclasses import dataclass


@dataclass
class EngineArgs:
    model: str = ""
