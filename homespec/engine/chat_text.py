"""A chat rendered for the model with only the template's own markers as control tokens.

The chat template turns messages into one string (`<|im_start|>user\\nHi<|im_end|>…`).
Tokenizing that string with special-token parsing on would also turn a `<|im_end|>` that a
user typed into a real end-of-turn, so a message could forge a system turn. Instead the
template is rendered a second time with a placeholder for each message's content; the text
between placeholders is the template's (parsed for special tokens), the placeholders' places
are the contents (tokenized as plain text). A pair may opt out (`allow_special_tokens`).
A raw prompt (/v1/completions) is the caller's own rendering, its control tokens meant.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from homespec.engine.target import Target, Vocabulary
from homespec.engine.types import PLAIN_CHAT, ChatFormat, GenerationRequest, Message
from homespec.errors import RequestError

# Private-use characters: no template writes them, and no strip() (C's or Python's) removes them.
_MARK = "\ue000homespec-content-{}\ue001"
_SPLIT = re.compile("\ue000homespec-content-(\\d+)\ue001")


def split_chat(
    model: Vocabulary, messages: list[Message], fmt: ChatFormat = PLAIN_CHAT
) -> list[tuple[str, bool]]:
    """The rendered prompt as (text, is_content) pieces that concatenate to the template's
    output. Templates that trim contents are matched by trying the stripped text too."""
    real = model.chat_prompt(messages, fmt)
    marks = [Message(m.role, _MARK.format(i)) for i, m in enumerate(messages)]
    marked = model.chat_prompt(marks, fmt)
    pieces = _SPLIT.split(marked)  # template, index, template, index, …, template
    variants: list[Callable[[str], str]] = [str, str.strip]
    parts: list[tuple[str, bool]] = []
    for variant in variants:
        parts = [
            (variant(messages[int(p)].content), True) if j % 2 else (p, False)
            for j, p in enumerate(pieces)
        ]
        if "".join(text for text, _ in parts) == real:
            break
    return [(text, content) for text, content in parts if text]


def chat_tokens(
    model: Vocabulary,
    messages: list[Message],
    *,
    allow_special: bool,
    fmt: ChatFormat = PLAIN_CHAT,
) -> list[int]:
    """The prompt's tokens: BOS (when the model wants one), template markers as control
    tokens, message contents as text (or as written, with `allow_special`)."""
    if allow_special:
        return model.tokenize(model.chat_prompt(messages, fmt), special=True)
    tokens: list[int] = []
    for i, (text, content) in enumerate(split_chat(model, messages, fmt)):
        tokens += model.tokenize(text, special=not content, add_bos=i == 0)
    return tokens


PROMPT_FORMATS = {
    "chat": "chat template",
    "builtin": "llama.cpp's built-in look-alike of the chat template",
    "transcript": "plain transcript (the target has no chat template)",
    "raw": "raw prompt",
}


def prompt_tokens(
    target: Target, req: GenerationRequest, *, pair: str, allow_special: bool
) -> tuple[list[int], str]:
    """The prompt's tokens and how it was rendered (one of PROMPT_FORMATS' values); a
    RequestError for a prompt that is empty or leaves no room in the context."""
    model = target.model
    if req.messages is not None:
        tokens = chat_tokens(model, req.messages, allow_special=allow_special, fmt=req.chat)
        if not model.has_chat_template():
            how = PROMPT_FORMATS["transcript"]
        elif problem := model.template_problem():
            how = f"{PROMPT_FORMATS['builtin']} ({problem})"
        else:
            how = PROMPT_FORMATS["chat"]
        if asked := req.chat.describe():
            how = f"{how}; {asked}"
    elif req.prompt is not None:
        tokens, how = model.tokenize(req.prompt, special=True), PROMPT_FORMATS["raw"]
    else:
        raise RequestError("request has neither messages nor a prompt", "send one of them")
    if not tokens:
        raise RequestError("the prompt is empty", "send some text")
    if len(tokens) >= target.n_ctx:
        raise RequestError(
            f"the prompt is {len(tokens)} tokens but pair {pair!r} has a "
            f"{target.n_ctx}-token context (room is needed for at least one answer token)",
            "shorten the prompt or raise n_ctx in models.toml",
        )
    return tokens, how
