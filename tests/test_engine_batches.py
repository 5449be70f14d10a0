"""Batching an answer's tokens (protocol.Generate.batch_s, server.stream_interval_ms): on the
engine child's side, how many messages an answer takes and that no token is lost or
reordered, the engine program over the scripted fake target (tests/fake_engine.py) in a
process of its own, driven over a socket pair the way the daemon drives it; on the daemon's,
one SSE event per batch and the same text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path

import httpx
import pytest

from homespec.engine.protocol import Finished, Generate, Steps
from homespec.engine.types import GenerationRequest, Message

from .daemon_process import fake_daemon, fake_engine

PROMPT = [Message("user", "forever a lighthouse keeper kept a very long watch. ")]
LONG = [{"role": m.role, "content": m.content} for m in PROMPT]
CHAT = "/v1/chat/completions"


@pytest.fixture()
def engine(tmp_path: Path) -> Iterator[Connection]:
    with fake_engine(tmp_path, {"HOMESPEC_FAKE_DECODE_S": "0.002"}, "plain test") as conn:
        yield conn


def answer(
    conn: Connection, rid: str, batch_s: float, first_at_once: bool
) -> tuple[list[int], Finished, list[str]]:
    """A 40-token answer: the chunk count of each `Steps`, the `Finished`, every token's text."""
    req = GenerationRequest(messages=PROMPT, max_tokens=40, speculative=False)
    conn.send(Generate(rid, req, batch_s, first_at_once))
    steps: list[int] = []
    texts: list[str] = []
    while True:
        msg = conn.recv()
        assert isinstance(msg, Steps | Finished) and msg.rid == rid, msg
        texts += [c.text for c in msg.chunks]
        if isinstance(msg, Finished):
            assert msg.stats is not None and msg.stats.completion_tokens == 40
            return steps, msg, texts
        steps.append(len(msg.chunks))


def test_batching_changes_the_messages_not_the_tokens(engine: Connection) -> None:
    steps, end, per_step = answer(engine, "a", 0.0, True)
    assert steps == [1] * 40 and not end.chunks
    # A stream: the first token at once, the other 39 (80 ms of fake steps) ride on Finished.
    steps, end, stream = answer(engine, "b", 10.0, True)
    assert steps == [1] and len(end.chunks) == 39
    # An answer sent whole: nothing until the end.
    steps, end, whole = answer(engine, "c", 10.0, False)
    assert steps == [] and len(end.chunks) == 40
    assert len(per_step) == 40 and per_step == stream == whole


def streamed_texts(url: str, body: dict[str, object]) -> list[str]:
    """The content of each event of a streamed chat completion, in order."""
    texts = []
    with httpx.stream("POST", url + CHAT, json=body, timeout=30) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line.removeprefix("data: "))["choices"]:
                    if choice["delta"].get("content"):
                        texts.append(choice["delta"]["content"])
    return texts


def test_a_stream_sends_its_tokens_in_batches_and_loses_none(tmp_path: Path) -> None:
    body = {"messages": LONG, "max_tokens": 80, "temperature": 0, "speculative": False}
    (tmp_path / "default").mkdir()
    (tmp_path / "per-step").mkdir()
    daemon = fake_daemon(tmp_path / "default")
    try:
        whole = daemon.post(CHAT, {**body, "stream": False}).json()
        batched = streamed_texts(daemon.url, {**body, "stream": True})
    finally:
        daemon.stop()
    text, n = whole["choices"][0]["message"]["content"], whole["usage"]["completion_tokens"]
    assert n == 80
    # A fake step takes 2 ms and stream_interval_ms defaults to 25: about 12 tokens an event.
    assert "".join(batched) == text and len(batched) < n / 3, batched
    per_step = fake_daemon(tmp_path / "per-step", server="stream_interval_ms = 0")
    try:
        events = streamed_texts(per_step.url, {**body, "stream": True})
    finally:
        per_step.stop()
    assert "".join(events) == text and len(events) == n, events
