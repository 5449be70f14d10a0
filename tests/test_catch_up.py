"""The governor and the draft model's catch-up: a draft model behind the history pays once to
catch up, spread over the answer still expected; a task's trial of it; its later catch-ups as
upkeep; the per-step re-decode (pure, synthetic and measured costs)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from homespec.engine.estimates import Acceptance, CostCurve
from homespec.engine.governor import TRIAL_TRIES, best_k, choose
from homespec.engine.governor_types import Choice, Inputs, Option
from homespec.engine.ledger import Ledger
from homespec.engine.target import shared_prefix

from .governor_cases import DEMO_DRAFT, DEMO_TARGET, curve, inputs, seen


def test_a_draft_model_that_must_first_catch_up_on_a_long_stretch_is_priced_so() -> None:
    v = curve(1.0, 0.1)
    fresh = inputs(v, model=0.9, draft_ms=0.2)
    assert choose(fresh).option == "model"
    behind = Inputs(fresh.verify, 0.2, 0.01, fresh.acceptance, 0, 64, 0, "none", model_lag=400)
    c = choose(behind)
    assert c.option == "none" and "draft model est" in c.reason


def test_a_catch_up_is_priced_on_the_draft_models_own_batch_costs() -> None:
    """Measured here: a Q4_1 draft costs 0.4x the F32 target for one token but 1.7x for a
    256-token batch (quantized batches are compute-bound). Scaling the target's curve by the
    one-token ratio priced a 243-token catch-up at a quarter of its cost; the draft's own
    curve prices it right, and the draft model is not chosen behind such a lag."""
    from homespec.engine.catch_up import catch_up_ms

    target = CostCurve({1: 23.0, 8: 39.0, 32: 85.0, 64: 147.0})
    draft = CostCurve({1: 9.5, 8: 37.7, 32: 121.7})
    acc = {"ngram": Acceptance(), "model": seen(0.97)}
    inp = Inputs(target, 9.5, 0.01, acc, 0, 8, 1, "none", model_lag=243, draft_curve=draft)
    assert catch_up_ms(inp) == pytest.approx(121.7 + (121.7 - 37.7) / 24 * 211)  # ~860 ms
    assert choose(inp).option == "none"
    unmeasured = Inputs(target, 9.5, 0.01, acc, 0, 8, 1, "none", model_lag=243)
    assert catch_up_ms(unmeasured) < catch_up_ms(inp) / 2  # the old estimate


def test_a_catch_up_is_paid_once_for_the_answer_still_to_come() -> None:
    """An 8B target and a 1B draft on a CPU: the draft drafts well (80%) and cheaply, but has
    not seen the 400-token prompt, and catching up costs it over 2 s. Priced into one step the
    draft model would never be chosen after a long prompt; spread over the 200 answer tokens
    expected it pays, and over the last 5 it does not."""
    target = curve(150.0, 10.0)
    draft = CostCurve({1: 20.0, 8: 60.0, 32: 200.0})
    acc = {"ngram": Acceptance(), "model": seen(0.8)}

    def pick(horizon: int) -> Choice:
        return choose(
            Inputs(target, 20.0, 0.01, acc, 0, 8, 1, "none", 400, {}, draft, horizon=horizon)
        )

    long = pick(200)
    assert long.option == "model" and 1.3 < long.speedup < 2.0, long
    assert "catching up on 400 tokens first" in long.reason
    assert pick(0).option == "none"  # one step cannot pay for it
    assert pick(5).option == "none"
    ledger = Ledger()
    # A task never seen: a guess, once its answer is not a few-token one.
    assert ledger.horizon("new task", generated=0, room=500) == 0
    assert ledger.horizon("new task", generated=8, room=500) == 56
    assert ledger.horizon("new task", generated=100, room=500) == 50
    for n in (300, 300, 300):
        ledger.observe_answer("edit", n, room=500, cut=False)
    assert ledger.horizon("edit", generated=100, room=400) == 200
    assert ledger.horizon("edit", generated=100, room=50) == 50
    # Past its task's answers an answer is expected to run at least half as long again.
    assert ledger.horizon("edit", generated=250, room=250) == 125
    assert ledger.horizon("edit", generated=400, room=500) == 200
    assert ledger.horizon("edit", generated=400, room=20) == 20
    # An answer cut at max_tokens would have run longer: it is read as running out of room.
    ledger.observe_answer("edit", 16, room=16, cut=True)
    assert ledger.horizon("edit", generated=100, room=400) == (3 * 200 + 400) // 4
    # A past answer is read by its share of its room: a reply that used 30% of it and a JSON
    # object that used 90% are read as 30% and 90% of this one's.
    ledger.observe_answer("mixed", 30, room=100, cut=False)
    ledger.observe_answer("mixed", 180, room=200, cut=False)
    assert ledger.horizon("mixed", generated=8, room=192) == (52 + 172) // 2
    assert ledger.horizon("mixed", generated=8, room=92) == (22 + 82) // 2
    # where every request has the same room, a share is a length
    ledger.observe_answer("same", 40, room=256, cut=False)
    assert ledger.horizon("same", generated=8, room=248) == 32


def test_an_unmeasured_draft_model_is_priced_by_a_prior_so_it_gets_tried() -> None:
    from homespec.engine.ledger import DRAFT_COST_PRIOR, Ledger

    ledger = Ledger()
    ledger.verify.observe(1, 20.0)
    inp = ledger.inputs(None, has_model=True, match=0, max_k=8)
    assert inp.draft_ms == 20.0 * DRAFT_COST_PRIOR
    assert ledger.inputs(None, has_model=False, match=0, max_k=8).draft_ms is None
    ledger.observe_draft([(1, 5.0), (1, 5.0)])
    assert ledger.inputs(None, has_model=True, match=0, max_k=8).draft_ms == 5.0


def test_a_draft_model_never_measured_on_a_task_is_tried_there_and_then_judged() -> None:
    """Measured on the 2-core machine: target 19 ms a token, Q4_1 draft 8 ms, a draft that
    lags 31 tokens behind a new prompt. On the prior alone (0.6) the draft model is priced
    below plain, so it never drafted, was never measured, and at temperature 1 it would have
    been 1.2-1.3× plain. Now a task tries it for a few steps, and what they measure decides."""
    target = CostCurve({1: 19.2, 2: 24.6, 4: 29.7, 8: 38.4, 16: 56.1, 32: 90.6})
    draft = CostCurve({1: 7.5, 8: 29.3, 32: 101.0})

    def run(rate_kept: float, steps: int = 40) -> list[Choice]:
        ledger = Ledger(verify=target, draft=draft)
        out = []
        for n in range(steps):
            inp = ledger.inputs("poem", has_model=True, match=0, max_k=8, horizon=64)
            inp.model_lag = 31 if n == 0 else 2
            c = choose(inp)
            out.append(c)
            ledger.chose(c.option)
            if c.option == "model":
                kept = next((i for i in range(c.k) if (n * 7 + i) % 100 >= rate_kept * 100), c.k)
                ledger.acceptance("poem")["model"].record(c.k, kept)
        return out

    first = run(0.95)[0]
    assert first.option == "model" and "trying the draft model on task 'poem'" in first.reason
    assert "catching up on 31 tokens first" in first.reason
    good = run(0.95)
    trial = [c for c in good if "trying" in c.reason]
    assert 6 <= len(trial) <= TRIAL_TRIES + 1  # a few steps, then the estimate decides
    assert all(c.option == "model" for c in good[len(trial) :])  # and it pays: kept
    bad = run(0.2)
    assert len([c for c in bad if "trying" in c.reason]) <= TRIAL_TRIES + 1
    assert all(c.option == "none" for c in bad[TRIAL_TRIES + 2 :])  # judged, and dropped


def test_a_draft_model_that_drafts_well_stays_on_when_an_answer_outruns_its_task() -> None:
    """Measured on the demo pair (2-core CPU): drafting 4 a step, the draft model ends each step
    2 tokens behind (its last draft and the target's bonus token), a 12 ms catch-up. A task's
    answers ran 20 tokens; this one is at 40 and going. Expecting nothing more of it priced
    that catch-up into one step, and plain ran the rest of the answer."""
    ledger = Ledger(verify=DEMO_TARGET, draft=DEMO_DRAFT)
    ledger.observe_answer("chat", 20, room=240, cut=False)
    ledger.by_task["chat"] = {"model": seen(0.9, k=8)}
    ledger.chose("model")
    horizon = ledger.horizon("chat", generated=40, room=200)
    assert horizon == 20
    inp = ledger.inputs("chat", has_model=True, match=0, max_k=8, model_lag=2, horizon=horizon)
    c = choose(inp)
    assert c.option == "model" and c.speedup > 1.1, c


def test_a_task_never_seen_spends_no_catch_up_on_a_few_token_answer() -> None:
    """Measured on the demo pair: a new task's first answer ran 8 tokens ("Hello! How are you
    today?"), and the draft model's trial caught up on the 16-token prompt first: 0.75× plain.
    Until the answer has run a few tokens it may be that kind, so no trial starts; past them,
    the trial does."""
    ledger = Ledger(verify=DEMO_TARGET, draft=DEMO_DRAFT)

    def pick(generated: int) -> Choice:
        horizon = ledger.horizon("chat", generated, room=200 - generated)
        inp = ledger.inputs("chat", has_model=True, match=0, max_k=8, model_lag=16 + generated)
        return choose(replace(inp, horizon=horizon))

    assert pick(0).option == pick(4).option == "none"
    assert "trying the draft model on task 'chat'" in pick(8).reason
    # The table every request without a task shares is not called "this task"
    untasked = ledger.inputs(None, has_model=True, match=0, max_k=8, model_lag=24, horizon=64)
    assert "trying the draft model on requests that name no task" in choose(untasked).reason


def test_a_task_is_not_tried_once_the_pair_measured_the_draft_model_on_another() -> None:
    """The trial is for a draft model the pair knows nothing of. Once another task measured
    it, a new task's table is seeded from theirs and the estimate decides: measured poor, it
    is not caught up on a new prompt for a trial (on a shell-script edit that trial cost 10%
    against forced n-gram); measured good, the estimate itself picks it."""

    def first_step(other_rate: float | None) -> Choice:
        ledger = Ledger(verify=DEMO_TARGET, draft=DEMO_DRAFT)
        if other_rate is not None:
            ledger.by_task["list"] = {"model": seen(other_rate, k=8)}
        inp = ledger.inputs("edit", has_model=True, match=0, max_k=8, model_lag=31, horizon=64)
        return choose(inp)

    assert "trying the draft model" in first_step(None).reason
    poor = first_step(0.5)
    assert poor.option == "none" and "trying" not in poor.reason, poor
    good = first_step(0.97)
    assert good.option == "model" and "trying" not in good.reason, good


def test_a_trial_is_not_made_where_it_cannot_pay() -> None:
    """Not behind a catch-up that costs much of the answer (a long document), not with a
    draft as costly as its target, not where n-gram drafting already does far better."""
    target = CostCurve({1: 19.2, 2: 24.6, 4: 29.7, 8: 38.4, 16: 56.1, 32: 90.6})
    draft = CostCurve({1: 7.5, 8: 29.3, 32: 101.0})
    acc = {"ngram": Acceptance(), "model": Acceptance()}

    def pick(lag: int, horizon: int, curve: CostCurve = draft) -> Choice:
        ms = curve.at(1)
        return choose(Inputs(target, ms, 0.01, acc, 0, 8, 1, "none", lag, {}, curve, horizon))

    assert "trying" in pick(31, 64).reason
    assert pick(250, 64).option == "none"  # ~800 ms to catch up for a 64-token answer
    assert pick(250, 2000).option == "model"  # a long answer pays for it
    assert pick(31, 0).option == "none"  # nothing left to speed up
    costly = CostCurve({1: 19.0, 8: 60.0, 32: 200.0})
    assert pick(31, 64, costly).option == "none"
    copying = {"ngram": seen(0.95), "model": Acceptance()}
    inp = Inputs(target, 7.5, 0.01, copying, 64, 64, 1, "none", 31, {}, draft, 64)
    assert choose(inp).option == "ngram"


def test_a_trial_that_kept_nearly_every_draft_is_believed() -> None:
    """Measured on the demo pair: a new task's trial drafted 4 tokens a step and kept all 4 in
    8 steps of 9 (one kept 1). Shrunk toward the 0.6 prior by 4 pseudo-steps, that was an
    estimated 1.01× plain, and the draft model, 1.2× plain when forced, was switched off."""
    ledger = Ledger(verify=DEMO_TARGET, draft=DEMO_DRAFT)
    table = ledger.acceptance("email")["model"]
    for kept in (4, 4, 4, 4, 1, 4, 4, 4, 4):
        table.record(4, kept)
    ledger.chose("model")
    inp = ledger.inputs("email", has_model=True, match=0, max_k=16, model_lag=2, horizon=24)
    c = choose(inp)
    assert c.option == "model" and c.speedup > 1.1, c


def test_every_draft_model_step_pays_for_re_decoding_its_last_draft_and_the_targets_token() -> None:
    """After a step that kept every draft, the draft model's next first decode carries 2 tokens
    (its last draft, never decoded, and the target's own): 12.4 ms against 7.1 for one. That
    is a cost of every such step, so it is spread over each step's tokens, which makes drafts
    longer, and not over the answer, which priced the draft model above what it did: at 93%
    acceptance it drafted 4 tokens a step, 1.09× plain, where 6 forced did 1.16×."""
    draft = CostCurve({1: 7.1, 2: 12.4, 8: 29.0, 16: 51.9, 32: 99.2})
    acc: dict[Option, Acceptance] = {"ngram": Acceptance(), "model": seen(0.95, k=16)}
    inp = Inputs(DEMO_TARGET, 7.1, 0.02, acc, 0, 16, 0, "model", model_lag=2, horizon=100)
    priced = best_k(replace(inp, draft_curve=draft), "model")
    assert priced is not None and priced.k >= 6
    plain_ms = DEMO_TARGET.at(1)
    assert plain_ms is not None
    assert priced.tokens_per_ms * plain_ms < 1.3  # what 2-token first decodes allow


def test_a_draft_that_rarely_agrees_with_its_target_is_not_tried_on_a_new_task() -> None:
    """A draft model is tried on each new task (it must catch up on the prompt first) only
    where it could pay: a draft measured at load to agree with its target a quarter of the
    time never could, one that agrees 95% of the time is tried at once."""

    def first(agreement: float) -> Choice:
        ledger = Ledger(verify=DEMO_TARGET, draft=DEMO_DRAFT, agreement=agreement)
        inp = ledger.inputs("new", has_model=True, match=0, max_k=8, model_lag=31, horizon=64)
        return choose(inp)

    assert first(0.25).option == "none"
    good = first(0.95)
    assert good.option == "model" and "trying the draft model" in good.reason


def test_a_draft_that_would_lose_even_as_right_as_measured_is_not_tried() -> None:
    """Measured on the 2-core machine: the demo draft costs 0.6x its F32 target a token there
    (5.8 against 9.4 ms) and agrees with it 97% of the time. Caught up, it was estimated at
    0.83x plain, and a trial (which took 0.8x the rival then) caught it up on a 21-token
    answer's prompt anyway: 48-49 tok/s on it, 82-87 without. With a measured agreement a
    trial needs to beat plain by the margin any new option needs, caught up; on a prior that
    is a guess it keeps the slack."""
    target = CostCurve({1: 9.4, 2: 14.4, 4: 20.2, 8: 29.0, 16: 43.2, 32: 72.0})
    draft = CostCurve({1: 5.8, 8: 23.0, 32: 73.5})
    ledger = Ledger(verify=target, draft=draft, agreement=0.97)
    inp = ledger.inputs("boilerplate", has_model=True, match=0, max_k=64, model_lag=7, horizon=248)
    assert inp.agreement_measured
    caught_up = best_k(replace(inp, model_lag=0), "model")
    assert caught_up is not None and 0.8 < caught_up.tokens_per_ms * 9.4 < 1.0
    assert choose(inp).option == "none", choose(inp)
    guessed = choose(replace(inp, agreement_measured=False))
    assert guessed.option == "model" and "trying the draft model" in guessed.reason


def test_a_task_never_seen_is_expected_to_stop_halfway_through_the_room_it_was_left() -> None:
    """Measured on the demo pair: a one-sentence rewrite asked with max_tokens 64 was expected
    to run 56 more tokens at its 8th, the draft model caught up on the prompt for a trial, and
    the answer ended at 23 tokens (0.88× plain). All that max_tokens says of an answer is that
    it stops within it; the same answer with room to run long is still tried."""
    ledger = Ledger(verify=DEMO_TARGET, draft=DEMO_DRAFT)

    def first_trial(max_tokens: int) -> Choice:
        horizon = ledger.horizon("rewrite", 8, room=max_tokens - 8)
        inp = ledger.inputs("rewrite", has_model=True, match=0, max_k=8, model_lag=30 + 8)
        return choose(replace(inp, horizon=horizon))

    assert first_trial(64).option == "none"
    assert "trying the draft model" in first_trial(256).reason


def test_the_draft_models_later_catch_ups_are_a_cost_of_every_token_it_drafts() -> None:
    """Where n-gram steps leave the draft model behind every few steps (an answer that keeps
    repeating itself), it catches up again before each of its steps: priced only as they
    came, each spread over the whole answer expected, they looked free, and a list answer ran
    15% slower than by lookup alone. The task's upkeep (ms per token it commits) prices them.
    The demo curves, 10 tokens behind, 200 expected, no n-gram match."""
    acc = {"ngram": Acceptance(), "model": seen(0.97)}

    def pick(upkeep: float, lag: int = 10) -> Choice:
        return choose(
            Inputs(DEMO_TARGET, 7.1, 0.01, acc, 0, 8, 1, "none", lag, {}, DEMO_DRAFT, 200, upkeep)
        )

    assert pick(0.0).option == "model"  # no later catch-ups measured: this one is paid once
    assert pick(2.0).option == "model"  # a few ms per token: the draft model still pays
    costly = pick(5.0)
    assert costly.option == "none", costly  # it would not: later catch-ups cost more than it saves
    assert "draft model est 0.9" in costly.reason
    assert "(later catch-ups 5.0 ms/token)" in costly.reason  # the reason says what it priced
    assert "later catch-ups 2.0 ms/token" in pick(2.0).reason
    assert "later catch-ups" not in pick(0.0).reason
    # Caught up or not, the catch-ups still to come are the same cost.
    assert pick(5.0, lag=1).option == "none"
    assert pick(2.0, lag=1).speedup > pick(2.0).speedup  # only this catch-up is saved


def test_a_catch_up_is_spread_over_the_part_of_the_answer_the_draft_model_serves() -> None:
    """Where lookup commits most of a task's answers, the draft model serves the rest, and a
    catch-up on the prompt buys only that: spread over the whole horizon, the demo draft
    caught up on a paragraph rewrite's 89-token prompt for an estimated 1.12x plain, and the
    answer ran 0.77x forced n-gram. The demo curves, no n-gram match this step, 200 tokens
    expected."""
    acc = {"ngram": Acceptance(), "model": seen(0.97)}

    def pick(share: float, lag: int = 40) -> Choice:
        inp = Inputs(DEMO_TARGET, 7.1, 0.01, acc, 0, 8, 1, "none", lag, {}, DEMO_DRAFT, 200)
        return choose(replace(inp, lookup_share=share))

    whole = pick(0.0)
    assert whole.option == "model" and 1.0 < whole.speedup < 1.4  # spread over all 200
    assert pick(0.3).speedup < whole.speedup  # over 140: a little dearer
    refused = pick(0.9)  # over 20 tokens: it does not pay
    assert refused.option == "none", refused
    assert "draft model est 0." in refused.reason
    assert "(catch-up spread over the 10% of the answer lookup leaves)" in refused.reason
    assert "lookup leaves" not in whole.reason
    # Caught up (a step's own 1-2 token lag), nothing is spread: lookup's share is no matter.
    assert pick(0.9, lag=2).speedup == pytest.approx(pick(0.0, lag=2).speedup)


def test_a_later_catch_up_is_spread_over_the_draft_models_runs_in_the_answer() -> None:
    """Where lookup takes over again after every step or two of the draft model (a dialogue
    whose speakers' lines repeat), a later catch-up buys one such run, not the rest of the
    answer: spread over the horizon, the demo draft caught up on the 28 tokens lookup had
    committed, every 30 or so, for one 11-token step at a time, and the answer ran 0.93x forced
    n-gram lookup. Unless plain steps have run longer than its runs since lookup last matched.
    The demo curves, 28 tokens behind, 90 expected, no n-gram match this step."""
    acc = {"ngram": Acceptance(), "model": seen(0.97)}
    inp = Inputs(DEMO_TARGET, 7.1, 0.01, acc, 0, 8, 1, "none", 28, {}, DEMO_DRAFT, 90)

    def pick(run: float, streak: int = 0, lag: int = 28) -> Choice:
        return choose(replace(inp, model_lag=lag, model_run=run, plain_streak=streak))

    assert pick(0.0).option == "model"  # no later catch-up yet in this answer: as before
    assert pick(80.0).option == "model"  # long runs: about the horizon
    short = pick(11.0)
    assert short.option == "none", short  # one 11-token run per catch-up does not pay
    assert "(catch-up spread over its runs in this answer, 11 tokens)" in short.reason
    assert "its runs" not in pick(0.0).reason
    # Plain steps have run longer than its runs: lookup is not coming back soon.
    assert pick(11.0, streak=60).option == "model"

    # the draft model's estimate, chosen or not
    def est(c: Choice) -> float:
        return c.speedup if c.option == "model" else c.rival

    assert est(pick(11.0, streak=40)) > est(pick(11.0, streak=20)) > short.rival
    # Caught up (a step's own lag), there is no catch-up to spread.
    assert pick(11.0, lag=2).speedup == pytest.approx(pick(0.0, lag=2).speedup)


@given(
    st.lists(st.integers(0, 3), max_size=200),
    st.lists(st.integers(0, 3), max_size=60),
    st.lists(st.integers(0, 3), max_size=60),
    st.booleans(),
)
def test_shared_prefix_is_where_a_cache_and_the_history_part(
    common: list[int], cache_tail: list[int], history_tail: list[int], swap: bool
) -> None:
    """A draft model's lag is the history past this: its cache holds what it decoded (drafts
    the target rejected included), the history what was committed."""
    cached, history = common + cache_tail, common + history_tail
    if swap:
        cached, history = history, cached
    n = min(len(cached), len(history))
    expected = next((i for i in range(n) if cached[i] != history[i]), n)
    assert shared_prefix(cached, history) == expected


@pytest.mark.parametrize("length", [1, 17, 100, 2048])
def test_shared_prefix_finds_a_parting_at_every_position(length: int) -> None:
    history = list(range(length))
    for at in range(length):
        cached = [*history[:at], -1, *history[at + 1 :]]
        assert shared_prefix(cached, history) == at
    assert shared_prefix(history, [*history, 5]) == length


def test_a_draft_model_behind_the_history_that_would_pay_is_caught_up_now_not_never() -> None:
    """Every plain step puts a lagging draft model a token further behind, with a token less
    of the answer to pay its catch-up back, so its estimate only falls: at 1.01x plain on a
    new task (a FizzBuzz answer, fixed-cost replay) it was left for a few steps under the 2.5%
    any drafter needs over plain, fell to 0.61x and never ran, where forced it ran 1.46x plain.
    So a catch-up that pays at all is made at once; a draft model already caught up, whose
    estimate waiting does not lower, still needs the margin."""
    from homespec.engine.catch_up import RELAG
    from homespec.engine.governor import HYSTERESIS, plain_ms

    base = Inputs(
        DEMO_TARGET,
        7.1,
        0.01,
        {"ngram": Acceptance(), "model": seen(0.9)},
        0,
        8,
        1,
        "none",
        draft_curve=DEMO_DRAFT,
    )

    def speedup(inp: Inputs) -> float:
        est = best_k(inp, "model")
        plain = plain_ms(inp)
        assert est is not None and plain is not None
        return est.tokens_per_ms * plain

    # A lagging draft model whose estimate lands just over plain, under plain + the margin.
    behind = [replace(base, model_lag=40, horizon=h) for h in range(8, 400)]
    marginal = [i for i in behind if 1.0 < speedup(i) <= 1 + HYSTERESIS / 2]
    assert marginal, "no horizon prices the catch-up within the margin"
    for inp in marginal:
        c = choose(inp)
        assert c.option == "model" and "catching up on 40 tokens first" in c.reason, c
    # Priced below plain it waits (plain), as before.
    losing = [i for i in behind if speedup(i) < 1.0]
    assert losing and all(choose(i).option == "none" for i in losing)
    # Caught up (a lag of RELAG or less is every step's own), the margin holds.
    rates = [r / 1000 for r in range(300, 1000)]
    level = [
        replace(base, acceptance={"ngram": Acceptance(), "model": seen(r)}, model_lag=RELAG)
        for r in rates
    ]
    near = [i for i in level if 1.0 < speedup(i) <= 1 + HYSTERESIS / 2]
    assert near and all(choose(i).option == "none" for i in near)
