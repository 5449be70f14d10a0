"""The draft -> verify loop.

One target `llama_decode` per step carries [last committed token] + k drafts, with logits only at
those k + 1 positions. Drafts are checked left to right: a draft is kept while it equals the
token plain decoding picks at its position (the argmax at temperature 0; sampled, the argmax
plus that position's seeded noise: sampling.py). The first miss emits that token instead; if
every draft is kept, the target's next token comes free ("bonus"). Either way the output is
exactly what the target alone would produce, with the same seed when sampling.

Plain decoding is the same loop with k = 0, so A/B comparisons measure speculation and nothing
else.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Generator
from dataclasses import replace

from homespec.engine.catch_up import RELAG
from homespec.engine.chat_text import PROMPT_FORMATS
from homespec.engine.drafters import Drafter, NgramDrafter, Proposal
from homespec.engine.estimates import MAX_K, table_key
from homespec.engine.governor import (
    choose,
    hand_over,
    next_window,
    settled,
    stand_for,
    standing,
)
from homespec.engine.governor_types import OPTION_NAMES, Choice, Option
from homespec.engine.ledger import Ledger
from homespec.engine.policy import decide, effective_temperature, step_tokens
from homespec.engine.runtime import PairRuntime
from homespec.engine.sampling import Draws, SamplingParams, pick, verify
from homespec.engine.textstream import TextStream
from homespec.engine.types import Chunk, Decision, GenerationRequest, GenerationStats
from homespec.manifest import PairSpec

LOG = logging.getLogger("homespec.engine")
# A prediction is read up to this many times the answer's room (an answer may skip parts of
# it), and never beyond MAX_PREDICTION tokens (see _predict)
PREDICTION_ROOM, MAX_PREDICTION = 2, 32768


def sampling_params(pair: PairSpec, req: GenerationRequest) -> SamplingParams:
    s = pair.sampling
    return SamplingParams(
        temperature=effective_temperature(pair, req),
        top_p=req.top_p if req.top_p is not None else s.top_p,
        top_k=req.top_k if req.top_k is not None else s.top_k,
        min_p=req.min_p if req.min_p is not None else s.min_p,
        seed=req.seed if req.seed is not None else s.seed,
    )


def answer_seed(params: SamplingParams) -> int | None:
    """The seed an answer samples with: the request's or the pair's, else a fresh one (32
    bits, so that any client, JavaScript's included, can send it back unrounded); None when
    greedy. The response reports it: the same prompt, settings and seed give the same answer,
    on any drafter (sampling.py)."""
    if params.greedy:
        return None
    return params.seed if params.seed is not None else secrets.randbits(32)


def _option(source: str) -> Option:
    """The governor's option that a step's proposal `source` ran."""
    return "ngram" if source == "ngram" else "model" if source == "model" else "none"


def _governed(
    rt: PairRuntime,
    task: str | None,
    history: list[int],
    k: int,
    params: SamplingParams,
    draws: Draws,
    *,
    use_model: bool = True,
    generated: int = 0,
    room: int = 0,
    window: int = MAX_K,
    last: Choice | None = None,
    runs: tuple[float, int] = (0.0, 0),
    by_lookup: int = 0,
) -> tuple[str, Proposal, Choice, int, list[int] | None]:
    """One step's proposal as the governor chooses it: n-gram lookup (free to make, so looked
    up first: a match is known before the step), the draft model (when `use_model`), or none.
    A draft model hands its proposal over to n-gram lookup part-way where the governor says
    lookup's continuation is worth more than its own next drafts (`hand_over`). `window`:
    the answer's cap on a lookup proposal (governor.next_window). The last
    values: how far behind the history the draft model was (0 unless it drafted), and what
    lookup had to propose (whichever ran: see Ledger.learn_unused_match; None where a
    standing choice only glanced: the loop looks up while the target decodes, to learn from).
    `last`: this answer's last choice, which may stand for this step (governor.settled).
    `runs`: the answer's draft-model run per later catch-up and plain streak (Inputs');
    `by_lookup`: its tokens that lookup committed (Ledger.lookup_share_now)."""
    ledger = rt.ledger
    since = ledger.steps - ledger.asked_at
    # While the last choice stands, lookup looks only where a glance says a long match can be
    looks = not standing(last, since) or rt.ngram.glance(history)
    match = rt.ngram.propose(history, k, params, draws).tokens if looks else []
    table = ""
    if match:
        table = table_key(rt.ngram.match_len, rt.ngram.from_prediction, rt.ngram.contested)
    if settled(last, since, table):
        ledger.chose("none")
        return "none", Proposal([]), last, 0, match if looks else None
    draft = rt.draft if use_model else None
    lag = draft.lag(history) if draft else 0
    cells = len(rt.target.tokens)  # what a copy of the target's cache would move
    horizon = ledger.horizon(task, generated, room, lag, cells)
    inputs = ledger.inputs(
        task,
        has_model=draft is not None,
        match=len(match),
        max_k=k,
        model_lag=lag,
        match_len=rt.ngram.match_len,
        predicted=rt.ngram.from_prediction,
        contested=rt.ngram.contested,
        horizon=horizon,
        ngram_window=window,
        model_run=runs[0],
        plain_streak=runs[1],
        answer_lookup=(by_lookup, generated),
        cells=cells,
    )
    choice = choose(inputs)
    choice = replace(choice, lookup=table, stands=stand_for(last, choice, ledger.own_share()))
    ledger.chose(choice.option)
    ledger.asked_at = ledger.steps
    if choice.option == "ngram":
        if rt.ngram.from_memory:
            choice = replace(choice, reason=choice.reason + "; matched in an earlier request")
        elif rt.ngram.from_prediction:
            choice = replace(choice, reason=choice.reason + "; matched in the prediction")
        return "ngram", Proposal(match[: choice.k]), choice, 0, match
    if choice.option == "model" and draft is not None:

        def lookup(drafted: list[int]) -> tuple[list[int], int, bool]:
            room = k - len(drafted)
            ahead, match_len, disputed = rt.ngram.lookahead(history, drafted, room)
            if not ahead:
                return [], 0, False
            table = ledger.acceptance(task, match_len, contested=disputed)
            at = replace(inputs, acceptance=table, ngram_match=len(ahead), max_k=room)
            return ahead[: hand_over(at)], match_len, disputed

        proposal = draft.propose(history, choice.k, params, draws, lag=lag, hand_over=lookup)
        ledger.observe_draft(draft.take_decodes())
        return "model", proposal, choice, lag, match
    return "none", Proposal([]), choice, 0, match


def _learn(
    ledger: Ledger,
    task: str | None,
    source: str,
    proposal: Proposal,
    kept: int,
    lookup: NgramDrafter,
) -> None:
    """What a verify step says about acceptance: of n-gram lookup (in the tables of `lookup`'s
    last match: its length, and whether it was in the prediction or contested) or of the draft
    model; a draft-model proposal finished by lookup teaches each about its own part
    (lookup's only when every model draft before it was kept: it was not tried otherwise)."""
    if source == "ngram":
        table = ledger.acceptance(
            task, lookup.match_len, predicted=lookup.from_prediction, contested=lookup.contested
        )
        table["ngram"].record(len(proposal.tokens), kept)
        return
    own = len(proposal.tokens) - proposal.handed_over
    ledger.acceptance(task)["model"].record(own, min(kept, own))
    if proposal.handed_over and kept >= own:
        disputed = proposal.handover_contested
        table = ledger.acceptance(task, proposal.handover_match, contested=disputed)
        table["ngram"].record(proposal.handed_over, kept - own)


def _predict(
    rt: PairRuntime, req: GenerationRequest, decision: Decision, n_prompt: int, max_new: int
) -> tuple[int, str]:
    """Hand the request's prediction to n-gram lookup (after its reset) where this request
    looks up n-grams, at most PREDICTION_ROOM times the answer's room (MAX_PREDICTION at
    most: indexing costs 2.4 ms per thousand tokens here, while the request waits). Its
    tokens (0: none sent), and what the reason says of it ("": drafted from, whole)."""
    if not req.prediction:
        return 0, ""
    tokens = rt.target.model.tokenize(req.prediction, special=False, add_bos=False)
    if not (decision.mode == "speculative" and decision.drafter in ("auto", "ngram", "hybrid")):
        return len(tokens), "the prediction is not drafted from (no n-gram lookup in this mode)"
    room = min(PREDICTION_ROOM * max_new + 64, MAX_PREDICTION)
    rt.ngram.predict(tokens[:room], n_prompt)
    if len(tokens) > room:
        return len(tokens), f"the prediction's first {room} of {len(tokens)} tokens drafted from"
    return len(tokens), ""


def generate(
    rt: PairRuntime, req: GenerationRequest
) -> Generator[Chunk | GenerationStats, None, None]:
    """Stream Chunks as tokens are committed; the last item is the request's GenerationStats."""
    for item in generate_steps(rt, req):
        if isinstance(item, GenerationStats):
            yield item
        else:
            yield from item


def complete(rt: PairRuntime, req: GenerationRequest) -> tuple[str, GenerationStats]:
    """The whole answer and its stats, for a caller that does not stream (the bench)."""
    parts: list[str] = []
    stats: GenerationStats | None = None
    for out in generate(rt, req):
        if isinstance(out, GenerationStats):
            stats = out
        else:
            parts.append(out.text)
    assert stats is not None  # generate's last item
    return "".join(parts), stats


def generate_steps(
    rt: PairRuntime, req: GenerationRequest
) -> Generator[list[Chunk] | GenerationStats, None, None]:
    """The same, one list of Chunks per target decode (what the engine child sends across)."""
    adapter = rt.threads
    if adapter is None:
        yield from _steps(rt, req)
        return
    adapter.begin()
    try:
        yield from _steps(rt, req)
    finally:  # finished, failed or cancelled (the consumer closed the generator)
        adapter.end()


def _steps(
    rt: PairRuntime, req: GenerationRequest
) -> Generator[list[Chunk] | GenerationStats, None, None]:
    t_start = time.perf_counter()
    decision = decide(
        rt.name,
        rt.spec,
        req,
        draft_available=rt.draft is not None,
        unavailable_reason=rt.draft_unavailable_reason,
        plain_only_reason=rt.plain_only_reason,
    )
    drafter: Drafter | None = None
    if decision.mode == "speculative" and decision.drafter == "auto":
        rt.ngram.reset()
    elif decision.mode == "speculative":
        drafter = rt.drafter(decision.drafter)
        drafter.reset()
    params = sampling_params(rt.spec, req)
    history, how = rt.prompt(req)
    seed = answer_seed(params)
    draws = Draws(seed or 0)
    n_prompt = len(history)
    # A chat's answer follows the template's role header: lookup's agreement stops there.
    rt.ngram.answer_start = n_prompt if req.messages is not None else 0
    max_new = min(req.max_tokens, rt.target.n_ctx - n_prompt)
    predicted, about_prediction = _predict(rt, req, decision, n_prompt, max_new)
    said = f"{decision.reason}; {about_prediction}" if about_prediction else decision.reason
    stats = GenerationStats(
        mode=decision.mode,
        reason=said,
        drafter=decision.drafter,
        prompt_tokens=n_prompt,
        prompt_format=how,
        seed=seed,
        accepted_per_position=[0] * (0 if decision.drafter == "auto" else decision.draft_tokens),
        prediction_tokens=predicted,
    )
    transcript = PROMPT_FORMATS["transcript"]
    if stats.prompt_format.startswith(transcript) and transcript not in rt.warned:
        # Once a pair: a bench of a base model printed it before each of its 70 answers
        rt.warned.add(transcript)
        LOG.warning("pair %s: %s; each answer's prompt_format says so", rt.name, transcript)
    stats.cached_tokens = rt.recall(history)
    text = TextStream(req.stop)
    model = rt.target.model
    done = False

    def commit(token: int, drafted: bool) -> Chunk | None:
        """Append one token to the answer; sets `done` at EOS, a stop string or the cap."""
        nonlocal done
        history.append(token)
        stats.completion_tokens += 1
        if model.is_eog(token):
            done, stats.finish_reason = True, "stop"
            return None
        out = text.feed(model.piece(token))
        if text.stopped:
            done, stats.finish_reason = True, "stop"
        elif stats.completion_tokens >= max_new:
            done = True
            out += text.flush()
        return Chunk(out, drafted)  # one per token, text or not: the daemon counts them

    adapter = rt.threads
    sharing = rt.sharing  # (catch_up_by_copy turns it off where a copy fails)
    # Prompt: one pass (chunked by n_batch inside extend), logits for the last position only.
    t_read = time.perf_counter()
    first = pick(rt.target.extend(history, 1)[0], params, draws, len(history))
    read = len(history) - stats.cached_tokens  # what a put-aside copy would have spared
    rt.target_snapshots.observe_read(read, (time.perf_counter() - t_read) * 1000.0)
    stats.ttft_ms = (time.perf_counter() - t_start) * 1000.0
    chunk = commit(first, False)
    if chunk:
        yield [chunk]

    ledger = rt.ledger
    used: dict[str, int] = {}
    handovers = 0  # draft-model steps finished by n-gram lookup
    last: Choice | None = None
    drafted = 0  # answer tokens the draft model's steps committed
    later_ms = 0.0  # what its catch-ups after its first drafting cost (Ledger.observe_upkeep)
    by_lookup = 0  # answer tokens n-gram steps committed (Ledger.observe_lookup_share)
    # Catch-ups after the draft model's first drafting, the answer tokens its steps committed
    # since the first of them, and those plain steps committed since a drafter last ran
    # (governor.Inputs.model_run, plain_streak)
    later, after_later, streak = 0, 0, 0
    window = MAX_K  # lookup's cap in this answer (governor.next_window)
    governed = decision.drafter == "auto"
    looked: list[int] = []  # what lookup had at a step that only glanced (set while decoding)

    def look_up() -> None:
        """A standing step's full lookup, for what it teaches (learn_unused_match) and not for
        the step: run while the target decodes, free on a GPU (a step there glances because
        looking up first costs; on a CPU, where nothing stands, it would run after)."""
        nonlocal looked
        looked = rt.ngram.propose(history, k, params, draws).tokens

    while not done:
        t_step = time.perf_counter()
        if governed:
            ledger.step_started()
        room = min(max_new - stats.completion_tokens, rt.target.n_ctx - len(history)) - 1
        k = step_tokens(decision, room=room, max_outputs=rt.target.n_outputs_max)
        if adapter is not None:
            adapter.tick()
        source, proposal = "none", Proposal([])
        match: list[int] | None = []
        if governed and k > 0:
            source, proposal, last, lag, match = _governed(
                rt,
                req.task,
                history,
                k,
                params,
                draws,
                use_model=decision.use_model,
                generated=stats.completion_tokens,
                room=room,
                window=window,
                last=last,
                runs=(after_later / later if later else 0.0, streak),
                by_lookup=by_lookup,
            )
            used[source] = used.get(source, 0) + 1
            if source == "model" and used[source] > 1:
                later_ms += ledger.later_catch_up_ms(lag, len(rt.target.tokens))
                later += lag > RELAG
        elif drafter is not None and k > 0:
            source, proposal = drafter.kind, drafter.propose(history, k, params, draws)
            if source in ("model", "hybrid") and rt.draft is not None:
                ledger.observe_draft(rt.draft.take_decodes())
        drafts = proposal.tokens
        looked = []
        shadow = look_up if match is None and req.learn else None
        t0 = time.perf_counter()
        logits = rt.target.extend(history + drafts, len(drafts) + 1, shadow)
        ms = (time.perf_counter() - t0) * 1000.0
        match = looked if match is None else match
        ledger.observe_verify(len(drafts) + 1, ms)
        if adapter is not None:
            adapter.observe(len(drafts) + 1, ms)
        stats.verify_steps += 1
        n_kept, following = verify(drafts, logits, params, draws, len(history))
        draws.forget_before(len(history) + n_kept + 1)
        if source == "ngram" and drafts:
            window = next_window(window, len(drafts), n_kept)
        # The n-gram drafter's last lookup made this step's proposal (a hybrid's, when found)
        from_prediction = rt.ngram.from_prediction and source in ("ngram", "hybrid")
        if drafts:
            stats.draft_steps += 1
            stats.proposed_tokens += len(drafts)
            if from_prediction:
                stats.accepted_prediction_tokens += n_kept
            if source in ("ngram", "model") and req.learn:
                _learn(ledger, req.task, source, proposal, n_kept, rt.ngram)
            if proposal.handed_over:
                handovers += 1
        committed = [*drafts[:n_kept], following]
        if match and source != "ngram" and not proposal.handed_over and req.learn:
            ledger.learn_unused_match(
                req.task,
                match,
                committed,
                rt.ngram.match_len,
                rt.ngram.from_prediction,
                rt.ngram.contested,
            )
        emitted: list[Chunk] = []
        before = stats.completion_tokens
        for i, token in enumerate(committed):
            kept = i < n_kept
            if kept:
                stats.accepted_tokens += 1
                if i >= len(stats.accepted_per_position):
                    stats.accepted_per_position.extend(
                        [0] * (i + 1 - len(stats.accepted_per_position))
                    )
                stats.accepted_per_position[i] += 1
            chunk = commit(token, kept)
            if chunk:
                emitted.append(chunk)
            if done:  # EOS or a stop string inside the step: the rest is not the answer
                break
        if source == "model":
            drafted += stats.completion_tokens - before
            after_later += (stats.completion_tokens - before) if later else 0
        elif source == "ngram":
            by_lookup += stats.completion_tokens - before
        streak = streak + stats.completion_tokens - before if source == "none" else 0
        if governed:  # what the step cost beyond its decodes (governor.step_ms)
            ledger.observe_step(_option(source), (time.perf_counter() - t_step) * 1000.0)
        if emitted:
            yield emitted

    if governed and last is not None:
        steps = ", ".join(f"{OPTION_NAMES[o]} {n}" for o, n in sorted(used.items()))
        if handovers:
            steps += f" ({handovers} of the draft model's finished by n-gram lookup)"
        stats.reason = f"{said}; last step: {last.reason}; steps: {steps}"
        if not stats.draft_steps:
            stats.mode = "plain"
    if sharing.on and not rt.sharing.on:  # a copy of the target's cache failed on this answer
        stats.reason += f"; the draft model {rt.sharing.why}"
    if adapter is not None:
        stats.threads, stats.threads_reason = adapter.state.threads, adapter.state.reason
        if adapter.note:
            stats.reason += f"; {adapter.note}"
    if stats.finish_reason == "length" and stats.completion_tokens < req.max_tokens:
        stats.context_full = True
        stats.reason += (
            f"; cut at the end of the {rt.target.n_ctx}-token context, {stats.completion_tokens} "
            f"of the {req.max_tokens} tokens asked (shorten the prompt or raise n_ctx)"
        )
    if governed and req.learn:
        cut = stats.finish_reason == "length"
        ledger.observe_answer(req.task, stats.completion_tokens, room=max_new, cut=cut)
        ledger.observe_upkeep(req.task, later_ms, drafted)
        if stats.completion_tokens > 1:  # the first token is the prompt's
            ledger.observe_lookup_share(req.task, by_lookup, stats.completion_tokens - 1)
    if req.remember:
        rt.ngram.remember(history)
    tail = text.flush()
    if tail:
        yield [Chunk(tail, False)]
    stats.e2e_ms = (time.perf_counter() - t_start) * 1000.0
    yield stats
