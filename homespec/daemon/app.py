"""The HTTP API: an OpenAI-compatible surface plus /health, /metrics and /homespec/status.

`create_app(config)` builds everything the app needs and keeps it on `app.state.daemon`; there
are no module-level globals. Client mistakes get a 4xx with OpenAI's error envelope, never a
500 with a stack trace.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import signal
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import aclosing, asynccontextmanager
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from homespec import __version__, heap
from homespec.daemon import cors, rpc_watch
from homespec.daemon.openai_api import ChatCompletionRequest, CompletionRequest
from homespec.daemon.openai_responses import SSE_DONE, Envelope, error_body, homespec_extra, sse
from homespec.daemon.outcome import Outcome
from homespec.daemon.service import Daemon, DaemonConfig
from homespec.engine.types import Chunk, GenerationStats
from homespec.errors import (
    HomespecError,
    NotReady,
    PairUnavailable,
    RequestError,
    UnknownModel,
)
from homespec.resources import Machine, probe_machine

LOG = logging.getLogger("homespec.daemon")
OPEN_PATHS = ("/health",)
# A non-streamed answer is read whole: its chunks come from the engine this often, which is
# also how soon a client that left is noticed (checked as each batch arrives).
UNSTREAMED_BATCH_S = 0.1


def _error(
    status: int,
    message: str,
    type_: str,
    headers: Mapping[str, str] | None = None,
    param: str | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param), status_code=status, headers=headers)


class BodyLimit:
    """413 for a request body over `limit` bytes, declared or streamed."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        too_big = _error(413, f"request body over {self.limit} bytes", "invalid_request_error")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await too_big(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise HTTPException(413, f"request body over {self.limit} bytes")
            return message

        await self.app(scope, limited, send)


def _http_detail(exc: HTTPException) -> str:
    """FastAPI says only "There was an error parsing the body" for a body that json.loads
    could not even start on: say which way it was bad."""
    cause = exc.__cause__
    if isinstance(cause, UnicodeDecodeError):
        return f"the body is not UTF-8 JSON ({cause.reason} at byte {cause.start})"
    if isinstance(cause, RecursionError):
        return "the body is JSON nested too deep to read"
    if cause is not None and exc.status_code == 400:
        return f"the body could not be read as JSON ({type(cause).__name__}: {cause})"
    return str(exc.detail)


def allowed_hosts(config: DaemonConfig) -> frozenset[str]:
    """Host header values a daemon without an API key answers: the names of loopback, the
    address it is bound to, and `[server] allowed_hosts`."""
    extra = config.manifest.spec.server.allowed_hosts
    return frozenset({"127.0.0.1", "localhost", "::1", config.host.lower(), *extra})


def host_name(header: str) -> str:
    """`[::1]:8080` → `::1`, `localhost:8080` → `localhost`."""
    if header.startswith("["):
        return header[1:].partition("]")[0].lower()
    return header.rpartition(":")[0].lower() if header.count(":") == 1 else header.lower()


class Throttle:
    """Wrong API keys per client address: after MAX_FAILS in WINDOW_S seconds, that address
    gets a 429 with Retry-After until the oldest failure ages out. The right key is checked
    first and always passes, so a guesser next door never locks out the owner."""

    MAX_FAILS, WINDOW_S, MAX_ADDRESSES = 10, 60.0, 4096

    def __init__(self) -> None:
        self._fails: dict[str, deque[float]] = {}

    def retry_after(self, addr: str, now: float) -> int:
        """Seconds this address must wait (0: it may try)."""
        fails = self._fails.get(addr)
        while fails and fails[0] <= now - self.WINDOW_S:
            fails.popleft()
        if not fails or len(fails) < self.MAX_FAILS:
            return 0
        return max(1, math.ceil(fails[0] + self.WINDOW_S - now))

    def failed(self, addr: str, now: float) -> None:
        if addr not in self._fails and len(self._fails) >= self.MAX_ADDRESSES:
            self._fails.pop(next(iter(self._fails)))  # the longest-known address goes first
        self._fails.setdefault(addr, deque(maxlen=self.MAX_FAILS)).append(now)


