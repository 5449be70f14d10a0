"""The ASGI layers around the API, outermost first: CountRefusals (errors answered before any
generation, counted), CORS (cors.py, when configured), Gate (API key or Host check), BodyLimit
(413 over the size limit). Plain ASGI, not Starlette's BaseHTTPMiddleware, which kept a
request generating after its client had left."""

from __future__ import annotations

import hmac
import math
import time
from collections import deque
from collections.abc import Mapping

from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from homespec.daemon.openai_responses import error_body
from homespec.daemon.service import Daemon, DaemonConfig

OPEN_PATHS = ("/health",)


def error_response(
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
        too_big = error_response(
            413, f"request body over {self.limit} bytes", "invalid_request_error"
        )
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
                refusal = error_response(
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
                refusal = error_response(
                    429,
                    "too many wrong API keys from this address: wait before trying again",
                    "rate_limit_error",
                    headers={"Retry-After": str(wait)},
                )
            elif not trusted and scope["path"] not in OPEN_PATHS:
                if given:
                    self.throttle.failed(addr, now)
                refusal = error_response(
                    401,
                    "missing or wrong API key (Authorization: Bearer …)",
                    "authentication_error",
                )
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        scope.setdefault("state", {})["trusted"] = trusted
        await self.app(scope, receive, send)


COUNTED = {
    path: endpoint
    for endpoint, paths in (
        ("chat.completions", ("/v1/chat/completions", "/chat/completions")),
        ("completions", ("/v1/completions", "/completions")),
    )
    for path in paths
}


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
