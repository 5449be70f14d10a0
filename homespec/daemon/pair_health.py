"""What /health, status and every response say about one pair (daemon/worker.py): pure, from
where the pair is in its life (daemon/states.py), what its engine last reported, its last
engine death and the memory watch's verdict on its draft.

The engine reports its own serving mode and reason (engine/policy.serving_mode); the daemon
only overlays its lifecycle on them (loading, restarting, failed, stopped) and what the engine
cannot know: that it died before (`incident`) or that the daemon dropped its draft for memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from homespec.daemon.memory_watch import DraftWatch
from homespec.daemon.states import WorkerState
from homespec.engine.protocol import EngineInfo
from homespec.vocab import PairMode


@dataclass(frozen=True)
class PairView:
    """One pair as the daemon saw it at one moment."""

    state: WorkerState
    info: EngineInfo | None  # the engine's last report; None while none serves
    error: str = ""  # why the pair failed (state FAILED)
    incident: str = ""  # the last engine death and what was done about it
    watch: DraftWatch = field(default_factory=DraftWatch)


def mode(view: PairView) -> PairMode:
    """The engine's serving mode, or where the pair is in its life."""
    if view.state == WorkerState.FAILED:
        return "failed"
    if view.state == WorkerState.STOPPED:
        return "stopped"
    if view.state == WorkerState.RESTARTING:
        return "restarting"
    return "loading" if view.info is None else view.info.mode


def reason(view: PairView) -> str:
    """Why the pair is in that mode: an engine death is said once, before the engine's own
    reason, unless the engine's reason already says it (a draft left out after it crashed)."""
    if view.state == WorkerState.FAILED:
        return view.error
    if view.state == WorkerState.RESTARTING:
        return view.incident
    if view.info is None:
        return "target model loading"
    if not view.incident or view.incident in view.info.reason:
        return view.info.reason
    return f"{view.incident}; {view.info.reason}"


def degraded(view: PairView) -> bool:
    """Not serving as declared: failed or restarting, its draft dropped for memory, a plan
    that fell back, or an engine that died before."""
    if view.state in (WorkerState.FAILED, WorkerState.RESTARTING) or view.watch.dropped:
        return True
    return view.info is not None and (view.info.degraded or bool(view.incident))


def notes(view: PairView) -> list[str]:
    """What every response of the pair should also say: its draft dropped for memory, an
    earlier engine death (unless the engine's draft-unavailable reason already says it)."""
    out = [view.watch.reason] if view.watch.dropped else []
    if view.incident and not (view.info and view.incident in view.info.draft_unavailable_reason):
        out.append(view.incident)
    return out
