"""`homespec bench --against`: the same workload sent to another OpenAI-compatible server.

Each request streams from `/v1/chat/completions` with the same messages, max_tokens,
temperature and seed as homespec's own runs; ttft is the first content chunk, e2e the last byte,
both measured here, so tok/s means what it means for homespec (answer tokens ÷ e2e). The token
count is the server's `usage` when it sends one, else its content chunks. llama-server's
`timings.draft_n` / `draft_n_accepted`, or a homespec daemon's `homespec` stats, when present,
give the accept rate.

No homespec state is involved: a server is an address and a label, e.g.
`llama-ngram=http://127.0.0.1:8091`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import httpx

from homespec.engine.types import GenerationStats
from homespec.errors import ConfigError, RequestError
from homespec.workload import WorkItem

WARM_UP = [{"role": "user", "content": "Say hello."}]


@dataclass(frozen=True)
class Remote:
    label: str  # the bench table's mode column, e.g. "llama-ngram"
    url: str  # base URL, without /v1

    @property
    def endpoint(self) -> str:
        return f"{self.url}/v1/chat/completions"


def parse_against(value: str, index: int) -> Remote:
    """`LABEL=URL` or a bare URL (labelled remote1, remote2, …)."""
    label, sep, url = value.partition("=")
    if not sep:
        label, url = f"remote{index}", value
    url = url.strip().rstrip("/").removesuffix("/v1")
    label = label.strip()
    if not url.startswith(("http://", "https://")):
        raise ConfigError(
            f"--against {value!r}: not an http(s) URL",
            "give LABEL=http://HOST:PORT (an OpenAI-compatible server)",
        )
    if not label or any(c.isspace() for c in label) or "," in label:
        raise ConfigError(f"--against {value!r}: bad label {label!r}", "use a short word")
    return Remote(label, url)


def _payload(messages: list[dict[str, str]], max_tokens: int, temperature: float) -> dict[str, Any]:
    return {
        "model": "default",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


class Answer(NamedTuple):
    text: str
    stats: GenerationStats
    homespec: bool  # the server sent homespec's own stats: a homespec daemon, not another server


def run_remote(
    client: httpx.Client,
    remote: Remote,
    item: WorkItem,
    *,
    temperature: float,
    max_tokens: int | None,
    extra: dict[str, Any] | None = None,
) -> Answer:
    """`item` streamed from `remote`; `extra`: more body fields (a homespec daemon's
    `speculative`, `task`)."""
    messages = [{"role": m.role, "content": m.content} for m in item.messages]
    limit = min(item.max_tokens, max_tokens) if max_tokens else item.max_tokens
    payload = _payload(messages, limit, temperature)
    if item.prediction:  # OpenAI's field: servers that do not draft from it ignore it
        payload["prediction"] = {"type": "content", "content": item.prediction}
    return _stream(client, remote, {**payload, **(extra or {})})


def preflight(client: httpx.Client, remotes: list[Remote]) -> None:
    """Raise RequestError for a server that does not answer at all, before the bench spends
    seconds to minutes loading the pair. Any HTTP answer will do (a server without
    /v1/models answers 404): whether it serves chat completions, its first request says."""
    for remote in remotes:
        try:
            client.get(f"{remote.url}/v1/models", timeout=10.0)
        except httpx.HTTPError as exc:
            raise RequestError(
                f"--against {remote.label}: {remote.url} does not answer ({exc})",
                "is the server running, and on that address and port?",
            ) from None


def warm_up(client: httpx.Client, remote: Remote) -> None:
    """One short request, so the server's first-request costs hit no measured run."""
    _stream(client, remote, _payload(WARM_UP, 8, 0.0))


def _stream(client: httpx.Client, remote: Remote, payload: dict[str, Any]) -> Answer:
    stats = GenerationStats(mode="plain", reason=f"{remote.label}: {remote.url}", drafter="none")
    parts: list[str] = []
    chunks = 0
    usage: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    own: dict[str, Any] = {}  # a homespec daemon's stats (its last chunk)
    t0 = time.perf_counter()
    try:
        # A fresh connection per request: llama-server may close an idle keep-alive one just
        # as the next request goes out on it ("Server disconnected without a response").
        headers = {"Connection": "close"}
        with client.stream("POST", remote.endpoint, json=payload, headers=headers) as r:
            if r.status_code != 200:
                r.read()
                raise RequestError(
                    f"{remote.label} at {remote.endpoint}: {r.status_code}: {r.text[:200]}",
                    "check that it serves OpenAI chat completions",
                )
            for line in r.iter_lines():
                data = line.removeprefix("data: ").strip()
                if not line.startswith("data: ") or data == "[DONE]":
                    continue
                event = json.loads(data)
                usage = event.get("usage") or usage
                timings = event.get("timings") or timings
                own = event.get("homespec") or own
                for choice in event.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content") or ""
                    if text:
                        if not parts:
                            stats.ttft_ms = (time.perf_counter() - t0) * 1000.0
                        parts.append(text)
                        chunks += 1
                    if choice.get("finish_reason"):
                        stats.finish_reason = choice["finish_reason"]
    except httpx.HTTPError as exc:
        raise RequestError(
            f"{remote.label} at {remote.endpoint}: {exc}", "is the server running?"
        ) from None
    stats.e2e_ms = (time.perf_counter() - t0) * 1000.0
    stats.completion_tokens = int(usage.get("completion_tokens") or chunks)
    stats.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    # OpenAI's (a homespec daemon's too); llama-server's own timings say it as cache_n
    details = usage.get("prompt_tokens_details") or {}
    stats.cached_tokens = int(details.get("cached_tokens") or timings.get("cache_n") or 0)
    proposed = int(timings.get("draft_n") or own.get("proposed_tokens") or 0)
    if proposed:
        stats.mode, stats.drafter = "speculative", "auto"
        stats.proposed_tokens = proposed
        accepted = timings.get("draft_n_accepted") or own.get("accepted_tokens")
        stats.accepted_tokens = int(accepted or 0)
    return Answer("".join(parts), stats, bool(own))
