"""What an engine tells its daemon about the pair it serves (engine/protocol.py's EngineInfo
and Costs): built here from the loaded runtime, for the daemon's /health and `status`, and for
`doctor --measure` (memcheck.py)."""

from __future__ import annotations

import os

from homespec.engine.estimates import DRAFT_SIZES, VERIFY_SIZES, sampled
from homespec.engine.governor_types import OPTION_NAMES
from homespec.engine.loader import Held
from homespec.engine.policy import serving_mode
from homespec.engine.protocol import Costs, EngineInfo, ModelCheck
from homespec.engine.runtime import PairRuntime
from homespec.plan_types import PairPlan


def costs_now(rt: PairRuntime) -> Costs:
    """What the governor prices now (Costs): its curves where calibration measured them, as
    drifted since with the machine's speed, and each option's own work per step; and what
    the target's prompt cache measured."""
    ledger, cache = rt.ledger, rt.target_snapshots
    return Costs(
        sampled(ledger.verify_curve(), VERIFY_SIZES),
        sampled(ledger.draft_curve(), DRAFT_SIZES),
        {name: ledger.overhead[o] for o, name in OPTION_NAMES.items() if o in ledger.overhead},
        cache.copy_ms,
        cache.read_ms,
        rt.sharing.why,
        rt.ledger.copy_per_token,
    )


def describe(
    rt: PairRuntime,
    plan: PairPlan,
    *,
    target_file: str,
    draft_file: str | None,
    degraded: bool,
    held: Held | None = None,
) -> EngineInfo:
    """The EngineInfo of a loaded pair: the one place its serving mode is worked out."""
    mode, reason = serving_mode(
        plan.mode,
        plan.reason,
        draft_loaded=rt.draft is not None,
        draft_unavailable_reason=rt.draft_unavailable_reason,
        plain_only_reason=rt.plain_only_reason,
    )
    costs = costs_now(rt)
    return EngineInfo(
        pid=os.getpid(),
        plan=plan,
        n_ctx=rt.target.n_ctx,
        target_file=target_file,
        draft_file=draft_file,
        draft_loaded=rt.draft is not None,
        draft_unavailable_reason=rt.draft_unavailable_reason,
        plain_only_reason=rt.plain_only_reason,
        mode=mode,
        reason=reason,
        degraded=degraded or rt.draft_failed,
        memory=[ModelCheck(c.role, dict(c.predicted), dict(c.measured)) for c in held.memory]
        if held
        else [],
        repack=dict(held.repack) if held else {},
        load_ms=dict(held.load_ms) if held else {},
        pages=dict(held.settled) if held else {},
        verify_ms=costs.verify_ms,
        draft_ms=costs.draft_ms,
        agreement=rt.ledger.agreement,
        catch_up=rt.sharing.why,
        copy_per_token=rt.ledger.copy_per_token,
        step_ms=costs.step_ms,
        copy_ms=costs.copy_ms,
        read_ms=costs.read_ms,
        prompt_note=rt.target.model.template_problem(),
    )
