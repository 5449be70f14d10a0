"""Watching a pair's RPC workers from the daemon: re-plan the pair when a worker it had to do
without answers again.

A worker lost mid-decode takes the engine down with it (llama.cpp aborts the client); the crash
recovery restarts the engine, which plans without the worker. Nothing else would notice the
worker's return: this watch does. A worker in use cannot be watched from outside the engine: it
serves one client at a time, and connections left waiting in its small backlog would block the
engine's own next connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from homespec.daemon.states import WorkerState
from homespec.daemon.worker import PairWorker
from homespec.engine.protocol import EngineInfo
from homespec.manifest import Manifest
from homespec.workers import probe_all


def layout(info: EngineInfo | None) -> dict[str, object]:
    """The RPC workers a loaded pair's plan spreads its target over: layers per device, and
    the declared workers it had to do without ({} for a pair on this box alone)."""
    plan = info.plan if info is not None else None
    if plan is None or not (plan.arrangement.remote or plan.workers_down):
        return {}
    return {"layers": dict(plan.arrangement.remote), "down": list(plan.workers_down)}


def missing(info: EngineInfo | None) -> list[str]:
    """The declared workers a loaded pair was planned without."""
    return list(info.plan.workers_down) if info is not None else []


def decide(down: Sequence[str], reachable: Mapping[str, bool]) -> str:
    """Why a pair planned without the workers `down` should be re-planned now (every one of
    them answers), or "" to leave it be."""
    if down and all(reachable.get(w, False) for w in down):
        return f"worker {', '.join(down)} answers again"
    return ""


def look(manifest: Manifest, down: Sequence[str]) -> dict[str, bool]:
    """Whether each worker answers a full probe (blocking: run it in a thread)."""
    specs = manifest.spec.workers
    found = probe_all(
        {w: (specs[w].endpoint, specs[w].connect_timeout_s) for w in down if w in specs}
    )
    return {w: st.reachable for w, st in found.items()}


async def check(w: PairWorker, waiting: set[str]) -> str:
    """Why the pair `w` runs should be re-planned now, or "". A ready pair planned without
    some workers waits for them all; a failed pair that declares workers waits for them only
    when it found one down (`waiting` remembers which did: a pair that failed for another
    reason is not restarted just because its workers answer)."""
    declared = tuple(w.manifest.spec.pairs[w.name].target_workers)
    if not declared:
        return ""
    if w.state == WorkerState.READY and w.info is not None:
        down = w.info.plan.workers_down
    elif w.state == WorkerState.FAILED:
        down = declared
    else:
        return ""
    if not down:
        return ""
    reachable = await asyncio.to_thread(look, w.manifest, down)
    if w.state == WorkerState.FAILED:
        if not all(reachable.values()):
            waiting.add(w.name)
            return ""
        if w.name not in waiting:
            return ""
    why = decide(down, reachable)
    if why:
        waiting.discard(w.name)
    return why
