"""The life of one pair inside the daemon (daemon/worker.py): its states and the transitions
between them, all made by `PairWorker._set_state`.

    starting ──Loaded──▶ ready ──engine died──▶ restarting ──Loaded──▶ ready
    starting ──engine died (while loading)──▶ restarting
    starting, ready, restarting ──LoadFailed, or a death past the crash limit──▶ failed
    any ──close()──▶ stopped
"""

from __future__ import annotations

from enum import StrEnum


class WorkerState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPED = "stopped"


TRANSITIONS: dict[WorkerState, frozenset[WorkerState]] = {
    WorkerState.STARTING: frozenset(
        {WorkerState.READY, WorkerState.RESTARTING, WorkerState.FAILED, WorkerState.STOPPED}
    ),
    WorkerState.READY: frozenset({WorkerState.RESTARTING, WorkerState.FAILED, WorkerState.STOPPED}),
    WorkerState.RESTARTING: frozenset({WorkerState.READY, WorkerState.FAILED, WorkerState.STOPPED}),
    WorkerState.FAILED: frozenset({WorkerState.STOPPED}),
    WorkerState.STOPPED: frozenset(),
}