class Gate:
    """Who may talk to the daemon, as plain ASGI: Starlette's BaseHTTPMiddleware kept a
    request generating after its client had left, so nothing here wraps the response.

    - With an API key: every path but /health needs it, as `Authorization: Bearer KEY` (the
      scheme in any case) or `X-API-Key: KEY`. /health answers without it, with less detail.
      Repeated wrong keys from one address are slowed (`Throttle`).
    - Without one (the daemon then listens on loopback only): a Host header that names
      another site gets a 421, so a web page cannot reach the models through DNS rebinding.
    """

    def __init__(self, app: ASGIApp, key: str | None, hosts: frozenset[str]) -> None:
        self.app, self.key, self.hosts = app, key, hosts
        self.throttle = Throttle()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal: JSONResponse | None = None
        trusted = True  # the caller may see everything (paths in /health included)
        if self.key is None:
            host = headers.get("host", "")
            if host and host_name(host) not in self.hosts:
                refusal = _error(
                    421,
                    f"Host {host!r} is not a name of this daemon (add it to [server] "
                    "allowed_hosts, or set an API key)",
                    "invalid_request_error",
                )
        else:
            scheme, _, token = headers.get("authorization", "").partition(" ")
            given = token.strip() if scheme.lower() == "bearer" else ""
            given = given or headers.get("x-api-key", "")
            trusted = hmac.compare_digest(given.encode(), self.key.encode())
            addr = (scope.get("client") or ("?", 0))[0]
            now = time.monotonic()
            wait = 0 if trusted or not given else self.throttle.retry_after(addr, now)
            if wait:
                refusal = _error(
                    429,
                    "too many wrong API keys from this address: wait before trying again",
                    "rate_limit_error",
                    headers={"Retry-After": str(wait)},
                )
            elif not trusted and scope["path"] not in OPEN_PATHS:
                if given:
                    self.throttle.failed(addr, now)
                refusal = _error(
                    401,
                    "missing or wrong API key (Authorization: Bearer …)",
                    "authentication_error",
                )
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        scope.setdefault("state", {})["trusted"] = trusted
        await self.app(scope, receive, send)


COUNTED = {"/v1/chat/completions": "chat.completions", "/v1/completions": "completions"}


