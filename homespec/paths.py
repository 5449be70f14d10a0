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
