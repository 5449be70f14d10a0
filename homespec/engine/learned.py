"""What the governor learned about acceptance, and how long each task's answers run, kept in a
small JSON file across engine restarts (the daemon's state dir, one file per pair), so a
restarted pair drafts from what it knew instead of from priors. Written whole to a temporary
file and renamed over the old one: a crash mid-write leaves the previous file, never half a
file."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from homespec.engine.ledger import Ledger
from homespec.manifest import Manifest

LOG = logging.getLogger("homespec.engine")


def file_name(manifest: Manifest, pair: str) -> str:
    """One file per pair and model files (other models would have other acceptance)."""
    _, spec = manifest.pair(pair)
    models = [m for m in (spec.target, spec.draft) if m in manifest.spec.models]
    files = "|".join(str(manifest.model_path(m)) for m in models)
    return f"governor-{pair}-{hashlib.sha256(files.encode()).hexdigest()[:8]}.json"


def restore(ledger: Ledger, path: Path) -> int:
    """Tasks restored from `path` (0 when there is no file or it cannot be used: said)."""
    try:
        state: Any = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return 0
    except (OSError, ValueError) as exc:
        LOG.warning("governor: cannot use %s (%s); starting from priors", path, exc)
        return 0
    n = ledger.restore_acceptance(state)
    if n:
        LOG.info("governor: acceptance for %d task(s) restored from %s", n, path)
    return n


def save(ledger: Ledger, path: Path) -> None:
    """Write atomically; a failure is logged, never raised (serving matters more)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(ledger.acceptance_state()), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        LOG.warning("governor: cannot save %s (%s)", path, exc)
        tmp.unlink(missing_ok=True)
