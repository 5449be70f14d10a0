"""The manifest's tables about the box rather than a pair: `[server]` (how `homespec serve`
answers), `[memory]` (caps and the serving memory watch) and `[workers.NAME]` (other boxes'
llama.cpp RPC servers); and what every table of the schema shares (`Strict`, `Name`,
`check_size`). The pairs and their models are in manifest.py, which loads the whole file.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from homespec.sizes import parse_size

Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)]


def check_size(field: str, text: str) -> None:
    """A size the schema keeps as text ("6GiB"), checked now with its field named."""
    try:
        parse_size(text)
    except ValueError as exc:
        raise ValueError(f"{field}: {exc}") from None


class Strict(BaseModel):
    # TOML has nan and inf: no field here means either (`shutdown_timeout_s = inf` passed ge=0)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class MemorySpec(Strict):
    """`[memory]`: caps on what homespec may plan to use, per device."""

    budget: dict[str, str] = Field(
        default_factory=dict,
        description='e.g. { ram = "6GiB", cuda0 = "7GiB" }; HOMESPEC_MEMORY_BUDGET wins per device',
    )
    min_free: str = Field(
        "512MiB",
        description="while serving: when less than this is free where a pair's draft lives, "
        "the draft is dropped (n-gram drafting goes on); it comes back once twice this is "
        "free with the draft loaded, for a few samples in a row",
    )
    watch_interval_s: float = Field(
        5.0, gt=0, le=3600, description="how often the daemon samples free memory"
    )

    @property
    def min_free_bytes(self) -> int:
        return parse_size(self.min_free)

    @model_validator(mode="after")
    def _sizes(self) -> MemorySpec:
        for device, size in self.budget.items():
            if not re.fullmatch(r"ram|cuda\d+|metal", device):
                raise ValueError(f"budget: unknown device {device!r} (ram, cudaN or metal)")
            check_size(f"budget.{device}", size)
        check_size("min_free", self.min_free)
        return self


class WorkerSpec(Strict):
    """`[workers.NAME]`: another box running `homespec worker` (llama.cpp's RPC server)."""

    endpoint: str = Field(
        description='"HOST:PORT" of its `homespec worker`, e.g. "192.168.1.20:50052"'
    )
    budget: str | None = Field(
        None, description='the most homespec plans to use on each of its devices, e.g. "20GiB"'
    )
    connect_timeout_s: float = Field(
        3.0, gt=0, le=60, description="how long a probe waits for it before planning without it"
    )

    @model_validator(mode="after")
    def _check(self) -> WorkerSpec:
        from homespec.workers import split_endpoint

        split_endpoint(self.endpoint)
        if self.budget is not None:
            check_size("budget", self.budget)
        return self


# Pages served from this machine (any port): a browser UI run beside the daemon works
# untouched, and no page from elsewhere can read the models' answers (Ollama's default too).
LOOPBACK_ORIGINS = tuple(
    f"{scheme}://{host}"
    for host in ("localhost", "127.0.0.1", "[::1]")
    for scheme in ("http", "https")
)
ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s?#]+")


class ServerSpec(Strict):
    """`[server]`: how `homespec serve` answers."""

    pairs: list[Name] = Field(
        default_factory=list, description="pairs to load at start (default: default_pair)"
    )
    unknown_model: Literal["default_pair", "error"] = Field(
        "default_pair",
        description='a request naming no pair (e.g. "gpt-3.5-turbo"): served by the default '
        'pair, saying so, or "error": 404 listing the pairs',
    )
    max_queue: int = Field(8, ge=1, le=1024, description="requests waiting or running per pair")
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host header names a daemon without an API key also answers (besides "
        "127.0.0.1, localhost, ::1 and --host); others get a 421 (DNS rebinding)",
    )
    cors_origins: list[str] = Field(
        default_factory=lambda: list(LOOPBACK_ORIGINS),
        description="web page origins whose scripts may call the API from a browser (CORS); "
        'one without a port matches any port; "*" any page (only with an API key); [] none',
    )
    max_tokens_limit: int = Field(4096, ge=1, description="largest max_tokens a request may ask")
    max_body_bytes: int = Field(1_048_576, ge=1024, description="largest request body")
    stream_interval_ms: float = Field(
        25.0,
        ge=0,
        le=1000,
        description="a stream's chunks after the first go out at most this often, the tokens "
        "between travelling together (0: a chunk per engine step); each send costs the "
        "daemon's Python a core the decoding threads need",
    )
    shutdown_timeout_s: float = Field(
        30.0, ge=0, description="on SIGTERM, how long in-flight requests may finish"
    )
    engine_crash_limit: int = Field(
        3, ge=1, le=100, description="engine deaths within engine_crash_window_s that fail a pair"
    )
    engine_crash_window_s: float = Field(
        600.0, gt=0, description="the window engine_crash_limit counts deaths in"
    )

    @model_validator(mode="after")
    def _origins(self) -> ServerSpec:
        bad = [o for o in self.cors_origins if o != "*" and not ORIGIN.fullmatch(o)]
        if bad:
            raise ValueError(
                f"cors_origins: {bad[0]!r} is not an origin: write scheme://host[:port] with "
                'no path (http://localhost:3000), or "*"'
            )
        return self
