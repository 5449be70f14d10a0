"""Where homespec keeps its own files (caches, derived models' bookkeeping)."""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "HOMESPEC_HOME"


def home_dir() -> Path:
    """$HOMESPEC_HOME, else $XDG_DATA_HOME/homespec, else ~/.local/share/homespec (created)."""
    explicit = os.environ.get(HOME_ENV)
    if explicit:
        base = Path(explicit).expanduser()
    else:
        xdg = os.environ.get("XDG_DATA_HOME") or "~/.local/share"
        base = Path(xdg).expanduser() / "homespec"
    base.mkdir(parents=True, exist_ok=True)
    return base


STATE_ENV = "HOMESPEC_STATE_DIR"


def state_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Where the daemon keeps its request log: --state-dir, $HOMESPEC_STATE_DIR, else
    $XDG_STATE_HOME/homespec, else ~/.local/state/homespec (created)."""
    chosen = explicit or os.environ.get(STATE_ENV)
    if chosen:
        base = Path(chosen).expanduser()
    else:
        xdg = os.environ.get("XDG_STATE_HOME") or "~/.local/state"
        base = Path(xdg).expanduser() / "homespec"
    base.mkdir(parents=True, exist_ok=True)
    return base
