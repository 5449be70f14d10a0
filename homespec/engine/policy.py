"""The speculation decisions, pure, each with a human reason: the one place that decides.

- `decide()`: for one request, speculate or not, and with which drafter: "auto" (the
  governor, engine/governor.py, picks drafter and length per step from measured cost and
  acceptance) unless the request, its task or the pair forces one. The static rules here are
  hard limits on top: speculation off on request or per task, above spec_max_temperature,
  and, for short answers, n-gram lookup only.
- `serving_mode()`: what a loaded pair does now and why; the daemon's /health, status and
  /metrics read it from the engine, never work it out again.
"""

from __future__ import annotations

from homespec.engine.types import Decision, GenerationRequest
from homespec.errors import RequestError
from homespec.manifest import MAX_DRAFT_TOKENS, NGRAM, NO_DRAFT, PairSpec
from homespec.vocab import DRAFTER_LABELS, DrafterOrNone, PairMode, PlanMode


def effective_temperature(pair: PairSpec, req: GenerationRequest) -> float:
    task = pair.tasks.get(req.task) if req.task else None
    if req.temperature is not None:
        return req.temperature
    if task is not None and task.temperature is not None:
        return task.temperature
    return pair.sampling.temperature


def decide(
    pair_name: str,
    pair: PairSpec,
    req: GenerationRequest,
    *,
    draft_available: bool,
    unavailable_reason: str = "",
    plain_only_reason: str = "",
) -> Decision:
    """Speculate or not, with which drafter and how many tokens; `reason` says why."""
    task = pair.tasks.get(req.task) if req.task else None
    has_model = pair.draft not in (NGRAM, NO_DRAFT)
    forced = req.drafter or (task.drafter if task else None) or pair.drafter
    # Without a forced drafter the governor picks one each step ("auto"); a draft_tokens set
    # anywhere caps its drafts, and is the draft length of a forced drafter.
    cap = req.draft_tokens or (task.draft_tokens if task else None)
    if cap is None and "draft_tokens" in pair.model_fields_set:
        cap = pair.draft_tokens
    draft_tokens = cap or (pair.draft_tokens if forced else MAX_DRAFT_TOKENS)
    drafter: DrafterOrNone = forced or "auto"
    if drafter in ("model", "hybrid") and not has_model:
        raise RequestError(
            f"pair {pair_name!r} has no draft model (draft = {pair.draft!r}), "
            f"so it cannot use the {drafter!r} drafter",
            'use the "ngram" drafter or no speculation',
        )

    def plain(reason: str) -> Decision:
        return Decision(mode="plain", drafter="none", draft_tokens=0, reason=reason)

    if req.speculative is False:
        return plain("request: speculation off")
    if plain_only_reason:  # even a forced request cannot speculate on this target
        return plain(plain_only_reason)
    if pair.draft == NO_DRAFT and req.drafter is None and not (task and task.drafter):
        return plain(f'pair {pair_name}: draft = "none"')
    degraded = ""
    use_model = True
    if has_model and drafter in ("model", "hybrid", "auto") and not draft_available:
        why = unavailable_reason or "draft model unavailable"
        if drafter == "model":
            return plain(why)
        if drafter == "hybrid":
            drafter = "ngram"
        degraded = f"; {why}: n-gram lookup only"
    if req.speculative is None:
        if task is not None and task.speculative is False:
            return plain(f"task {req.task}: speculation off")
        temperature = effective_temperature(pair, req)
        if temperature > pair.spec_max_temperature:
            return plain(f"temperature {temperature:g} > {pair.spec_max_temperature:g}")
        if req.max_tokens < pair.spec_min_max_tokens:
            short = f"max_tokens {req.max_tokens} < {pair.spec_min_max_tokens}"
            if drafter != "auto":
                return plain(short)
            # The pair's hard limit (off by default: the governor prices the draft model's
            # catch-up against the answer's room itself). N-gram lookup costs nothing to try on
            # an answer that repeats the prompt ("Is 7919 prime?" "7919 is prime"): the
            # governor still drafts where a match promises to pay, else steps plain.
            use_model = False
            if "n-gram lookup only" not in degraded:  # the draft may already be unavailable
                degraded += f"; {short}: n-gram lookup only"
    why = "request: speculation forced on" if req.speculative else "speculative"
    length = f"at most {draft_tokens}" if drafter == "auto" else str(draft_tokens)
    return Decision(
        mode="speculative",
        drafter=drafter,
        draft_tokens=draft_tokens,
        reason=f"{why} ({DRAFTER_LABELS[drafter]}, {length} tokens/step{degraded})",
        use_model=use_model,
    )


def step_tokens(decision: Decision, *, room: int, max_outputs: int) -> int:
    """The most tokens the next verify step may draft: the decision's draft length (a forced
    drafter's length, or auto's cap), within the answer's room left and what one target decode
    may return logits for. Under "auto" the governor then picks a length up to this."""
    if decision.mode != "speculative":
        return 0
    return max(0, min(decision.draft_tokens, room, max_outputs - 1))


def serving_mode(
    plan_mode: PlanMode,
    plan_reason: str,
    *,
    draft_loaded: bool,
    draft_unavailable_reason: str,
    plain_only_reason: str,
) -> tuple[PairMode, str]:
    """What a loaded pair does now (speculative, ngram or plain) and why."""
    if plain_only_reason:
        return "plain", plain_only_reason
    if draft_loaded:
        return "speculative", plan_reason
    return (
        "plain" if plan_mode == "plain" else "ngram",
        draft_unavailable_reason or plan_reason,
    )
