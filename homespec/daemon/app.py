"""The HTTP API: an OpenAI-compatible surface plus /health, /metrics and /homespec/status.

`create_app(config)` builds everything the app needs and keeps it on `app.state.daemon`; there
are no module-level globals. Client mistakes get a 4xx with OpenAI's error envelope, never a
500 with a stack trace.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware

from homespec import __version__, heap
from homespec.daemon import cors, rpc_watch
from homespec.daemon.middleware import (
    BodyLimit,
    CountRefusals,
    Gate,
    allowed_hosts,
    error_response,
)
from homespec.daemon.openai_api import ChatCompletionRequest, CompletionRequest, error_param
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
# A non-streamed answer is read whole: its chunks come from the engine this often, which is
# also how soon a client that left is noticed (checked as each batch arrives).
UNSTREAMED_BATCH_S = 0.1
ENDPOINTS = (
    "POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health, "
    "GET /metrics, GET /homespec/status (the OpenAI ones also without /v1, as llama-server's)"
)


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
            return error_response(
                400,
                f"the body must be JSON, sent with content-type application/json "
                f"(got {kind or 'no content-type'})",
                "invalid_request_error",
            )
        problems, params = [], []
        for err in exc.errors():
            if err["type"] == "json_invalid":
                problems.append(f"the body is not valid JSON ({err['ctx'].get('error', '')})")
                continue
            if err["type"] == "missing" and tuple(err["loc"]) == ("body",):
                problems.append("the body is empty: send the request as a JSON object")
                continue
            loc = ".".join(str(p) for p in err["loc"] if p != "body")
            said = err["msg"].removeprefix("Value error, ")
            problems.append(f"{loc or 'body'}: {said}")
            params.append(error_param(loc, said))
        return error_response(
            400,
            "invalid request: " + "; ".join(problems),
            "invalid_request_error",
            param=next((p for p in params if p), None),
        )

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        said, path = _http_detail(exc), request.url.path
        if exc.status_code == 404 and said == "Not Found":
            said = f"{request.method} {path}: no such endpoint here: {ENDPOINTS}"
        elif exc.status_code == 405 and said == "Method Not Allowed":
            allowed = (exc.headers or {}).get("Allow", "another method")
            said = f"{path} takes {allowed}, not {request.method}"
        return error_response(exc.status_code, said, kind, headers=exc.headers)

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception) -> JSONResponse:
        LOG.exception("unhandled error on %s", request.url.path)
        return error_response(500, "internal error (logged by the daemon)", "server_error")

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
            return error_response(400, result.summary(), "invalid_request_error")
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
    @app.get("/models", include_in_schema=False)  # llama-server's paths without /v1, too
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card(name) for name in daemon.workers]}

    @app.get("/v1/models/{model}", response_model=None)
    @app.get("/models/{model}", response_model=None, include_in_schema=False)
    async def model(model: str) -> dict[str, Any] | JSONResponse:
        """One pair, as OpenAI's `models.retrieve` asks for it. Only a loaded pair's own name:
        that `unknown_model` sends other names to the default pair is a rule for requests."""
        if model in daemon.workers:
            return model_card(model)
        known = ", ".join(daemon.workers)
        return _refusal(UnknownModel(f"no pair named {model!r} is loaded", f"loaded: {known}"))

    @app.post("/v1/chat/completions", response_model=None)
    @app.post("/chat/completions", response_model=None, include_in_schema=False)
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        return await _complete(daemon, "chat", body, request)

    @app.post("/v1/completions", response_model=None)
    @app.post("/completions", response_model=None, include_in_schema=False)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await _complete(daemon, "text", body, request)

    return app


def _refusal(exc: HomespecError) -> JSONResponse:
    """The error response for `exc`: its status, type and Retry-After come from errors.py."""
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
    if isinstance(exc, UnknownModel):
        param: str | None = "model"
    else:  # a client's mistake names its field first ("max_tokens 100000 is over ...")
        param = error_param("", str(exc)) if isinstance(exc, RequestError) else None
    return error_response(exc.http_status, str(exc), exc.openai_type, headers, param=param)


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
        return error_response(499, "client disconnected", "cancelled", headers)
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
