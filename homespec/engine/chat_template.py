"""The model's chat template, rendered as the model's authors wrote it (Jinja).

A GGUF carries its chat template as Jinja source (`tokenizer.chat_template`). llama.cpp's
built-in renderer (`llama_chat_apply_template`) only recognises well-known templates by their
look and re-implements them in C++, leaving out what it does not model: SmolLM2's template adds
a default system turn when a chat has none, and the built-in chatml does not, so the same
question got a different prompt, and a different answer, from homespec than from llama-server
(which renders the Jinja source) or the model's own reference code. So templates are rendered
here the way Hugging Face's `apply_chat_template` does: a sandboxed Jinja environment with
`raise_exception` and `strftime_now`, `bos_token` / `eos_token`, `add_generation_prompt`.

Pure: no llama.cpp. The engine passes the template source and the special tokens' text.
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from homespec.engine.types import Message
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


def render(source: str, messages: list[Message], *, bos_token: str, eos_token: str) -> str:
    """The prompt for `messages`, ending where the assistant's answer starts."""
    try:
        return _compiled(source).render(
            messages=[{"role": m.role, "content": m.content} for m in messages],
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=True,
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
    builtin: Callable[[], str],
) -> str:
    """A chat's prompt for the model file named `model` whose template is `source`.

    A template that is not valid Jinja is rendered by `builtin` (llama.cpp's renderer, which
    knows the common templates by their look) instead, with a warning at load and in every
    request's prompt_format. A base model without a template ("") gets a plain "Role: text"
    transcript; the engine reports that in the request's stats (`prompt_format`). The prompt
    leaves out a leading BOS where the tokenizer adds one itself: not twice.
    """
    if not source:
        turns = [f"{m.role.capitalize()}: {m.content}" for m in messages]
        return "\n\n".join([*turns, "Assistant:"])
    try:
        text = render(source, messages, bos_token=bos_token, eos_token=eos_token)
    except InvalidTemplate as exc:
        LOG.debug("%s: %s; using llama.cpp's built-in renderer", model, exc)
        return builtin()
    except TemplateError as exc:
        raise RequestError(
            f"{model}'s chat template cannot render these messages: {exc}",
            "check the roles and their order (many templates want user and assistant "
            "turns to alternate), or send a raw prompt",
        ) from None
    if bos_token and add_bos and text.startswith(bos_token):
        text = text[len(bos_token) :]
    return text
