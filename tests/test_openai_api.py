"""The OpenAI request bodies: what `homespec ask` sends parses back to the same request, and
fields that would change the answer are refused by name instead of dropped."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from homespec.daemon.openai_api import ChatCompletionRequest, CompletionRequest, request_payload
from homespec.engine.types import ChatFormat, GenerationRequest, Message

CHAT = [Message("system", "Be brief."), Message("user", "Name a fruit.")]


@pytest.mark.parametrize(
    "req",
    [
        GenerationRequest(messages=CHAT, max_tokens=40),
        GenerationRequest(
            messages=CHAT,
            max_tokens=7,
            temperature=0.7,
            top_p=0.9,
            top_k=40,
            min_p=0.05,
            seed=3,
            stop=["\n\n", "END"],
            task="code",
            speculative=False,
            drafter="ngram",
            draft_tokens=12,
            prediction="An apple.",
        ),
        GenerationRequest(messages=CHAT, speculative=True, drafter="model"),
        GenerationRequest(prompt="1, 2, 3,", max_tokens=8, speculative=None),
        GenerationRequest(
            messages=[*CHAT, Message("assistant", "A")],
            chat=ChatFormat(continue_last=True, variables={"enable_thinking": False}),
        ),
        GenerationRequest(messages=[*CHAT, Message("assistant", "A pear.")]),
        GenerationRequest(messages=CHAT, chat=ChatFormat(generation_prompt=False)),
    ],
    ids=["plain", "every-field", "forced", "raw-prompt", "prefill", "answered", "no-opening"],
)
def test_the_payload_ask_sends_parses_back_to_the_same_request(req: GenerationRequest) -> None:
    path, payload = request_payload(req, "smollm2")
    assert payload["model"] == "smollm2"
    body: ChatCompletionRequest | CompletionRequest
    if req.messages is not None:
        assert path == "/v1/chat/completions"
        body = ChatCompletionRequest.model_validate(payload)
    else:
        assert path == "/v1/completions"
        body = CompletionRequest.model_validate(payload)
    assert body.to_generation(default_max_tokens=999) == req


def chat(**extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "x"}], **extra}


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": -1}, "frequency_penalty"),
        ({"repetition_penalty": 1.1}, "repetition_penalty"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"response_format": {"type": "json_object"}}, "response_format 'json_object'"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"logprobs": True}, "logprobs"),
    ],
)
def test_fields_that_would_change_the_answer_are_refused_by_name(
    extra: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValidationError, match=named):
        ChatCompletionRequest.model_validate(chat(**extra))


@pytest.mark.parametrize(
    ("message", "named"),
    [
        (
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
            "content[0] has type 'image_url': only text parts",
        ),
        ({"role": "user", "content": [{"type": "text", "text": "a"}, "b"]}, "content[1] has type"),
        ({"role": "tool", "tool_call_id": "1", "content": "42"}, "tool calls and tool results"),
        (
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
            "tool calls and tool results",
        ),
        ({"role": "system", "content": None}, "content is missing or null"),
    ],
    ids=["image", "bare-string-part", "tool-result", "tool-call", "null"],
)
def test_what_a_text_only_server_cannot_read_is_named(message: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(named)) as info:
        ChatCompletionRequest.model_validate({"messages": [message]})
    assert len(info.value.errors()) == 1  # that one reason, not every union branch's mismatch


def test_text_parts_are_joined() -> None:
    parts = [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}]
    body = ChatCompletionRequest.model_validate(chat(messages=[{"role": "user", "content": parts}]))
    assert body.messages[0].text() == "a b"


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"echo": True}, "echo is not supported"),
        ({"suffix": "}\n"}, "suffix (fill in the middle) is not supported"),
        ({"best_of": 3}, "best_of is not supported"),
        ({"prompt": [1, 2, 3]}, "a prompt of token ids is not supported"),
        ({"prompt": [[1, 2]]}, "a prompt of token ids is not supported"),
        ({"prompt": ["a", "b"]}, "one prompt per request"),
    ],
    ids=["echo", "suffix", "best_of", "token-ids", "token-id-lists", "two-prompts"],
)
def test_completion_fields_that_would_change_the_answer_are_refused_by_name(
    extra: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValidationError, match=re.escape(named)):
        CompletionRequest.model_validate({"prompt": "def f(", **extra})


def test_completion_fields_that_ask_for_nothing_are_accepted() -> None:
    body = CompletionRequest.model_validate(
        {"prompt": ["def f("], "echo": False, "suffix": "", "best_of": 1, "max_tokens": 3}
    )
    assert body.to_generation(default_max_tokens=5).prompt == "def f("


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"repeat_penalty": 1.1}, "repeat_penalty=1.1"),
        ({"mirostat": 2}, "mirostat=2"),
        ({"typical_p": 0.9}, "typical_p"),
        ({"grammar": 'root ::= "yes" | "no"'}, "grammar="),
        ({"json_schema": {"type": "object"}}, "json_schema="),
        ({"guided_choice": ["yes", "no"]}, "guided_choice="),
        ({"dry_multiplier": 0.8}, "dry_multiplier"),
        ({"xtc_probability": 0.5}, "xtc_probability"),
        ({"ignore_eos": True}, "ignore_eos=true"),
        ({"top_a": 0.2}, "top_a=0.2"),
        ({"use_beam_search": True}, "use_beam_search=true"),
        ({"min_tokens": 10}, "min_tokens"),
        ({"top_logprobs": 3}, "top_logprobs=3 is not supported: homespec returns no token prob"),
        ({"n_probs": 3}, "n_probs=3 is not supported: homespec returns no token probabilities"),
        ({"repeat_penalty": [1, 2]}, "repeat_penalty=[1, 2]"),
        ({"min_p": 1.5}, "min_p"),
        ({"n_predict": 0}, "n_predict 0"),
        ({"n_predict": 5, "max_tokens": 6}, "disagree"),
        # taken in silence, the newer name won and max_tokens was dropped
        ({"max_tokens": 5, "max_completion_tokens": 9}, "9 and max_tokens 5 disagree"),
        ({"n_predict": 7, "max_completion_tokens": 9}, "9 and n_predict 7 disagree"),
        ({"max_completion_tokens": 2_000_000}, "max_completion_tokens"),
        # OpenAI's own, for what homespec does not do
        ({"modalities": ["text", "audio"]}, 'modalities=["text", "audio"]'),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio="),
        ({"web_search_options": {}}, "web_search_options={}"),
        ({"reasoning_effort": "low"}, 'reasoning_effort="low"'),
        ({"verbosity": "high"}, 'verbosity="high"'),
        # llama.cpp's and vLLM's, for what homespec does not do
        ({"t_max_predict_ms": 500}, "t_max_predict_ms=500 is not supported: homespec does not cut"),
        ({"n_indent": 4}, "n_indent=4"),
        ({"n_cmpl": 2}, "n_cmpl=2 is not supported: homespec answers one choice"),
        ({"lora": [{"id": 0, "scale": 1.0}]}, "lora="),
        ({"min_keep": 5}, "min_keep=5"),
        ({"adaptive_target": 0.5}, "adaptive_target=0.5"),
        ({"include_stop_str_in_output": True}, "include_stop_str_in_output=true"),
        ({"skip_special_tokens": False}, "skip_special_tokens=false"),
        ({"stop_token_ids": [2]}, "stop_token_ids=[2] is not supported: send stop strings"),
        ({"bad_words": ["x"]}, 'bad_words=["x"]'),
        ({"allowed_token_ids": [1, 2]}, "allowed_token_ids="),
        ({"prompt_logprobs": 0}, "prompt_logprobs=0"),
        ({"truncate_prompt_tokens": 5}, "truncate_prompt_tokens=5"),
        ({"chat_template": "{{ messages }}"}, 'chat_template="{{ messages }}"'),
        ({"documents": [{"text": "x"}]}, "documents="),
        ({"reasoning_budget_tokens": 0}, "reasoning_budget_tokens=0"),
        ({"modalities": [{"type": "text"}]}, 'modalities=[{"type": "text"}]'),
    ],
)
def test_other_servers_sampling_fields_are_refused_by_name_unless_they_ask_for_nothing(
    extra: dict[str, Any], named: str
) -> None:
    """A client moved over from llama-server or vLLM sends their samplers' settings; taken
    in silence, its answers would pass for ones made with them."""
    with pytest.raises(ValidationError, match=re.escape(named)):
        ChatCompletionRequest.model_validate(chat(**extra))


def test_more_stop_strings_than_openais_four_are_taken_as_llama_server_takes_them() -> None:
    stops = [f"END{i}" for i in range(16)]
    assert ChatCompletionRequest.model_validate(chat(stop=stops)).to_generation(5).stop == stops


def test_null_is_the_default_for_every_optional_field() -> None:
    """OpenAI takes `"n": null`, `"stream": null` as the defaults; clients that write every
    field of their own request model send them (they were 400s)."""
    body = ChatCompletionRequest.model_validate(
        chat(n=None, stream=None, speculative=None, stop=None, temperature=None, seed=None)
    )
    assert (body.n, body.stream, body.speculative) == (1, False, "auto")
    opts = ChatCompletionRequest.model_validate(chat(stream_options={"include_usage": None}))
    assert opts.stream_options is not None and opts.stream_options.include_usage is False
    raw = CompletionRequest.model_validate({"prompt": "x", "echo": None, "n": None})
    assert (raw.echo, raw.n, raw.stream) == (False, 1, False)
    with pytest.raises(ValidationError, match="prompt"):  # required: no default to take
        CompletionRequest.model_validate({"prompt": None})


def test_min_p_and_n_predict_are_honoured() -> None:
    req = ChatCompletionRequest.model_validate(chat(min_p=0.1, n_predict=12))
    gen = req.to_generation(default_max_tokens=99)
    assert (gen.min_p, gen.max_tokens) == (0.1, 12)
    raw = CompletionRequest.model_validate({"prompt": "x", "n_predict": 7})
    assert raw.to_generation(default_max_tokens=99).max_tokens == 7
    # -1 is llama.cpp's "no cap", under either name: the daemon's default applies
    assert ChatCompletionRequest.model_validate(chat(n_predict=-1)).asked_tokens() is None
    for name in ("max_tokens", "max_completion_tokens"):
        unset = ChatCompletionRequest.model_validate(chat(**{name: -1}))
        assert unset.asked_tokens() is None
        assert unset.to_generation(default_max_tokens=99).max_tokens == 99
    assert (
        CompletionRequest.model_validate({"prompt": "x", "max_tokens": -1}).asked_tokens() is None
    )
    with pytest.raises(ValidationError, match="max_tokens"):
        ChatCompletionRequest.model_validate(chat(max_tokens=-2))
    same = ChatCompletionRequest.model_validate(chat(n_predict=6, max_tokens=6))
    assert same.to_generation(default_max_tokens=99).max_tokens == 6
    both = ChatCompletionRequest.model_validate(chat(max_tokens=6, max_completion_tokens=6))
    assert both.to_generation(default_max_tokens=99).max_tokens == 6


def test_fields_that_ask_for_nothing_are_accepted() -> None:
    body = ChatCompletionRequest.model_validate(
        chat(
            presence_penalty=0,
            frequency_penalty=0.0,
            logit_bias={},
            user="me",
            response_format={"type": "text"},
            tool_choice="none",
            metadata={"k": "v"},
            modalities=["text"],
            audio=None,
            reasoning_effort=None,
            store=False,
            service_tier="auto",
            # llama-server's own defaults for its samplers that are off
            repeat_penalty=1.0,
            mirostat=0,
            typical_p=1.0,
            grammar="",
            json_schema=None,
            dry_multiplier=0.0,
            xtc_probability=0.0,
            top_n_sigma=-1.0,
            ignore_eos=False,
            n_probs=0,
            cache_prompt=True,
            samplers=["top_k", "top_p", "min_p", "temperature"],
            adaptive_target=-1.0,
            min_keep=0,
            n_indent=0,
            n_cmpl=1,
            t_max_predict_ms=-1,
            reasoning_budget_tokens=-1,
            lora=[],
            # vLLM's defaults
            top_k=-1,
            include_stop_str_in_output=False,
            skip_special_tokens=True,
            stop_token_ids=[],
            bad_words=None,
            chat_template=None,
        )
    )
    assert body.to_generation(default_max_tokens=5).max_tokens == 5


@pytest.mark.parametrize(
    "name", ["max_tokens", "max_completion_tokens", "temperature", "seed", "top_k", "n"]
)
def test_a_boolean_where_a_number_goes_is_refused_not_read_as_one(name: str) -> None:
    """pydantic reads JSON true as 1: `max_tokens: true` answered one token, in silence."""
    with pytest.raises(ValidationError, match=f"{name}=true is not a number"):
        ChatCompletionRequest.model_validate(chat(**{name: True}))
    with pytest.raises(ValidationError, match="max_tokens=false is not a number"):
        CompletionRequest.model_validate({"prompt": "a", "max_tokens": False})
    assert ChatCompletionRequest.model_validate(chat(**{name: 1})).model_dump()[name] == 1


def test_a_seed_of_minus_one_is_llama_cpps_fresh_seed_and_other_negatives_are_refused() -> None:
    assert ChatCompletionRequest.model_validate(chat(seed=-1)).to_generation(5).seed is None
    with pytest.raises(ValidationError, match=r"seed -2: send 0 or more, or -1"):
        ChatCompletionRequest.model_validate(chat(seed=-2))


def test_a_top_k_of_minus_one_is_vllms_no_top_k_and_other_negatives_are_refused() -> None:
    """vLLM clients send -1 for "every token": off, and so over models.toml's own top_k
    (None would fall back to it)."""
    assert ChatCompletionRequest.model_validate(chat(top_k=-1)).to_generation(5).top_k == 0
    assert ChatCompletionRequest.model_validate(chat(top_k=40)).to_generation(5).top_k == 40
    with pytest.raises(ValidationError, match=r"top_k -2: send 1 or more, or 0 or -1"):
        ChatCompletionRequest.model_validate(chat(top_k=-2))


def _rendering(messages: list[dict[str, str]], **extra: Any) -> ChatFormat:
    return ChatCompletionRequest.model_validate({"messages": messages, **extra}).chat_format()


def test_a_last_assistant_message_is_continued_unless_the_request_opens_a_new_turn() -> None:
    """llama-server's default (a prefill); vLLM's continue_final_message and
    add_generation_prompt say it either way."""
    q = {"role": "user", "content": "Name a fruit."}
    begun = [q, {"role": "assistant", "content": "A"}]
    assert _rendering(begun) == ChatFormat(continue_last=True)
    assert _rendering(begun, continue_final_message=True).continue_last
    assert not _rendering(begun, continue_final_message=False).continue_last
    assert not _rendering(begun, add_generation_prompt=True).continue_last
    assert _rendering([q]) == ChatFormat()
    assert _rendering([q], add_generation_prompt=False) == ChatFormat(generation_prompt=False)
    kwargs = {"enable_thinking": False, "tools_hint": [1, 2]}
    assert _rendering([q], chat_template_kwargs=kwargs).variables == kwargs


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (
            {"continue_final_message": True},
            "continue_final_message: the last message is the user's",
        ),
        (
            {
                "messages": [{"role": "assistant", "content": "A"}],
                "continue_final_message": True,
                "add_generation_prompt": True,
            },
            "continue_final_message and add_generation_prompt are both true",
        ),
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs: messages is set by"),
        ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs"),
    ],
)
def test_a_rendering_that_cannot_be_done_is_refused_by_name(
    extra: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValidationError, match=re.escape(named)):
        ChatCompletionRequest.model_validate(chat(**extra))
