"""The daemon's API key, as the daemon reads it and as the CLI's client sends it."""

from __future__ import annotations

import os

from homespec.errors import ConfigError

API_KEY_ENV = "HOMESPEC_API_KEY"
KEY_HINT = "make it one line of printable ASCII, e.g. from `openssl rand -hex 32`"


def sendable(key: str, where: str) -> str:
    """`key`, where a client can send it: clients put it in an HTTP header, which carries
    printable ASCII. With a second line (a comment, a second key) or a non-ASCII character the
    daemon started and refused every request with 401, and the CLI's client was a traceback."""
    bad = next((c for c in key if not " " <= c <= "~"), None)
    if bad is not None:
        what = "a line break" if bad in "\r\n" else f"the character {bad!r}"
        raise ConfigError(
            f"{where}: the API key holds {what}, which no HTTP header carries", KEY_HINT
        )
    return key


def from_env() -> str | None:
    """$HOMESPEC_API_KEY, stripped and checked (None: unset or blank)."""
    key = os.environ.get(API_KEY_ENV, "").strip()
    return sendable(key, API_KEY_ENV) if key else None
