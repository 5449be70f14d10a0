"""What the daemon says about one pair (daemon/pair_health.py): its lifecycle over the
engine's own mode and reason, an engine death said once, a draft dropped for memory."""

from __future__ import annotations

from homespec.daemon.memory_watch import DraftWatch
from homespec.daemon.pair_health import PairView, degraded, mode, notes, reason
from homespec.daemon.states import WorkerState
from homespec.engine.protocol import EngineInfo
from homespec.plan_types import Arrangement, PairPlan

DIED = "engine died (SIGSEGV) in the draft model; restarted without it"


def _info(
    *, reason: str = "draft model ready", unavailable: str = "", fell_back: bool = False
) -> EngineInfo:
    arrangement = Arrangement(rung="co-load", mode="speculative", n_ctx=2048, draft_gpu_layers=0)
    return EngineInfo(
        pid=1,
        plan=PairPlan("p", arrangement, "as declared", fell_back, "co-load"),
        n_ctx=2048,
        target_file="t.gguf",
        draft_file="d.gguf",
        draft_loaded=not unavailable,
        draft_unavailable_reason=unavailable,
        plain_only_reason="",
        mode="speculative" if not unavailable else "ngram",
        reason=reason,
        degraded=fell_back,
    )


def test_the_lifecycle_overlays_the_engines_mode() -> None:
    assert mode(PairView(WorkerState.STARTING, None)) == "loading"
    assert reason(PairView(WorkerState.STARTING, None)) == "target model loading"
    assert mode(PairView(WorkerState.READY, _info())) == "speculative"
    failed = PairView(WorkerState.FAILED, _info(), error="crashed 3 times in 60 s")
    assert (mode(failed), reason(failed), degraded(failed)) == (
        "failed",
        "crashed 3 times in 60 s",
        True,
    )
    restarting = PairView(WorkerState.RESTARTING, None, incident=DIED)
    assert (mode(restarting), reason(restarting), degraded(restarting)) == (
        "restarting",
        DIED,
        True,
    )
    assert mode(PairView(WorkerState.STOPPED, _info())) == "stopped"


def test_a_healthy_pair_is_not_degraded_and_says_the_engines_reason() -> None:
    view = PairView(WorkerState.READY, _info())
    assert not degraded(view)
    assert reason(view) == "draft model ready"
    assert notes(view) == []
    assert degraded(PairView(WorkerState.READY, _info(fell_back=True)))


def test_an_engine_death_is_said_once() -> None:
    # The engine does not know it died before: the daemon says so before its reason…
    view = PairView(WorkerState.READY, _info(reason="n-gram drafting"), incident=DIED)
    assert reason(view) == f"{DIED}; n-gram drafting"
    assert degraded(view)
    assert notes(view) == [DIED]
    # …unless the engine's reason (the draft left out after the crash) already says it.
    left_out = _info(reason=f"n-gram drafting: {DIED}", unavailable=DIED)
    view = PairView(WorkerState.READY, left_out, incident=DIED)
    assert reason(view) == f"n-gram drafting: {DIED}"
    assert notes(view) == []


def test_a_draft_dropped_for_memory_degrades_the_pair_and_every_response_says_why() -> None:
    why = "RAM free 300 MiB < 512 MiB: draft dropped"
    view = PairView(WorkerState.READY, _info(), watch=DraftWatch(dropped=True, reason=why))
    assert degraded(view)
    assert notes(view) == [why]
