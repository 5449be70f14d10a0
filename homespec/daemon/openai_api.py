"""OpenAI-compatible request bodies (the responses sent back: openai_responses.py).

Only what homespec can honour is accepted; OpenAI fields it cannot honour in a way that would
change the answer (n > 1, tools, logprobs, penalties, logit_bias, a response_format other than
text, image parts; audio, web search, reasoning effort, verbosity; for completions echo,
suffix, best_of > 1, token-id prompts) are refused with a 400 that names them, and fields that
cannot change the answer (user, metadata, a zero penalty, ...) are ignored. Other local
servers' fields that change the answer (llama.cpp's `grammar`, `mirostat`, `t_max_predict_ms`,
vLLM's `guided_json`, `stop_token_ids`, ...) are refused too unless they ask for nothing
(refused_fields.py). Honoured beyond OpenAI's own: `top_k`, `min_p`, and llama.cpp's
`n_predict` (its name for max_tokens). `prediction` (OpenAI's Predicted Outputs: the answer as
the client expects it) is drafted from, on completions too, and usage reports how much of it
was kept. `stream_options.include_usage` streams the usage in a chunk of its own, as OpenAI
does (without it, the finish chunk carries it). A boolean where a number goes
(`max_tokens: true`) is refused, not read as 1. The extras homespec adds: `speculative`
(true | false | "auto"), `task`, `draft_tokens`, `drafter`.
"""

from __future__ import annotations

import functools
import json
import re
from types import UnionType
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from homespec.daemon import refused_fields
from homespec.engine import chat_template
from homespec.engine.types import EMPTY_STOP, ChatFormat, GenerationRequest, Message
from homespec.manifest import MAX_DRAFT_TOKENS
from homespec.plain_text import bad_text
from homespec.vocab import Drafter

Speculative = bool | Literal["auto"]
# OpenAI takes 4 stop strings; llama-server and vLLM any number, and clients moved over from
# them send more (each is checked at every token: engine/textstream.py).
MAX_STOPS = 16


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class _Text(BaseModel):
    """A `content` that is a string or a list of text parts (OpenAI's two spellings)."""

    model_config = ConfigDict(extra="ignore")
    content: str | list[ContentPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)

    @staticmethod
    def check_parts(parts: Any) -> None:
        """A list of parts that are not all text, said plainly: the generic union error for an
        image part listed three mismatches and not the one that mattered."""
        if isinstance(parts, list):
            for i, part in enumerate(parts):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text":
                    raise ValueError(
                        f"content[{i}] has type {kind!r}: only text parts are supported "
                        "(the models read text only)"
                    )


class ChatMessage(_Text):
    role: Literal["system", "developer", "user", "assistant"]

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data: Any) -> Any:
        """What a text-only server cannot take, said plainly."""
        if not isinstance(data, dict):
            return data
        if data.get("role") in ("tool", "function") or data.get("tool_calls"):
            raise ValueError(
                "tool calls and tool results are not supported (homespec has no tools): "
                "send the conversation as system, user and assistant text"
            )
        parts = data.get("content")
        if parts is None:
            raise ValueError("content is missing or null: send the message's text")
        cls.check_parts(parts)
        return data


@functools.cache
def _defaulted(model: type[BaseModel]) -> frozenset[str]:
    """The optional fields of `model` whose default is not None (`n`, `stream`, ...)."""
    return frozenset(
        name
        for name, field in model.model_fields.items()
        if not field.is_required() and field.default is not None
    )


class _NullIsDefault(BaseModel):
    """A body whose optional fields take null as their default, as OpenAI does: clients that
    write every field of their own request model send `"n": null`, `"stream": null`, ...
    NaN and Infinity, which Python's JSON reads, are no number a field takes: refused as such
    (a NaN temperature was refused as "less than or equal to 2")."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            nulls = {k for k, v in data.items() if v is None} & _defaulted(cls)
            data = {k: v for k, v in data.items() if k not in nulls}
        return data


class StreamOptions(_NullIsDefault):
    """OpenAI's `stream_options`: `include_usage` asks for usage in a chunk of its own."""

    include_usage: bool = False


class PredictedContent(_Text):
    """OpenAI's `prediction`: text the answer is expected to read like, to draft from."""

    type: Literal["content"]

    @model_validator(mode="before")
    @classmethod
    def _content_only(cls, data: Any) -> Any:
        shape = '{"type": "content", "content": "the answer you expect"}'
        if not isinstance(data, dict):
            raise ValueError(f"prediction must be an object: send {shape}")
        if data.get("type") != "content":
            raise ValueError(f"prediction type {data.get('type')!r} is not supported: send {shape}")
        cls.check_parts(data.get("content"))
        return data


@functools.cache
def _numbers(model: type[BaseModel]) -> tuple[str, ...]:
    """The fields of `model` that take a number and never a boolean: pydantic reads JSON true
    as 1 there (`max_tokens: true` answered one token)."""
    out = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        kinds: tuple[Any, ...] = get_args(ann) if isinstance(ann, UnionType) else (ann,)
        if bool not in kinds and (int in kinds or float in kinds):
            out.append(name)
    return tuple(out)