class CountRefusals:
    """Counts the completion requests answered with an error before any generation
    (`Daemon.refused`): invalid bodies, unknown models, a full queue, a pair not ready, a
    wrong API key, a prompt too long. They are not lines of the request log, which holds the
    requests that ran, so without this an operator whose clients got 503s saw nothing.
    Outermost, so the API-key gate's and the body limit's answers count too; a request the
    endpoint admitted (`request.state.admitted`) ended in the log, whatever its status."""

    def __init__(self, app: ASGIApp, daemon: Daemon) -> None:
        self.app, self.daemon = app, daemon

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = COUNTED.get(scope.get("path", "")) if scope["type"] == "http" else None
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        status = 0

        async def noting(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        await self.app(scope, receive, noting)
        if status >= 400 and not scope.get("state", {}).get("admitted", False):
            self.daemon.refused(endpoint, status)


def create_app(config: DaemonConfig, probe: Callable[[], Machine] = probe_machine) -> FastAPI:
    daemon = Daemon(config, probe)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        daemon.start()
        heap.settle()  # the imports' objects out of the collector's walks (homespec/heap.py)
        # SIGHUP (`systemctl reload homespec`) re-reads models.toml; its default would kill us.
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, daemon.reload_soon)
        yield
        loop.remove_signal_handler(signal.SIGHUP)
        await daemon.close()  # after uvicorn has drained the in-flight requests

    app = FastAPI(title="homespec", version=__version__, lifespan=lifespan)
    app.state.daemon = daemon
    app.add_middleware(BodyLimit, limit=daemon.server.max_body_bytes)

    app.add_middleware(Gate, key=config.api_key, hosts=allowed_hosts(config))
    if browsers := cors.options(daemon.server.cors_origins):  # around the gate (cors.py)
        app.add_middleware(CORSMiddleware, **browsers)
    app.add_middleware(CountRefusals, daemon=daemon)  # outermost: sees the gate's answers

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        kind = request.headers.get("content-type", "")
        if request.method == "POST" and "json" not in kind:
            return _error(
                400,
                f"the body must be JSON, sent with content-type application/json "
                f"(got {kind or 'no content-type'})",
                "invalid_request_error",
            )
        problems = []
        for err in exc.errors():
            if err["type"] == "json_invalid":
                problems.append(f"the body is not valid JSON ({err['ctx'].get('error', '')})")
                continue
            if err["type"] == "missing" and tuple(err["loc"]) == ("body",):
                problems.append("the body is empty: send the request as a JSON object")
                continue
            loc = ".".join(str(p) for p in err["loc"] if p != "body")
            problems.append(f"{loc or 'body'}: {err['msg'].removeprefix('Value error, ')}")
        return _error(400, "invalid request: " + "; ".join(problems), "invalid_request_error")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error(exc.status_code, _http_detail(exc), kind, headers=exc.headers)

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception) -> JSONResponse:
        LOG.exception("unhandled error on %s", request.url.path)
        return _error(500, "internal error (logged by the daemon)", "server_error")

    @app.api_route("/health", methods=["GET", "HEAD"])  # uptime checkers often use HEAD
    async def health(request: Request) -> JSONResponse:
        h = daemon.health(detail=bool(getattr(request.state, "trusted", True)))
        return JSONResponse(h, status_code=200 if h["status"] in ("ready", "degraded") else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        for w in daemon.workers.values():
            daemon.metrics.set_state(
                w.name,
                w.mode,
                w.pending,
                len(w.deaths),
                w.memory(),
                draft_dropped=w.memory_watch.dropped,
                draft_drops=w.memory_drops,
                worker_layers=dict(w.info.plan.arrangement.remote) if w.info else None,
                workers_down=len(rpc_watch.missing(w.info)),
            )
        return Response(daemon.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/homespec/status")
    async def status() -> dict[str, Any]:
        return daemon.status()

    @app.post("/homespec/reload")
    async def reload() -> JSONResponse:
        """Re-read models.toml (as SIGHUP does): 200 with what changed, or 400 with why the new
        config was refused (the running one stays)."""
        result = await daemon.reload()
        if not result.ok:
            return _error(400, result.summary(), "invalid_request_error")
        return JSONResponse(result.to_dict())

    def model_card(name: str) -> dict[str, Any]:
        w = daemon.workers[name]
        return {
            "id": w.name,
            "object": "model",
            "created": int(daemon.started_at),
            "owned_by": "homespec",
            "homespec": {"state": w.state, "mode": w.mode},
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card(name) for name in daemon.workers]}

    @app.get("/v1/models/{model}", response_model=None)
    async def model(model: str) -> dict[str, Any] | JSONResponse:
        """One pair, as OpenAI's `models.retrieve` asks for it. Only a loaded pair's own name:
        that `unknown_model` sends other names to the default pair is a rule for requests."""
        if model in daemon.workers:
            return model_card(model)
        known = ", ".join(daemon.workers)
        return _refusal(UnknownModel(f"no pair named {model!r} is loaded", f"loaded: {known}"))

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        return await _complete(daemon, "chat", body, request)

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await _complete(daemon, "text", body, request)

    return app


def _refusal(exc: HomespecError) -> JSONResponse:
    """The error response for `exc`: its status, type and Retry-After come from errors.py."""
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
    param = "model" if isinstance(exc, UnknownModel) else None
    return _error(exc.http_status, str(exc), exc.openai_type, headers, param=param)


async def _complete(
    daemon: Daemon,
    kind: Literal["chat", "text"],
    body: ChatCompletionRequest | CompletionRequest,
    request: Request,
) -> Response:
    arrived = time.perf_counter()  # the stats' queue_ms, ttft and e2e count from here
    rid = daemon.new_id()
    limit = daemon.server.max_tokens_limit
    try:
        worker, notes = daemon.resolve(body.model)
        if worker.state == "failed":
            raise PairUnavailable(
                f"pair {worker.name!r} cannot run: {worker.error}",
                "see `homespec doctor` and the daemon's log",
            )
        if worker.state == "restarting":
            raise NotReady(f"pair {worker.name!r} is restarting: {worker.reason}", "retry shortly")
        if worker.state != "ready":
            raise NotReady(
                f"pair {worker.name!r} is not ready: the target model is still loading",
                "retry shortly",
            )
        asked = body.asked_tokens()
        if asked is not None and asked > limit:
            raise RequestError(
                f"max_tokens {asked} is over this daemon's limit of {limit}",
                "ask for fewer tokens (server.max_tokens_limit)",
            )
        req = body.to_generation(default_max_tokens=min(limit, 1024))
        # A request that will wait behind others has its prompt counted first, so one too long
        # for the context is refused before it queues. One that starts at once is counted by
        # the engine as it starts, before any token (asking first cost a round trip to the
        # engine, a millisecond of a short answer): its refusal is awaited below, still a 400.
        counted = worker.pending > 0
        if counted:
            await worker.check_prompt(req)
        worker.admit()
        request.state.admitted = True  # it ends as a line of the request log
    except HomespecError as exc:
        response = _refusal(exc)
        response.headers["X-Request-Id"] = rid
        return response
    notes = [*notes, *worker.notes()]
    apart = body.stream and body.stream_options is not None and body.stream_options.include_usage
    env = Envelope(kind, rid, worker.name, usage_apart=apart)
    endpoint = "chat.completions" if kind == "chat" else "completions"

    def on_done(outcome: Outcome) -> None:
        daemon.record(rid, endpoint, worker, req, body.model, notes, outcome)

    headers = {"X-Request-Id": rid}
    if body.stream:
        interval_s = daemon.server.stream_interval_ms / 1000.0
        items = worker.stream(rid, req, on_done, batch_s=interval_s, arrived=arrived)
        head = None
        if not counted:  # the response starts with the first token, or is the engine's refusal
            try:
                head = await anext(items)
            except HomespecError as exc:
                # The engine refused it as it started (a client's mistake: not logged), or
                # crashed (logged).
                request.state.admitted = type(exc) is not RequestError
                response = _refusal(exc)
                response.headers.update(headers)
                return response
        events = _sse(head, items, env, notes, worker.name)
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)
    text: list[str] = []
    stats: GenerationStats | None = None
    try:
        batched = worker.stream(
            rid, req, on_done, batch_s=UNSTREAMED_BATCH_S, first_at_once=False, arrived=arrived
        )
        async for item in batched:
            if isinstance(item, GenerationStats):
                stats = item
            else:
                text.extend(c.text for c in item)
                if await request.is_disconnected():
                    break  # leaving the loop stops generation
    except HomespecError as exc:
        request.state.admitted = not (type(exc) is RequestError and not text)
        response = _refusal(exc)
        response.headers.update(headers)
        return response
    if stats is None:
        return _error(499, "client disconnected", "cancelled", headers)
    payload = env.full("".join(text), stats, homespec_extra(stats, worker.name, notes))
    return JSONResponse(payload, headers=headers)


async def _sse(
    head: list[Chunk] | GenerationStats | None,
    rest: AsyncGenerator[list[Chunk] | GenerationStats, None],
    env: Envelope,
    notes: list[str],
    pair: str,
) -> AsyncIterator[str]:
    """One event per batch of tokens the engine sent together (server.stream_interval_ms):
    `head` when it was taken from the worker's stream before the response started, then the
    `rest`. Leaving early closes the worker's stream, which cancels the request (a request
    still queued never reaches the engine)."""
    first = True
    try:
        async with aclosing(rest):
            item = head if head is not None else await anext(rest, None)
            while item is not None:
                if isinstance(item, GenerationStats):
                    yield env.last_chunk(item, homespec_extra(item, pair, notes))
                elif text := "".join(c.text for c in item):
                    yield env.chunk(text, first=first)
                    first = False
                item = await anext(rest, None)
    except HomespecError as exc:
        yield sse(error_body(str(exc), exc.openai_type))
    except Exception as exc:  # the headers are out: report in-band, never a broken stream
        LOG.exception("stream %s failed", env.id)
        yield sse(error_body(f"generation failed: {exc}", "server_error"))
    yield SSE_DONE
