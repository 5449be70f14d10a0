"""What the governor learned about acceptance, and how long each task's answers run, kept in a
small JSON file across engine restarts (the daemon's state dir, one file per pair), so a
restarted pair drafts from what it knew instead of from priors. Written whole to a temporary
file and renamed over the old one: a crash mid-write leaves the previous file, never half a
file."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from homespec.engine.estimates import MATCH_BUCKETS, MAX_K, MAX_TASKS, Acceptance, table_key
from homespec.engine.ledger import Ledger
from homespec.manifest import Manifest

LOG = logging.getLogger("homespec.engine")
STATE_VERSION = 1  # of state()
KNOWN_KEYS = {  # Ledger.by_task's keys, all a file may hold
    "model",
    *(
        table_key(b, *kind)
        for kind in ((False, False), (True, False), (False, True))
        for b in MATCH_BUCKETS
    ),
}


def file_name(manifest: Manifest, pair: str) -> str:
    """One file per pair and model files (other models would have other acceptance)."""
    _, spec = manifest.pair(pair)
    models = [m for m in (spec.target, spec.draft) if m in manifest.spec.models]
    files = "|".join(str(manifest.model_path(m)) for m in models)
    return f"governor-{pair}-{hashlib.sha256(files.encode()).hexdigest()[:8]}.json"


def restore(ledger: Ledger, path: Path) -> int:
    """Tasks restored from `path` (0 when there is no file or it cannot be used: said)."""
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return 0
    except (OSError, ValueError) as exc:
        LOG.warning("governor: cannot use %s (%s); starting from priors", path, exc)
        return 0
    n = restore_state(ledger, data)
    if n:
        LOG.info("governor: acceptance for %d task(s) restored from %s", n, path)
    return n


def save(ledger: Ledger, path: Path) -> None:
    """Write atomically; a failure is logged, never raised (serving matters more)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(state(ledger)), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        LOG.warning("governor: cannot save %s (%s)", path, exc)
        tmp.unlink(missing_ok=True)


def state(ledger: Ledger) -> dict[str, Any]:
    """What was learned about acceptance, and how long each task's recent answers ran,
    as JSON-able data (kept across restarts; costs are not: they are measured again at
    every load). Without the lengths, every task was a task never seen after a restart:
    its first answer was expected at the other tasks' length, and a draft model that pays
    on its long answers was not caught up on the prompt until one had ended."""
    return {
        "version": STATE_VERSION,
        "tasks": {
            "" if task is None else task: {
                key: {"tries": acc.tries, "kept": acc.kept, "prior": acc.prior}
                for key, acc in table.items()
            }
            for task, table in ledger.by_task.items()
        },
        "lengths": ledger.lengths.state(),
    }


def restore_state(ledger: Ledger, data: Any) -> int:
    """Take back into `ledger` what `state()` gave (tasks already learned in this process
    win); the number of tasks restored. Anything malformed is skipped, never trusted."""
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        return 0
    tasks = data.get("tasks")
    restored = 0
    for name, table in (tasks if isinstance(tasks, dict) else {}).items():
        task = name or None
        if task in ledger.by_task or not isinstance(table, dict):
            continue
        accs = {}
        for key, raw in table.items():
            try:
                tries = [float(x) for x in raw["tries"]][:MAX_K]
                kept = [float(x) for x in raw["kept"]][:MAX_K]
                prior = float(raw["prior"])
            except (KeyError, TypeError, ValueError):
                continue
            # JSON's Infinity and NaN: clamped, they were an inf/inf acceptance, or a 0
            if not all(math.isfinite(x) for x in (*tries, *kept, prior)):
                continue
            tries, kept = [max(0.0, x) for x in tries], [max(0.0, x) for x in kept]
            prior = min(1.0, max(0.0, prior))
            if len(tries) == len(kept) == MAX_K and key in KNOWN_KEYS:
                kept = [min(k, t) for k, t in zip(kept, tries, strict=True)]
                accs[key] = Acceptance(tries, kept, prior)
        if accs and len(ledger.by_task) < MAX_TASKS:
            ledger.by_task[task] = accs
            restored += 1
    ledger.lengths.restore(data.get("lengths"), data.get("answers"))
    return restored
