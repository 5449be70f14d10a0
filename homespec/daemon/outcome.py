"""How a request ended (the log line and the metrics), and the engine's errors as the daemon's."""

from __future__ import annotations

from dataclasses import dataclass

from homespec import errors
from homespec.engine.protocol import Failure
from homespec.engine.types import GenerationStats
from homespec.errors import HomespecError


@dataclass
class Outcome:
    """How a request ended, for the log and the metrics."""

    stats: GenerationStats | None
    status: str  # ok | cancelled | error | engine_crashed (| refused: counted, not logged)
    error: str = ""
    signal: str = ""  # engine_crashed: the signal that ended the engine
    sent: int = 0  # answer tokens the client was sent before it left


def raise_failure(f: Failure) -> None:
    """Raise the engine's error as the daemon's own exception class (errors.py)."""
    cls = getattr(errors, f.kind, None)
    if not (isinstance(cls, type) and issubclass(cls, HomespecError)):
        cls = errors.EngineError
    raise cls(f.what, f.hint)
