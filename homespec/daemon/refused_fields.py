"""Request fields homespec does not honour, refused by name unless they ask for nothing.

A client moved over from llama-server, vLLM or OpenAI keeps sending its settings; an answer
made without one of them must not pass for one made with it. Each table maps a field to the
test for its values that ask for nothing (what those servers take as "off"); anything else is
a 400 naming the field, its value and what to do. Fields that cannot change the answer
(`cache_prompt`, `n_keep`, `timings_per_token`, `user`, ...) are not here: they are ignored.
llama.cpp's `samplers` (its filters' order) is not refused either: homespec's order is
documented (each filter on the tempered distribution) and llama.cpp's web page sends one on
every request.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

Neutral = Callable[[Any], bool]


def _off(*neutral: Any) -> Neutral:
    return lambda v: v is None or v in neutral


def _empty(v: Any) -> bool:
    return not v


def _none(v: Any) -> bool:
    return v is None


def _not_positive(v: Any) -> bool:
    return v is None or (isinstance(v, int | float) and not isinstance(v, bool) and v <= 0)


# Other servers' samplers and output constraints: all refused with the same "instead".
SAMPLERS: dict[str, Neutral] = {
    "repeat_penalty": _off(1, 1.0),
    "repetition_penalty": _off(1, 1.0),
    "typical_p": _off(1, 1.0),
    "tfs_z": _off(1, 1.0),
    "mirostat": _off(0, False),
    "dry_multiplier": _off(0, 0.0),
    "xtc_probability": _off(0, 0.0),
    "dynatemp_range": _off(0, 0.0),
    "top_n_sigma": _not_positive,
    "adaptive_target": lambda v: v is None or (isinstance(v, int | float) and v < 0),
    "min_keep": _off(0),
    "ignore_eos": _off(False),
    "min_tokens": _off(0),
    "top_a": _off(0, 0.0),
    "smoothing_factor": _off(0, 0.0),
    "epsilon_cutoff": _off(0, 0.0),
    "eta_cutoff": _off(0, 0.0),
    "no_repeat_ngram_size": _off(0),
    "use_beam_search": _off(False),
    "bad_words": _empty,
    "allowed_token_ids": _empty,
    "grammar": _empty,
    "json_schema": _empty,
    "guided_json": _empty,
    "guided_regex": _empty,
    "guided_choice": _empty,
    "guided_grammar": _empty,
    "structural_tag": _empty,
}
SAMPLERS_INSTEAD = "homespec samples with temperature, top_p, top_k and min_p only: leave it out"

TEXT_ONLY = "homespec answers in text only"
NO_PROBS = "homespec returns no token probabilities: leave it out"

# Fields for what homespec does not do, each with what to do instead: OpenAI's own (an audio
# reply, a web search, a steered reasoning or length), then llama.cpp's and vLLM's.
ELSEWHERE: dict[str, tuple[Neutral, str]] = {
    "modalities": (
        lambda v: v is None or (isinstance(v, list) and set(v) <= {"text"}),
        f'{TEXT_ONLY}: send ["text"] or leave it out',
    ),
    "audio": (_none, f"{TEXT_ONLY}: leave it out"),
    "web_search_options": (
        _none,
        "homespec answers from the model alone, without searching: leave it out",
    ),
    "reasoning_effort": (_none, "homespec does not steer a model's reasoning: leave it out"),
    "verbosity": (
        _none,
        "homespec does not steer an answer's length: leave it out (max_tokens caps it)",
    ),
    "top_logprobs": (_off(0), NO_PROBS),
    # llama.cpp's
    "n_probs": (_off(0), NO_PROBS),
    "n_cmpl": (_off(1), "homespec answers one choice per request: send 1 or leave it out"),
    "n_indent": (_off(0), "homespec does not hold answers to an indentation: leave it out"),
    "t_max_predict_ms": (
        _not_positive,
        "homespec does not cut answers by time: cap them with max_tokens",
    ),
    "reasoning_budget_tokens": (
        _off(-1),
        "homespec does not cap a model's reasoning: leave it out",
    ),
    "lora": (_empty, "homespec loads no LoRA adapters: leave it out"),
    "response_fields": (_empty, "homespec sends whole responses: leave it out"),
    # vLLM's
    "include_stop_str_in_output": (
        _off(False),
        "homespec's answers end before the stop string: leave it out (finish_reason says stop)",
    ),
    "skip_special_tokens": (
        _off(True),
        "homespec's answers leave special tokens out: leave it out",
    ),
    "stop_token_ids": (_empty, "send stop strings (stop) instead"),
    "prompt_logprobs": (_none, NO_PROBS),
    "truncate_prompt_tokens": (
        _none,
        "homespec does not cut prompts (a prompt over the context is refused): shorten it",
    ),
    "chat_template": (
        _empty,
        "homespec renders the model's own chat template: leave it out "
        "(chat_template_kwargs reach that template)",
    ),
    "documents": (_empty, "homespec's templates get no documents: put them in the messages"),
}


CHECKS = tuple(
    [(name, nothing, SAMPLERS_INSTEAD) for name, nothing in SAMPLERS.items()]
    + [(name, nothing, why) for name, (nothing, why) in ELSEWHERE.items()]
)


def refusal(data: dict[str, Any]) -> str:
    """Why a request body asks for what homespec does not do ("" when it does not)."""
    for name, asks_nothing, instead in CHECKS:
        value = data.get(name)
        try:
            neutral = asks_nothing(value)
        except TypeError:  # unhashable: a list or an object where a number or string goes
            neutral = False
        if not neutral:
            return f"{name}={json.dumps(value)[:80]} is not supported: {instead}"
    return ""