class _Common(_NullIsDefault):
    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data: Any) -> Any:
        problem = bad_text(data, "")
        if problem:
            raise ValueError(f"{problem}: send plain text")
        if isinstance(data, dict):
            for name in _numbers(cls):
                if isinstance(data.get(name), bool):  # JSON true is no count or temperature
                    raise ValueError(f"{name}={json.dumps(data[name])} is not a number: send one")
            refused = refused_fields.refusal(data)
            if refused:
                raise ValueError(refused)
        return data

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1, le=1_048_576)  # the largest n_ctx
    n_predict: int | None = Field(None, ge=-1, le=1_048_576)  # llama.cpp's max_tokens; -1: none
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=0)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1, description="homespec answers one choice per request")
    logprobs: bool | int | None = None  # chat: a flag; completions: how many (refused either way)
    prediction: PredictedContent | None = None
    tools: list[Any] | None = None
    # Fields that would change the answer and that homespec does not implement: refused by
    # name unless they ask for nothing (a zero penalty, an empty bias, plain text).
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    # homespec's extras
    speculative: Speculative = "auto"
    task: str | None = Field(None, max_length=64)
    draft_tokens: int | None = Field(None, ge=1, le=MAX_DRAFT_TOKENS)
    drafter: Drafter | None = None

    @field_validator("seed", mode="before")
    @classmethod
    def _random_seed(cls, v: Any) -> Any:
        """-1 is llama.cpp's "a fresh seed" (its LLAMA_DEFAULT_SEED): no seed; the response
        reports the one drawn."""
        if isinstance(v, int) and not isinstance(v, bool) and v < 0:
            if v == -1:
                return None
            raise ValueError(f"seed {v}: send 0 or more, or -1 (or nothing) for a fresh one")
        return v

    @field_validator("max_tokens", "max_completion_tokens", mode="before", check_fields=False)
    @classmethod
    def _no_cap(cls, v: Any) -> Any:
        """-1 is llama.cpp's "no cap" (there max_tokens is n_predict's alias): the daemon's
        default cap applies, as for a request without one."""
        return None if isinstance(v, int) and not isinstance(v, bool) and v == -1 else v

    @field_validator("top_k", mode="before")
    @classmethod
    def _all_tokens(cls, v: Any) -> Any:
        """-1 is vLLM's (and llama.cpp's) "no top-k", homespec's 0: off, over models.toml's."""
        if isinstance(v, int) and not isinstance(v, bool) and v < 0:
            if v == -1:
                return 0
            raise ValueError(f"top_k {v}: send 1 or more, or 0 or -1 for no top-k")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError(EMPTY_STOP)
        return v

    @model_validator(mode="after")
    def _unsupported(self) -> _Common:
        if self.logprobs:
            raise ValueError(f"logprobs are not supported: {refused_fields.NO_PROBS}")
        if self.tools or self.functions:
            name = "tools" if self.tools else "functions"
            raise ValueError(f"{name} are not supported (homespec has no tools): leave them out")
        if self.tool_choice not in (None, "none", "auto"):
            raise ValueError("tool_choice is not supported (homespec has no tools)")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise ValueError(f"{name} is not supported: send 0 or leave it out")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported: leave it out")
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            raise ValueError(
                f"response_format {self.response_format.get('type')!r} is not supported "
                "(homespec does not constrain output): leave it out or use type text"
            )
        if self.n_predict == 0:
            raise ValueError("n_predict 0 asks for no answer: send max_tokens of 1 or more")
        predicted = self._predicted()
        if self.max_tokens and predicted and predicted != self.max_tokens:
            raise ValueError(
                f"max_tokens {self.max_tokens} and n_predict {predicted} disagree "
                "(n_predict is llama.cpp's name for max_tokens): send one of them"
            )
        return self

    def _predicted(self) -> int | None:
        """llama.cpp's n_predict as a cap (-1 there: no cap of its own)."""
        return self.n_predict if self.n_predict and self.n_predict > 0 else None

    def asked_tokens(self) -> int | None:
        """The answer's cap the client asked for, if any: max_tokens, else n_predict."""
        return self.max_tokens or self._predicted()

    def generation(self, **kw: Any) -> GenerationRequest:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        spec = None if self.speculative == "auto" else bool(self.speculative)
        return GenerationRequest(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            seed=self.seed,
            stop=stops,
            task=self.task,
            speculative=spec,
            drafter=self.drafter,
            draft_tokens=self.draft_tokens,
            prediction=(self.prediction.text() if self.prediction else "") or None,
            **kw,
        )


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=1_048_576)
    # How the chat becomes a prompt (llama-server's and vLLM's fields, chat_template.py): a
    # last message of the assistant's is continued (a prefill) unless one of the first two
    # says otherwise; the variables go to the model's chat template.
    continue_final_message: bool | None = None
    add_generation_prompt: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _rendering(self) -> ChatCompletionRequest:
        last = self.messages[-1].role
        if self.continue_final_message and last != "assistant":
            raise ValueError(
                f"continue_final_message: the last message is the {last}'s, not a begun "
                "answer: put the assistant's begun answer last, or leave the field out"
            )
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError(
                "continue_final_message and add_generation_prompt are both true (continue "
                "the last answer, or open a new one): send one of them"
            )
        older = super().asked_tokens()
        if self.max_completion_tokens and older and older != self.max_completion_tokens:
            name = "max_tokens" if self.max_tokens else "n_predict"
            raise ValueError(
                f"max_completion_tokens {self.max_completion_tokens} and {name} {older} "
                "disagree (both cap the answer; OpenAI's newer name is max_completion_tokens): "
                "send one of them"
            )
        taken = sorted(set(self.chat_template_kwargs or {}) & chat_template.RESERVED)
        if taken:
            raise ValueError(
                f"chat_template_kwargs: {', '.join(taken)} is set by homespec itself "
                "(from messages and the model's tokens): leave it out"
            )
        return self

    def chat_format(self) -> ChatFormat:
        """The rendering asked for: a last assistant message is continued unless
        continue_final_message is false or add_generation_prompt true (an explicit new turn)."""
        begun = self.messages[-1].role == "assistant"
        if self.continue_final_message is not None:
            cont = self.continue_final_message
        else:
            cont = begun and self.add_generation_prompt is not True
        return ChatFormat(
            continue_last=cont,
            generation_prompt=self.add_generation_prompt is not False,
            variables=dict(self.chat_template_kwargs or {}),
        )

    def to_generation(self, default_max_tokens: int) -> GenerationRequest:
        msgs = [
            Message("system" if m.role == "developer" else m.role, m.text()) for m in self.messages
        ]
        cap = self.asked_tokens() or default_max_tokens
        return self.generation(messages=msgs, max_tokens=cap, chat=self.chat_format())

    def asked_tokens(self) -> int | None:
        return self.max_completion_tokens or super().asked_tokens()


