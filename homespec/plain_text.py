"""What counts as text a model may read: no NUL (llama.cpp's tokenizer stops at one, cutting the
prompt short in silence) and no lone UTF-16 surrogate (not text at all: UTF-8 cannot encode it,
and tokenizing one raised UnicodeEncodeError). Python makes the latter from bytes that are not
UTF-8 (`surrogateescape`: a Latin-1 "é" piped to `homespec ask -` became "\\udce9") and from a
JSON escape such as "\\ud800". The daemon, the CLI and the bench's workloads all check here."""

from __future__ import annotations

import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")
NOT_UTF8_HINT = "convert it to UTF-8 first (e.g. iconv -f latin1 -t utf-8)"


def text_problem(text: str, *, from_bytes: bool = False) -> str | None:
    """What makes `text` no text a model may read, or None. `from_bytes`: `text` was decoded
    with surrogateescape (argv, stdin, a file), so a surrogate U+DC80-U+DCFF is a byte that
    was not UTF-8, not an escape someone wrote."""
    nul = text.find("\x00")
    if nul >= 0:
        return f"holds a NUL character (\\u0000) at character {nul + 1}"
    found = _SURROGATE.search(text)
    if found is None:
        return None
    c, i = found.group(), found.start()
    if from_bytes and "\udc80" <= c <= "\udcff":
        return f"is not UTF-8: byte 0x{ord(c) - 0xDC00:02x} at character {i + 1}"
    return f"holds a lone UTF-16 surrogate (\\u{ord(c):04x}), which is not text"


def bad_text(value: Any, where: str) -> str | None:
    """The first string inside `value` (a str, or JSON's dicts and lists) that is no text a model
    may read, described by its path (`messages[0].content holds ...`)."""
    if isinstance(value, str):
        problem = text_problem(value)
        return f"{where} {problem}" if problem else None
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            found = bad_text(str(key), path) or bad_text(item, path)
            if found:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = bad_text(item, f"{where}[{i}]")
            if found:
                return found
    return None
