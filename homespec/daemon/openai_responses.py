"""The OpenAI-compatible responses homespec sends back: whole, as SSE chunks, and as errors,
each with OpenAI's usage and the request's stats in a `homespec` object. The request bodies
they answer are openai_api.py's."""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from homespec.engine.types import GenerationStats


def error_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def usage(stats: GenerationStats) -> dict[str, Any]:
    """OpenAI's usage object; cached_tokens: the prompt's tokens the pair's cache already held
    (a conversation's earlier turns, or one put aside and brought back: not evaluated again);
    accepted_prediction_tokens: the prediction's tokens drafted and kept in the answer,
    rejected_prediction_tokens: the rest of the prediction's."""
    accepted = stats.accepted_prediction_tokens
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
        "completion_tokens_details": {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": max(0, stats.prediction_tokens - accepted),
        },
    }


def homespec_extra(stats: GenerationStats | None, pair: str, notes: list[str]) -> dict[str, Any]:
    """The `homespec` object every response carries: the engine's stats and why."""
    out: dict[str, Any] = {"pair": pair}
    if stats is not None:
        out.update(stats.to_dict())
    if notes:
        reason = out.get("reason", "")
        said = [n for n in notes if n not in reason]  # e.g. the draft's absence, said by the engine
        out["reason"] = "; ".join([*said, reason]).rstrip("; ")
        out["notes"] = notes
    return out


class Envelope:
    """Builds the response objects of one request (chat or text completion)."""

    def __init__(
        self,
        kind: Literal["chat", "text"],
        request_id: str,
        model: str,
        *,
        usage_apart: bool = False,
    ) -> None:
        self.kind = kind
        self.id = request_id
        self.model = model
        self.created = int(time.time())
        # A stream's usage in a chunk of its own, with no choices (stream_options.include_usage)
        self.usage_apart = usage_apart

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(self, text: str, stats: GenerationStats, extra: dict[str, Any]) -> dict[str, Any]:
        if self.kind == "chat":
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": stats.finish_reason,
            }
            body = self._base("chat.completion")
        else:
            choice = {"index": 0, "text": text, "finish_reason": stats.finish_reason}
            body = self._base("text_completion")
        return {**body, "choices": [choice], "usage": usage(stats), "homespec": extra}

    def chunk(self, text: str, *, first: bool = False) -> str:
        if self.kind == "chat":
            delta: dict[str, Any] = {"content": text}
            if first:
                delta["role"] = "assistant"
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None}
            body = self._base("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text, "finish_reason": None}
            body = self._base("text_completion")
        return sse({**body, "choices": [choice]})

    def last_chunk(self, stats: GenerationStats, extra: dict[str, Any]) -> str:
        """The final chunk: finish_reason, usage and the homespec stats. Where the client sent
        stream_options.include_usage, as OpenAI streams it: the usage in a chunk of its own
        after that one, with an empty `choices` (a client that reads usage only from a chunk
        without choices, as OpenAI's examples do, never found it on the finish chunk), and
        null on the finish chunk."""
        if self.kind == "chat":
            choice: dict[str, Any] = {"index": 0, "delta": {}, "finish_reason": stats.finish_reason}
            body = self._base("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": "", "finish_reason": stats.finish_reason}
            body = self._base("text_completion")
        if not self.usage_apart:
            return sse({**body, "choices": [choice], "usage": usage(stats), "homespec": extra})
        last = sse({**body, "choices": [choice], "usage": None, "homespec": extra})
        return last + sse({**body, "choices": [], "usage": usage(stats)})


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"
