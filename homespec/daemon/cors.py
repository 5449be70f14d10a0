"""Which web pages' scripts may call the API from a browser (CORS), from `[server]
cors_origins`.

A browser asks before a page's script may POST JSON to another origin (a preflight OPTIONS);
without an answer the page cannot reach the daemon at all, with a wrong one any page the user
opens could read the models' answers. So the answer is Starlette's CORSMiddleware (app.py)
over the list in models.toml: by default pages served from this machine (any port), the way a
chat UI run beside the daemon is. It sits outside the API-key gate: a preflight carries no key,
and a 401 must reach the page readable. The gate still checks every real request.
"""

from __future__ import annotations

import re
from typing import Any

from homespec.errors import ConfigError

# Headers a page's script may read besides the safe ones: the request's id, a 503's wait.
EXPOSED = ["x-request-id", "retry-after"]


def origin_pattern(origins: list[str]) -> str:
    """One regular expression for `origins` (an origin without a port matches any port)."""
    alts = [
        re.escape(o.lower()) + ("" if re.search(r":\d+$", o) else r"(?::\d+)?") for o in origins
    ]
    return f"(?:{'|'.join(alts)})"


def check(origins: list[str], *, has_key: bool) -> None:
    """Refuse "*" on a daemon without an API key: every page the user opens could use it."""
    if "*" in origins and not has_key:
        raise ConfigError(
            '[server] cors_origins has "*" on a daemon without an API key: any web page the '
            "user opens could use the models",
            "list the origins of your web UI instead, or set an API key",
        )


def options(origins: list[str]) -> dict[str, Any] | None:
    """CORSMiddleware's settings for `origins` (None: no CORS answers at all)."""
    if not origins:
        return None
    anyone = "*" in origins
    return {
        "allow_origins": ["*"] if anyone else [],
        "allow_origin_regex": None if anyone else origin_pattern(origins),
        "allow_methods": ["GET", "POST", "HEAD"],
        "allow_headers": ["*"],  # the OpenAI SDKs send their own (x-stainless-*) beside the key
        "expose_headers": EXPOSED,
        "max_age": 600,
    }
