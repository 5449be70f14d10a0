"""The CLI's HTTP client for a running daemon (`status`, and `ask` when a daemon answers)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import httpx

from homespec.api_key import from_env, sendable
from homespec.errors import DaemonUnavailable, RequestError

URL_ENV = "HOMESPEC_URL"
DEFAULT_URL = "http://127.0.0.1:8080"


def daemon_url(explicit: str | None = None) -> str:
    return (explicit or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")


class DaemonClient:
    def __init__(self, url: str | None = None, api_key: str | None = None) -> None:
        self.url = daemon_url(url)
        key = sendable(api_key.strip(), "the client's key") if api_key else from_env()
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    def health(self, timeout: float = 0.5) -> dict[str, Any] | None:
        """The daemon's /health, or None when nothing answers there."""
        try:
            r = httpx.get(f"{self.url}/health", timeout=timeout)
            body: dict[str, Any] = r.json()
            return body
        except (httpx.HTTPError, ValueError):
            return None

    def _send(self, method: str, path: str, timeout: float) -> httpx.Response:
        try:
            return httpx.request(method, f"{self.url}{path}", headers=self.headers, timeout=timeout)
        except httpx.HTTPError as exc:
            raise DaemonUnavailable(
                f"no homespec daemon answers at {self.url} ({exc})",
                "start one with `homespec serve` (or set HOMESPEC_URL / --url)",
            ) from None

    def get(self, path: str) -> dict[str, Any]:
        return _json_or_raise(self._send("GET", path, 10))

    def post(self, path: str, timeout: float = 60) -> tuple[int, dict[str, Any]]:
        """POST without a body: the status code and the JSON answer (errors included)."""
        r = self._send("POST", path, timeout)
        if r.status_code > 400:  # 400: the answer says what was wrong with the request
            _json_or_raise(r)
        try:
            body: dict[str, Any] = r.json()
        except ValueError:
            body = {}
        return r.status_code, body

    def stream(self, path: str, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """POST with stream=true and yield each SSE event's JSON."""
        with httpx.stream(
            "POST",
            f"{self.url}{path}",
            json={**payload, "stream": True},
            headers=self.headers,
            timeout=httpx.Timeout(10, read=600),
        ) as r:
            if r.status_code != 200:
                r.read()
                _json_or_raise(r)
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    return
                event: dict[str, Any] = json.loads(data)
                if "error" in event:
                    raise RequestError(f"daemon: {event['error']['message']}", "see its log")
                yield event


def _json_or_raise(r: httpx.Response) -> dict[str, Any]:
    try:
        body: dict[str, Any] = r.json()
    except ValueError:
        body = {}
    if r.status_code >= 400:
        message = body.get("error", {}).get("message") or r.text[:200]
        raise RequestError(
            f"daemon at {r.url}: {r.status_code}: {message}", "see `homespec status`"
        )
    return body
