"""The model's chat template, rendered as the model's authors wrote it (Jinja).

A GGUF carries its chat template as Jinja source (`tokenizer.chat_template`). llama.cpp's
built-in renderer (`llama_chat_apply_template`) only recognises well-known templates by their
look and re-implements them in C++, leaving out what it does not model: SmolLM2's template adds
a default system turn when a chat has none, and the built-in chatml does not, so the same
question got a different prompt, and a different answer, from homespec than from llama-server
(which renders the Jinja source) or the model's own reference code. So templates are rendered
here the way Hugging Face's `apply_chat_template` does: a sandboxed Jinja environment with
`raise_exception` and `strftime_now`, `bos_token` / `eos_token`, `add_generation_prompt`, and
the request's own template variables (`chat_template_kwargs`: `enable_thinking`).

A chat whose last message is the assistant's is continued (a prefill, llama-server's default):
the chat before it is rendered opened for the assistant's turn and that message's text follows,
unclosed, the way llama.cpp's common_chat_templates_apply continues a final message.

Pure: no llama.cpp. The engine passes the template source and the special tokens' text.
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from homespec.engine.types import PLAIN_CHAT, ChatFormat, Message
from homespec.errors import RequestError

LOG = logging.getLogger("homespec.engine")


class TemplateError(Exception):
    """The template cannot render this chat (it raised, e.g. roles that do not alternate)."""


class InvalidTemplate(TemplateError):
    """The template is not valid Jinja (or uses what this renderer lacks)."""


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


@lru_cache(maxsize=8)
def _compiled(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateError as exc:
        raise InvalidTemplate(f"the chat template is not valid Jinja: {exc}") from None


def problem(source: str) -> str:
    """Why this template cannot be rendered here ("" when it can)."""
    try:
        _compiled(source)
    except InvalidTemplate as exc:
        return str(exc)
    return ""


# What the renderer itself gives a template: a request's variables may not replace them.
RESERVED = frozenset(
    {
        "messages",
        "bos_token",
        "eos_token",
        "add_generation_prompt",
        "raise_exception",
        "strftime_now",
    }
)


def render(
    source: str,
    messages: list[Message],
    *,
    bos_token: str,
    eos_token: str,
    generation_prompt: bool = True,
    variables: Mapping[str, Any] | None = None,
) -> str:
    """The prompt for `messages`, ending where the assistant's answer starts (unless
    `generation_prompt` is off); `variables` are extra values the template may read."""
    extra = {k: v for k, v in (variables or {}).items() if k not in RESERVED}
    try:
        return _compiled(source).render(
            **extra,
            messages=[{"role": m.role, "content": m.content} for m in messages],
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=generation_prompt,
        )
    except TemplateError:
        raise
    except Exception as exc:  # a template is a program: whatever it raises is this chat's
        raise TemplateError(f"the chat template failed: {exc}") from None


def chat_prompt(
    source: str,
    messages: list[Message],
    *,
    model: str,
    bos_token: str,
    eos_token: str,
    add_bos: bool,
    builtin: Callable[[list[Message], bool], str],
    fmt: ChatFormat = PLAIN_CHAT,
) -> str:
    """A chat's prompt for the model file named `model` whose template is `source`.

    A template that is not valid Jinja is rendered by `builtin(messages, generation_prompt)`
    (llama.cpp's renderer, which knows the common templates by their look) instead, with a
    warning at load and in every request's prompt_format. A base model without a template ("")
    gets a plain "Role: text" transcript; the engine reports that in the request's stats
    (`prompt_format`). Neither takes template variables, so a request with some is refused
    there rather than answered without them. The prompt leaves out a leading BOS where the tokenizer
    adds one itself: not twice. `fmt.continue_last`: the last message is continued (above).
    """
    head, tail = (messages[:-1], messages[-1].content) if fmt.continue_last else (messages, "")
    opened = fmt.generation_prompt or fmt.continue_last
    if not source:
        if fmt.variables:
            raise RequestError(
                f"{model} has no chat template (a base model gets a plain transcript), so "
                f"chat_template_kwargs ({', '.join(sorted(fmt.variables))}) have nothing to "
                "reach",
                "leave chat_template_kwargs out for this model",
            )
        turns = [f"{m.role.capitalize()}: {m.content}" for m in head]
        if fmt.continue_last:
            return "\n\n".join([*turns, f"Assistant: {tail}"])
        return "\n\n".join([*turns, "Assistant:"] if opened else turns)
    try:
        text = render(
            source,
            head,
            bos_token=bos_token,
            eos_token=eos_token,
            generation_prompt=opened,
            variables=fmt.variables,
        )
    except InvalidTemplate as exc:
        if fmt.variables:
            raise RequestError(
                f"{model}'s chat template is rendered by llama.cpp's built-in look-alike "
                f"({exc}), which takes no template variables",
                "leave chat_template_kwargs out for this model",
            ) from None
        LOG.debug("%s: %s; using llama.cpp's built-in renderer", model, exc)
        return builtin(head, opened) + tail
    except TemplateError as exc:
        raise RequestError(
            f"{model}'s chat template cannot render these messages: {exc}",
            "check the roles and their order (many templates want user and assistant "
            "turns to alternate), or send a raw prompt",
        ) from None
    if bos_token and add_bos and text.startswith(bos_token):
        text = text[len(bos_token) :]
    return text + tail
