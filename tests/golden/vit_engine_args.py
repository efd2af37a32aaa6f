"""Written for rocmfix's tests: engine arguments that take the tower's backend."""

from dataclasses import dataclass


@dataclass
class EngineArgs:
    model: str = ""
    mm_encoder_attn_backend: str | None = None
