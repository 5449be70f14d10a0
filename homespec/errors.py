"""homespec's exception hierarchy: every exception homespec raises on purpose is here.

Every error a user can cause is a `HomespecError`: it carries *what* went wrong and *what to do*,
and the CLI prints it as ``Error: <what> — <what to do>`` with its `exit_code`, no traceback.
The daemon answers it with its `http_status`, OpenAI error `type` (`openai_type`) and, when
trying again later can work, a `Retry-After` (`retry_after`); the same mapping serves a
streamed response's error event. Anything else escaping is a bug and keeps its traceback.

    HomespecError                                      exit  HTTP  type
    ├── ConfigError          models.toml is missing,      2   500  server_error
    │                        unreadable or invalid
    ├── ModelFileError       a model file is missing,     2   500  server_error
    │                        not GGUF, truncated, bad sha256
    ├── IncompatiblePairError  target and draft cannot    2   500  server_error
    │                        speculate together (names the rule)
    ├── OutOfMemoryError     no arrangement of the pair   2   503  pair_unavailable
    │                        fits the memory there is
    ├── RequestError         a request cannot be served   2   400  invalid_request_error
    │   │                    as asked (prompt over the context…)
    │   └── UnknownModel     no pair by that name         2   404  not_found_error
    ├── EngineError          llama.cpp refused to load,   1   500  server_error
    │   │                    create a context or decode
    │   └── EngineCrashed    the pair's engine process    1   503  engine_crashed
    │                        died (segfault, abort, OOM kill)
    ├── SetupError           getting or deriving a demo   1    —
    │                        model failed
    ├── Unavailable          the daemon cannot take it    1   503
    │   ├── NotReady         a pair is still loading or restarting (server_starting)
    │   ├── PairUnavailable  a pair failed and cannot run (pair_unavailable)
    │   └── QueueFull        max_queue requests wait or run already (server_busy)
    └── DaemonUnavailable    no daemon answers at the URL  1    —   (CLI only)
"""

from __future__ import annotations


class HomespecError(Exception):
    """Base class: a problem the user can fix, with a hint saying how."""

    exit_code = 1
    http_status = 500
    openai_type = "server_error"
    retry_after: int | None = None

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
    http_status = 503
    openai_type = "pair_unavailable"


class RequestError(HomespecError):
    exit_code = 2
    http_status = 400
    openai_type = "invalid_request_error"


class UnknownModel(RequestError):
    http_status = 404
    openai_type = "not_found_error"


class EngineError(HomespecError):
    exit_code = 1


class EngineCrashed(EngineError):
    """A pair's engine process died (a native crash, an out-of-memory kill) mid-request."""

    http_status = 503
    openai_type = "engine_crashed"
    retry_after = 2


class SetupError(HomespecError):
    exit_code = 1


class Unavailable(HomespecError):
    """The daemon cannot take this request now."""

    http_status = 503


class NotReady(Unavailable):
    openai_type = "server_starting"
    retry_after = 5


class PairUnavailable(Unavailable):
    openai_type = "pair_unavailable"


class QueueFull(Unavailable):
    openai_type = "server_busy"
    retry_after = 2

    def __init__(self, pair: str, limit: int) -> None:
        super().__init__(
            f"pair {pair!r} already has {limit} requests waiting or running", "try again shortly"
        )
        self.pair = pair


class DaemonUnavailable(HomespecError):
    exit_code = 1
