"""The speculation governor: per verify step, which drafter and how many tokens, from what it
costs and how often it is right. Pure: no llama.cpp, no clock; the loop feeds it timings.

Speculation is a bet. A step that drafts k tokens costs one target decode of k + 1 tokens, plus
the drafting (about nothing for n-gram lookup; k draft-model decodes), and commits the kept
drafts plus one token of the target's own. With a_i the chance that draft i is kept given that
every draft before it was,

    expected tokens(k) = 1 + a_1 + a_1·a_2 + … + a_1·…·a_k
    throughput(k)      = expected tokens(k) / (verify(k + 1) + drafting(k))

and plain decoding is 1 / verify(1). The governor takes the option with the best throughput:
no drafting, n-gram lookup (only when the history has a match: that is known before the step),
or the draft model, each at its best k. A flat cost curve (a GPU verifies 64 tokens for about
the price of one) gives long drafts; a steep one (a CPU) short ones; a draft model as costly as
the target is never worth it; acceptance that collapses turns speculation off. Now and then it
re-tries the draft model when it is not using it, with a short draft (bounded exploration), so
a draft model that starts paying is noticed; n-gram lookup needs no re-tries, as every step
that has a match but does not use it measures it for free (Ledger.learn_unused_match). It
switches only for a clear gain (hysteresis). And while the draft model pays only a little, a
plain step now and then measures plain decoding's cost again (PROBE_MS), which every estimate
is weighed against and which wanders with the machine's memory traffic.

Exactness: a step's choice depends only on the history so far and these statistics, never on
that step's random draws, so greedy output stays the target's own and sampling keeps the
target's distribution.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TypeGuard

from homespec.engine.catch_up import RELAG, catch_up_ms, copy_pays, later_run, relag_ms
from homespec.engine.estimates import (
    MAX_K,
    MIN_REACH,
    REACH_GROWTH,
    expected_by_length,
)
from homespec.engine.governor_types import OPTION_NAMES, Choice, Estimate, Inputs, Option

EXPLORE_EVERY = 32  # steps after the draft model's last use before it is re-tried
EXPLORE_K = 3
EXPLORE_MAX_LAG = 8  # tokens a draft model may lag behind and still be explored
# A task's trial of the draft model: a draft model behind the prompt is priced on a prior until
# it has drafted on the task, and the prior alone rarely pays for a catch-up, so left to the
# estimate it never drafts and is never measured. While position 1 has fewer than TRIAL_TRIES
# tries on the task, the draft model drafts (TRIAL_K or more tokens) when that could pay: once
# caught up, its estimate is at least TRIAL_FLOOR × the best other option's, and the catch-up
# costs at most TRIAL_SHARE of the answer still expected, at plain speed. A few steps, once a
# task (what they measure is kept, across restarts too). Only while the pair has measured the
# draft model on no other task: once it has, a new task's table is seeded from theirs
# (Ledger._new) and the estimate has evidence behind it. (Forced on such a task anyway, a trial
# caught the draft model up on a 125-token shell script it then drafted badly: 0.90× forced
# n-gram on that answer, 1.03× on its task's three without.)
# Where calibration measured the draft model's agreement with its target, its prior is that,
# not a guess, and a draft model that, caught up and as right as measured, would not beat
# plain decoding by the margin any new option needs (HYSTERESIS) is not tried. (Tried at
# 0.8x the rival alone, the demo draft on the 2-core machine, estimated at 0.83-1.0x plain
# caught up at its measured 97% as the costs wandered, caught up on a 21-token answer's
# prompt for a trial: 48-51 tok/s on that answer, 82-87 where it was not made.)
TRIAL_TRIES = 8
TRIAL_K = 4
TRIAL_FLOOR = 0.8
TRIAL_SHARE = 0.15
# An answer's own n-gram window (next_window): after a lookup draft of its failed early, the
# next is at most REACH_GROWTH × what was kept (MIN_REACH at least), doubling back while
# drafts are kept whole; never below the longest draft that costs at most CHEAP_VERIFY plain
# steps to verify (on a GPU that is all of them: the window never binds there).
CHEAP_VERIFY = 2.0
# Plain decoding's cost is what every estimate is weighed against, and only a plain step
# measures it. A one-token decode reads every weight once and waits on memory, which a busy
# neighbour shares: on the 2-core box it wandered 17-25 ms from one 4-second answer to the next
# while an 8-token verify held at 45, so the draft model forced ran 0.96-1.39x plain on the same
# e-mail. An answer's first steps measure it, and n-gram lookup gives way to plain steps
# wherever its matches end; a draft model drafting the rest of a long answer never does, and
# there its estimate stood on a cost seconds old. So while the draft model is in use, estimated
# below PROBE_BELOW x plain (where a tenth off plain's cost can turn the decision), after
# PROBE_MS of decoding since the last plain step, with PROBE_HORIZON answer tokens or more still
# expected, one step is plain. Counted in time, as the cost wanders in time: counted in steps
# (every 16), the probes cost a GPU-like fixed-cost replay (1-2 ms steps, a cost that does not
# wander) 3% of unseen-5's throughput; in place of lookup steps too, code edits 3.5% at the
# CPU's costs; near an answer's end, the draft model left a token further behind was priced
# out for the last few tokens (an e-mail 1.35x -> 1.29x plain). As here, at fixed costs (where
# a probe can only cost), auto's tok/s without -> with: shipped workload 76.5 -> 76.5 (CPU
# costs), 1804 -> 1804 (GPU); unseen-5 45.4 -> 45.8, 825 -> 825; unseen-4 64.6 -> 64.5 (CPU).
PROBE_MS = 2000.0
PROBE_HORIZON = 32
PROBE_BELOW = 1.5
HYSTERESIS = 0.05  # a new option must be this much better than the one in use
# A plain choice stands, without asking `choose` again, where a step's own work is SETTLE_SHARE
# or more of a one-token decode (a GPU's) and no drafter came within SETTLE_BELOW of plain at the
# asking: for SETTLE_STEPS steps after the first such asking, twice as many after each asking
# that settles again, up to SETTLE_MAX (stand_for). While it stands, a step only glances at
# lookup (has the history's last n-gram of the longest length been seen before?) and looks up
# in full only where it has: a copy or a remembered answer is noticed at once, the 2- and
# 3-token matches that prose has every few tokens are not looked at; a full lookup's match
# priced from another table than at the asking asks at once (settled). Asking costs the
# lookup's and the draft model's estimates at every length, about 0.15 ms a step on the 2-core
# box and on the H100's host alike; a full lookup 27-39 us in the loop on the 2-core box, a
# glance 15. On the GPU's 1.2-ms decode, an answer `auto` ran wholly plain came 14% slower than
# plain decoding; most steps of a prose answer have no match (576 of unseen-5's 805). Beside a
# CPU's 20-ms decode it is a rounding error, and a choice left standing costs more than that: at
# the CPU's fixed costs a 21-token answer ran 0.81x plain where it had run level, its draft
# model's catch-up decided four steps late. (At the H100's fixed costs, no task: standing
# through a match from the same table, unseen-5 1.00 -> 1.01x plain, unseen-1 1.10 -> 1.11x,
# shipped 1.79 -> 1.80x; then the doubling stand and the glance, unseen-5 -> 1.03x, unseen-3
# 1.38 -> 1.45x, shipped -> 1.77x: prose gained, code that drafts on short matches lost some,
# as those steps learned nothing of short matches; they now look up while the target decodes,
# to learn from it, free on a GPU: shipped -> 1.84x, unseen-4 1.60 -> 1.64x, unseen-5 -> 1.04x.
# docs/ARCHITECTURE.md, "A step's own work".)
SETTLE_STEPS = 4
SETTLE_MAX = 16
SETTLE_BELOW = 0.8
SETTLE_SHARE = 0.05
STRETCH = 0.9  # an untried draft-model position: this times the estimate of the one before it
# A catch-up is paid for certain and up front, its payback is an estimate over an answer that
# may end sooner: it is priced at this multiple. (At 1, the demo draft caught up on a 250-token
# extraction prompt for an estimated 1.35x and the answer came 20% slower than by n-gram; in
# fixed-cost replay at 1, a new task's 53-token answer, expected at 95, ran 0.92x plain, while
# a 181-token one expected at 49 gained 1.06x -> 1.34x: docs/GOVERNOR_EVIDENCE.md, catch-up rules.)
CATCH_UP_RISK = 2.0


def step_ms(inp: Inputs, option: Option) -> float:
    """What a step of `option` costs beyond its decodes, as measured (Ledger.observe_step): the
    lookup, this choice, checking the drafts, detokenizing what is kept. An option not measured
    yet is priced as a plain step (a drafting step does all that one does). On a CPU's 20-ms
    steps it is a rounding error; on a GPU it is not: the demo pair's one-token decode took
    1.2 ms on one H100 and a governed step a quarter more, and a drafting step 4 or 5 ms where
    the 6-token verify took 3.4, so lookup drafts kept at 18% ran 0.61x plain (issue 8's GPU
    run: docs/ARCHITECTURE.md, a step's own work)."""
    measured = inp.overhead.get(option)
    return measured if measured is not None else inp.overhead.get("none", 0.0)


def plain_ms(inp: Inputs) -> float | None:
    """One plain step: a one-token decode and the step's own work (None: nothing measured)."""
    one = inp.verify.at(1)
    return None if one is None else one + step_ms(inp, "none")


def best_k(inp: Inputs, option: Option) -> Estimate | None:
    """The draft length with the best throughput for `option`, or None when it cannot run.

    A draft model that lags behind the history first catches up, once, and then drafts for
    as long as it is chosen; pricing that whole batch into one step meant that after a long
    prompt (catching up on 500 tokens costs a CPU-bound draft a second) the draft model was
    never chosen, however well it drafts. So the catch-up is spread over the answer tokens
    still expected (`horizon`): throughput = tokens over that stretch / (catch-up + their
    steps), the catch-up priced at CATCH_UP_RISK times its cost. With no horizon known, over
    this one step. The catch-ups it will need later, where n-gram steps in between leave it
    behind again, are a cost per token it commits (`upkeep`, measured on the task)."""
    acc = inp.acceptance[option]
    once = relag = upkeep = share = 0.0
    own = step_ms(inp, option)
    if option == "ngram":
        limit, per_token, fixed = min(inp.ngram_match, inp.max_k), 0.0, inp.ngram_ms
        stretch, window = 1.0, inp.ngram_window
    elif inp.draft_ms is None:
        return None
    else:
        limit, per_token, fixed = inp.max_k, inp.draft_ms, 0.0
        window = MAX_K
        # Behind by 1 or 2 tokens is every step's own lag (see relag_ms), priced per step;
        # further behind is a catch-up, paid once.
        once = catch_up_ms(inp) if inp.model_lag > RELAG else 0.0
        once *= CATCH_UP_RISK if inp.horizon else 1.0
        relag = relag_ms(inp)
        upkeep = inp.upkeep
        share = inp.lookup_share  # lookup commits that much of the horizon, not the model
        stretch = STRETCH
    limit = min(limit, acc.reach())
    if limit <= 0:
        return None
    prior = acc.prior
    # The draft model serves the horizon's tokens that lookup does not commit: a catch-up is
    # spread over those. (Spread over the whole horizon, the demo draft caught up on the
    # 89-token prompt of a paragraph rewrite, a task whose answers lookup had mostly
    # committed, for an estimated 1.12x plain, and that answer ran 0.77x forced n-gram.)
    spread = inp.horizon * (1.0 - share)
    run = later_run(inp)
    if once and run is not None:
        spread = min(spread, run)
    # Lookup past the answer's window (next_window) only while verifying the draft costs at
    # most CHEAP_VERIFY plain steps: where long drafts are about free (a GPU), a stale
    # estimate costs little and the window would only cost wins.
    costs = inp.verify.upto(limit + 1)  # costs[k]: a verify of k drafts and the last token
    if costs is None:
        return None
    cheap = CHEAP_VERIFY * costs[0]
    top_k, top_tpm = 0, 0.0
    previous = 1.0
    lengths = expected_by_length(acc, prior, stretch)
    # (Written for speed, as expected_by_length: asked at every step, with up to MAX_K lengths)
    for k, tokens in zip(range(1, limit + 1), lengths, strict=False):
        survive, previous = tokens - previous, tokens  # the chance all k drafts are kept
        cost = costs[k]
        if k > window and cost > cheap:
            break
        step = cost + own + fixed + relag * survive + per_token * k
        span = spread if spread > tokens else tokens  # the tokens the catch-up is spread over
        tpm = span / (once + span * (step / tokens + upkeep))
        if not top_k or tpm > top_tpm:
            top_k, top_tpm = k, tpm
        elif survive < 0.01:
            break  # longer drafts only add cost
    return Estimate(option, top_k, top_tpm, acc.rate(0, prior)) if top_k else None


def choose(inp: Inputs) -> Choice:
    plain_cost = plain_ms(inp)
    if plain_cost is None or inp.max_k <= 0:
        return Choice("none", 0, 1.0, "governor: plain (nothing measured yet)")
    plain = 1.0 / plain_cost
    options = [e for e in (best_k(inp, "ngram"), best_k(inp, "model")) if e is not None]
    best = max(options, key=lambda e: e.tokens_per_ms, default=None)
    held = next((e for e in options if e.option == inp.current), None)
    if (
        best is not None
        and held is not None
        and best is not held
        and best.tokens_per_ms < held.tokens_per_ms * (1 + HYSTERESIS)
    ):
        best = held  # not clearly better: keep what is in use
    # A draft model behind the history is now or never: every plain step puts it a token
    # further behind with a token less to pay the catch-up back, so its estimate only falls.
    decaying = best is not None and best.option == "model" and inp.model_lag > RELAG
    margin = 0.0 if decaying else HYSTERESIS / 2
    if best is not None and best.tokens_per_ms <= plain * (1 + margin):
        best = None

    def others(chosen: Option) -> str:
        rest = [
            f"{OPTION_NAMES[e.option]} est {e.tokens_per_ms / plain:.2f}×"
            + _catch_ups(inp, e.option)
            for e in options
            if e.option != chosen
        ]
        return "; " + "; ".join(rest) if rest else ""

    trial = _trial(inp, max(plain, best.tokens_per_ms if best else plain))
    if trial is not None:
        return trial
    # Re-try, briefly, a draft model unused for EXPLORE_EVERY steps (not one that would first
    # have to catch up on a long stretch). Never n-gram lookup: a step that has a match and does
    # not use it learns what lookup would have had kept, at no cost (Ledger.learn_unused_match),
    # where a re-try paid a verify of its drafts: a 1-token re-try cost 16 ms against a 10 ms
    # plain step here, every 32 steps of a story whose matches were nearly always wrong. And only in
    # place of a plain step, never of a lookup step: that one is a likely win to give up, and
    # the steps where lookup runs just as the draft model has been idle long enough are those
    # of a prompt seen before, its answer remembered (a greeting, a client's warm-up: the same
    # one each time). Re-tried there, the demo draft lost a near-tie on the first token of a
    # bench's "Say hello." warm-up before every prompt (0 of 7 kept), and that one prompt
    # priced it below plain on every task after it.
    idle = next(
        (
            e
            for e in options
            if e.option == "model"
            and best is None
            and inp.step - inp.last_used.get("model", 0) >= EXPLORE_EVERY
            and inp.model_lag <= EXPLORE_MAX_LAG
        ),
        None,
    )
    if idle is not None:
        k = min(EXPLORE_K, inp.max_k)
        return Choice(
            "model",
            k,
            idle.tokens_per_ms / plain,
            f"governor: exploring the draft model ({k} tokens)",
        )
    if best is None:
        rival = max((e.tokens_per_ms / plain for e in options), default=0.0)
        why = "governor: plain, drafting would not pay" + others("none")
        return Choice("none", 0, 1.0, why, rival)
    if (
        best.option == "model"
        and inp.since_plain_ms >= PROBE_MS
        and inp.horizon >= PROBE_HORIZON
        and best.tokens_per_ms < plain * PROBE_BELOW
    ):
        return Choice(
            "none",
            0,
            1.0,
            f"governor: plain for one step, to measure it again (last measured "
            f"{inp.since_plain_ms / 1000:.1f} s of decoding ago; draft model est "
            f"{best.tokens_per_ms / plain:.2f}× plain)",
        )
    behind = _behind(inp) if best.option == "model" else ""
    why = (
        f"governor: {OPTION_NAMES[best.option]}, {best.k} tokens/step, est "
        f"{best.tokens_per_ms / plain:.2f}× plain (accept {best.first_rate:.2f} at pos 1)"
        + behind
        + _catch_ups(inp, best.option)
        + others(best.option)
    )
    return Choice(best.option, best.k, best.tokens_per_ms / plain, why)


def stand_for(last: Choice | None, choice: Choice, own_share: float) -> int:
    """How many steps `choice`, just asked for, may stand without asking again: none unless it
    is plain with every drafter well short of paying (SETTLE_BELOW) and a plain step's own work
    is worth saving (`own_share`: it over a one-token decode, at least SETTLE_SHARE); then
    SETTLE_STEPS, or twice what `last` (the answer's choice before it) stood for where that one
    had settled too, up to SETTLE_MAX. A draft model that starts to pay, a trial or a re-try
    waits that many steps at most."""
    if own_share < SETTLE_SHARE or choice.option != "none" or choice.rival >= SETTLE_BELOW:
        return 0
    if last is None or not last.stands:
        return SETTLE_STEPS
    return min(2 * last.stands, SETTLE_MAX)


def standing(last: Choice | None, steps_since: int) -> TypeGuard[Choice]:
    """Whether `last`, asked for `steps_since` steps ago, may still stand (stand_for), if
    lookup agrees (settled). (True says `last` is a Choice.)"""
    return last is not None and steps_since < last.stands


def settled(last: Choice | None, steps_since: int, match: str) -> TypeGuard[Choice]:
    """Whether this step may run plain on the last choice without asking `choose` again: it
    may still stand, and lookup has no match now (`match`: the table a match would be priced
    from, "" for none) or one priced from the table it was priced from then; a match of
    another length (another table) never waits. (True says `last` is a Choice.)"""
    return standing(last, steps_since) and match in ("", last.lookup)


def hand_over(inp: Inputs) -> int:
    """Part-way through a draft-model proposal, n-gram lookup has found what follows the
    tokens drafted so far (`ngram_match` tokens; `acceptance` holds its match length's): how
    many of them to append in place of the model's next drafts, or 0 to draft on. They are
    taken where lookup, priced as a step of its own, beats the draft model caught up: a
    remembered continuation is about free to propose, a draft-model token is not. (A small
    model answering in loops drafted 12-token steps at full acceptance, and still lost 20%
    to forced n-gram lookup, which proposed those same tokens for nothing.)"""
    ngram = best_k(inp, "ngram")
    if ngram is None:
        return 0
    # The draft model drafting on is priced without upkeep: it is handing over that leaves it
    # behind, not drafting on.
    model = best_k(replace(inp, model_lag=0, upkeep=0.0), "model")
    if model is not None and model.tokens_per_ms >= ngram.tokens_per_ms:
        return 0
    return ngram.k


def _trial(inp: Inputs, rival: float) -> Choice | None:
    """A draft-model step of the task's trial (see TRIAL_TRIES), or None. `rival`: the
    throughput of what would run instead (tokens per ms)."""
    acc = inp.acceptance["model"]
    if inp.draft_ms is None or acc.tries[0] >= TRIAL_TRIES or inp.horizon <= 0:
        return None
    if any(acc.seed_tries):
        return None  # the pair's other tasks measured it: the estimate decides
    plain_cost = plain_ms(inp)
    catch_up = catch_up_ms(inp)
    if plain_cost is None or catch_up > TRIAL_SHARE * inp.horizon * plain_cost:
        return None
    caught_up = best_k(replace(inp, model_lag=0), "model")
    if caught_up is None or caught_up.tokens_per_ms < TRIAL_FLOOR * rival:
        return None
    if inp.agreement_measured and caught_up.tokens_per_ms * plain_cost < 1 + HYSTERESIS:
        return None
    k = min(max(caught_up.k, TRIAL_K), inp.max_k)
    behind = _behind(inp)
    why = (
        f"governor: trying the draft model on {_task(inp.task)} ({k} tokens/step until it has "
        f"{TRIAL_TRIES} tries, {acc.tries[0]:.1f} so far), est "
        f"{caught_up.tokens_per_ms * plain_cost:.2f}× plain once caught up (accept "
        f"{caught_up.first_rate:.2f} at pos 1){behind}"
    )
    return Choice("model", k, caught_up.tokens_per_ms * plain_cost, why)


def _behind(inp: Inputs) -> str:
    """A draft model's catch-up due now, in a reason."""
    if inp.model_lag <= 1:
        return ""
    how = ""
    if copy_pays(inp.model_lag, inp.verify, inp.draft_ms, inp.draft_curve, inp.copy_ms):
        how = f" by copying the target's cache ({inp.copy_ms:.0f} ms)"
    return f", catching up on {inp.model_lag} tokens first{how}"


def _catch_ups(inp: Inputs, option: Option) -> str:
    """The draft model's later catch-ups in a reason, where they were priced, and the share
    of the answer a catch-up due now was spread over, where lookup takes part of it."""
    if option != "model":
        return ""
    out = f" (later catch-ups {inp.upkeep:.1f} ms/token)" if inp.upkeep >= 0.05 else ""
    if inp.model_lag <= RELAG or not inp.horizon:
        return out
    run = later_run(inp)
    if run is not None and run < inp.horizon * (1 - inp.lookup_share):
        return out + f" (catch-up spread over its runs in this answer, {run:.0f} tokens)"
    if inp.lookup_share >= 0.05:
        out += f" (catch-up spread over the {1 - inp.lookup_share:.0%} of the answer lookup leaves)"
    return out


def _task(task: str | None) -> str:
    """Whose table a reason speaks of: a named task's, or the one that every request naming
    no task shares (a daemon's OpenAI clients send none)."""
    return f"task {task!r}" if task is not None else "requests that name no task"


def next_window(window: int, proposed: int, kept: int) -> int:
    """This answer's cap on lookup's next proposal, after one of `proposed` tokens of which
    `kept` were kept: like a congestion window, cut to REACH_GROWTH × (kept + 1) by a
    failure, doubled by a draft kept whole. An answer starts at MAX_K.

    Acceptance is learned per task and match length, and a task's answers differ: after a
    JSON extraction that copied its notes 30 tokens at a time, a summary of the same notes
    drew 4-token matches priced at 0.85 per position, drafted 31-64 tokens a step, and kept
    1-9 of them; at the CPU's costs that answer ran 0.86× plain (fixed-cost replay), 1.01×
    with the window. The task's table learns too, but per position, and a draft that fails
    at its 3rd token teaches nothing of its 30th."""
    if kept < proposed:
        return min(MAX_K, max(MIN_REACH, REACH_GROWTH * (kept + 1)))
    return min(MAX_K, window * 2)