class CompletionRequest(_Common):
    prompt: str | list[str]
    # The legacy endpoint's own fields that would change the answer: refused unless they ask
    # for nothing (no echo, no suffix, one candidate).
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, v: Any) -> Any:
        if isinstance(v, list) and any(isinstance(x, int | list) for x in v):
            raise ValueError("a prompt of token ids is not supported: send the prompt as text")
        if isinstance(v, list) and len(v) != 1:
            raise ValueError("homespec takes one prompt per request")
        return v

    @model_validator(mode="after")
    def _unsupported_here(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo is not supported: leave it out (the prompt is yours already)")
        if self.suffix:
            raise ValueError("suffix (fill in the middle) is not supported: leave it out")
        if self.best_of not in (None, 1):
            raise ValueError("best_of is not supported (one candidate per request): send 1")
        return self

    def to_generation(self, default_max_tokens: int) -> GenerationRequest:
        prompt = self.prompt if isinstance(self.prompt, str) else self.prompt[0]
        return self.generation(prompt=prompt, max_tokens=self.asked_tokens() or default_max_tokens)


def request_payload(req: GenerationRequest, pair: str | None) -> tuple[str, dict[str, Any]]:
    """The path and OpenAI body that ask a daemon for `req` (`homespec ask` through a daemon);
    the inverse of `to_generation()`."""
    payload: dict[str, Any] = {
        "model": pair,
        "max_tokens": req.max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "seed": req.seed,
        "stop": req.stop or None,
        "task": req.task,
        "speculative": "auto" if req.speculative is None else req.speculative,
        "drafter": req.drafter,
        "draft_tokens": req.draft_tokens,
        "prediction": {"type": "content", "content": req.prediction} if req.prediction else None,
    }
    payload = {k: v for k, v in payload.items() if v is not None}
    if req.messages is not None:
        payload["messages"] = [{"role": m.role, "content": m.content} for m in req.messages]
        if req.messages and req.messages[-1].role == "assistant":
            payload["continue_final_message"] = req.chat.continue_last
        if not req.chat.generation_prompt:
            payload["add_generation_prompt"] = False
        if req.chat.variables:
            payload["chat_template_kwargs"] = dict(req.chat.variables)
        return "/v1/chat/completions", payload
    payload["prompt"] = req.prompt
    return "/v1/completions", payload


# Every name a request body may hold or be refused for: what OpenAI's `param` may name.
_FIELDS = (
    frozenset(ChatCompletionRequest.model_fields)
    | frozenset(CompletionRequest.model_fields)
    | frozenset(name for name, _, _ in refused_fields.CHECKS)
)
_PATH = re.compile(r"[a-z_]+(?:\[\d+\])?(?:\.[a-z_]+)*")


def error_param(where: str, message: str) -> str | None:
    """OpenAI's `param` for a refused body: the field a validation error names, by its place
    in the body (`where`, as `messages.0.role`) or, for a rule over the whole body (`where`
    empty), by the name its message starts with (`logprobs`, `top_logprobs=2 ...`,
    `messages[0].content holds ...`); None where it names none. Clients show it beside the
    message (the openai SDK's `BadRequestError.param`)."""
    if where:
        return where
    head = _PATH.match(message)
    if head and re.split(r"[\[.]", head.group())[0] in _FIELDS:
        return head.group()
    return None
