"""What the draft model pays before it drafts, for the governor (engine/governor.py): a
catch-up on the tokens it has not seen (committed by n-gram or plain steps), by its own batched
decode or by a copy of the target's cache (engine/cache_share.py), and what each draft-model
step re-decodes of its own. Pure, as the governor is.
"""

from __future__ import annotations

from homespec.engine.estimates import CostCurve
from homespec.engine.governor_types import Inputs

RELAG = 2  # a draft model this far behind is every step's own lag, not a catch-up (relag_ms)


def catch_up_ms(inp: Inputs) -> float:
    """What the draft model pays before it can draft: one batched decode of the tokens it has
    not seen (committed by n-gram or plain steps), or a copy of the target's cache where that
    is cheaper; see catch_up_cost."""
    return catch_up_cost(inp.model_lag, inp.verify, inp.draft_ms, inp.draft_curve, inp.copy_ms)


def catch_up_cost(
    lag: int,
    verify: CostCurve,
    draft_ms: float | None,
    draft_curve: CostCurve | None,
    copy_ms: float | None = None,
) -> float:
    """ms of the draft model's decode of `lag` tokens, from its own cost curve. Without one (a
    single size measured), the target's curve scaled by the draft's relative cost: an
    underestimate for a quantized draft, whose batches are compute-bound (on this CPU a Q4_1
    draft costs 0.4× the F32 target for one token but 1.7× for 256). Where the draft model
    reads the target's cache (`copy_ms`, engine/cache_share.py), the cheaper of that decode
    and a copy followed by a one-token decode (its last position's, for the first draft)."""
    decode = _decode_lag(lag, verify, draft_ms, draft_curve)
    if copy_ms is None or decode == 0.0 or draft_ms is None:
        return decode
    return min(decode, copy_ms + draft_ms)


def copy_pays(
    lag: int,
    verify: CostCurve,
    draft_ms: float | None,
    draft_curve: CostCurve | None,
    copy_ms: float | None,
) -> bool:
    """Whether the draft model, `lag` tokens behind, catches up by copying the target's cache
    (`copy_ms`, None where it cannot) rather than decoding them: the copy is cheaper."""
    if copy_ms is None or draft_ms is None or lag <= RELAG:
        return False
    return copy_ms + draft_ms < _decode_lag(lag, verify, draft_ms, draft_curve)


def _decode_lag(
    lag: int, verify: CostCurve, draft_ms: float | None, draft_curve: CostCurve | None
) -> float:
    if lag <= 0 or draft_ms is None:
        return 0.0
    if draft_curve is not None and len(draft_curve.points) > 1:
        return draft_curve.at(lag) or 0.0
    one, batch = verify.at(1), verify.at(lag)
    if not one or batch is None:
        return 0.0
    return batch * draft_ms / one


def later_run(inp: Inputs) -> float | None:
    """The answer tokens a later catch-up of the draft model serves (None: no later catch-up
    in this answer yet, so it serves the rest of the horizon).

    A later catch-up in an answer where lookup keeps taking over serves the draft model's run
    until it does again, not the rest of the answer: spread over the horizon, the demo draft
    caught up on the 28 tokens lookup had committed every 30 or so of a dialogue's, for one
    step of 11 tokens each time, at 157 ms where a plain step and lookup again would have
    taken about 85 (0.93x forced n-gram lookup). Unless plain steps have run longer than its
    runs since lookup last matched: then lookup is not coming back soon."""
    return max(inp.model_run, float(inp.plain_streak)) if inp.model_run else None


def relag_ms(inp: Inputs) -> float:
    """What a draft-model step's first decode costs over a one-token one, after a step that
    kept every draft: the draft re-decodes its last draft (sampled, never decoded) and the
    target's own token, 2 tokens in one decode. A cost of every such step: spread over the
    answer like a catch-up it was nearly nothing, and the governor kept drafting 4 tokens a
    step at 93% acceptance (1.09× plain) where 6, forced, did 1.16×."""
    curve = inp.draft_curve
    if curve is None or len(curve.points) < 2:
        return 0.0
    one, two = curve.at(1), curve.at(2)
    return max(0.0, (two or 0.0) - (one or 0.0))
