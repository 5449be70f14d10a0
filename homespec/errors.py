"""homespec's exception hierarchy.

Every error a user can cause is a `HomespecError`: it carries *what* went wrong and *what to do*,
and the CLI prints it as ``Error: <what> — <what to do>`` with a non-zero exit, no traceback.
Anything else escaping is a bug and keeps its traceback.

    HomespecError
    ├── ConfigError          models.toml is missing, unreadable or invalid
    ├── ModelFileError       a model file is missing, not GGUF, truncated or fails its sha256
    ├── IncompatiblePairError  target and draft cannot speculate together (names the rule)
    ├── OutOfMemoryError     no arrangement of the pair fits the memory there is (says how much)
    ├── RequestError         a request cannot be served as asked (e.g. prompt over the context)
    ├── EngineError          llama.cpp refused to load a model, create a context or decode
    │   └── EngineCrashed    the pair's engine process died (segfault, abort, OOM kill)
    └── SetupError           getting or deriving a demo model failed
"""

from __future__ import annotations


class HomespecError(Exception):
    """Base class: a problem the user can fix, with a hint saying how."""

    exit_code = 1

    def __init__(self, what: str, hint: str = "") -> None:
        super().__init__(what)
        self.what = what
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.what} — {self.hint}" if self.hint else self.what


class ConfigError(HomespecError):
    exit_code = 2


class ModelFileError(HomespecError):
    exit_code = 2


class IncompatiblePairError(HomespecError):
    exit_code = 2


class OutOfMemoryError(HomespecError):
    exit_code = 2


class RequestError(HomespecError):
    exit_code = 2


class EngineError(HomespecError):
    exit_code = 1


class SetupError(HomespecError):
    exit_code = 1


class EngineCrashed(EngineError):
    """A pair's engine process died (a native crash, an out-of-memory kill) mid-request."""
