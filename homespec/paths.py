"""Where homespec keeps its own files (caches, derived models' bookkeeping, the request log)."""

from __future__ import annotations

import os
from pathlib import Path

from homespec.errors import ConfigError

HOME_ENV = "HOMESPEC_HOME"
STATE_ENV = "HOMESPEC_STATE_DIR"
CACHE_ENV = "HOMESPEC_CACHE_DIR"


def _directory(chosen: str | os.PathLike[str] | None, xdg_var: str, xdg_default: str) -> Path:
    """`chosen`, else $`xdg_var`/homespec, else `xdg_default`/homespec (created)."""
    if chosen:
        base = Path(chosen).expanduser()
    else:
        base = Path(os.environ.get(xdg_var) or xdg_default).expanduser() / "homespec"
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot create directory {base}: {exc.strerror or exc}",
            "point it at a writable directory (or fix the permissions)",
        ) from None
    return base


def home_dir() -> Path:
    """$HOMESPEC_HOME, else $XDG_DATA_HOME/homespec, else ~/.local/share/homespec (created)."""
    return _directory(os.environ.get(HOME_ENV), "XDG_DATA_HOME", "~/.local/share")


def state_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Where the daemon keeps its request log: --state-dir, $HOMESPEC_STATE_DIR, else
    $XDG_STATE_HOME/homespec, else ~/.local/state/homespec (created)."""
    return _directory(explicit or os.environ.get(STATE_ENV), "XDG_STATE_HOME", "~/.local/state")


def cache_dir() -> Path:
    """Facts about this machine worth remembering (the canary's verdicts): $HOMESPEC_CACHE_DIR,
    else $CACHE_DIRECTORY (systemd's CacheDirectory=), else $XDG_CACHE_HOME/homespec, else
    ~/.cache/homespec (created)."""
    chosen = os.environ.get(CACHE_ENV) or os.environ.get("CACHE_DIRECTORY")
    return _directory(chosen, "XDG_CACHE_HOME", "~/.cache")
