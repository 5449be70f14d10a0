"""The governor's decision (pure) on synthetic costs and acceptance."""

from __future__ import annotations

import itertools
import math
import operator
import random
from dataclasses import replace

import pytest

from homespec.engine.estimates import (
    MATCH_PRIORS,
    MAX_K,
    MIN_REACH,
    PRIOR,
    Acceptance,
    CostCurve,
    expected_by_length,
    expected_tokens,
)
from homespec.engine.governor import (
    EXPLORE_EVERY,
    EXPLORE_K,
    PROBE_BELOW,
    PROBE_HORIZON,
    PROBE_MS,
    SETTLE_BELOW,
    SETTLE_MAX,
    SETTLE_STEPS,
    choose,
    hand_over,
    next_window,
    settled,
    stand_for,
    standing,
    step_ms,
)
from homespec.engine.governor_types import Choice, Inputs, Option
from homespec.engine.ledger import Ledger

from .governor_cases import DEMO_DRAFT, DEMO_TARGET, curve, inputs, seen


def test_a_flat_cost_curve_gives_long_drafts() -> None:
    c = choose(inputs(curve(1.0, 0.005), ngram=0.9))
    assert c.option == "ngram" and c.k >= 16 and c.speedup > 3


def test_a_steep_cost_curve_gives_short_drafts() -> None:
    c = choose(inputs(curve(1.0, 0.3), ngram=0.8))
    assert c.option == "ngram" and 1 <= c.k <= 4 and c.speedup > 1.05


def test_a_draft_model_as_costly_as_the_target_is_never_used() -> None:
    c = choose(inputs(curve(1.0, 0.05), model=0.9, draft_ms=1.0))
    assert c.option == "none" and "draft model est" in c.reason
    cheap = choose(inputs(curve(1.0, 0.05), model=0.9, draft_ms=0.1))
    assert cheap.option == "model" and cheap.speedup > 1.5


def test_collapsing_acceptance_turns_speculation_off_and_a_recovery_turns_it_back_on() -> None:
    ledger = Ledger(verify=curve(1.0, 0.2))
    ledger.by_task[None] = {"ngram@2": seen(0.9), "model": Acceptance()}
    acc = ledger.acceptance(None)["ngram"]

    def step() -> Option:
        c = choose(ledger.inputs(None, has_model=False, match=64, max_k=64))
        ledger.chose(c.option)
        return c.option

    assert step() == "ngram"
    for _ in range(600):  # the prompt stops repeating: drafts are rejected at once
        acc.record(4, 0)
    assert [step() for _ in range(4 * EXPLORE_EVERY)] == ["none"] * (4 * EXPLORE_EVERY)
    # Lookup's proposals start being right: the plain steps that did not use them learn so
    # (Ledger.learn_unused_match records one position per step), and it turns back on.
    for _ in range(200):
        if step() == "ngram":
            break
        acc.record(1, 1)
    assert step() == "ngram"


def test_n_gram_lookup_is_never_re_tried_while_the_draft_model_is() -> None:
    """Lookup is measured for free on every step that has a match (Ledger.learn_unused_match), so a
    re-try would only pay a verify for it; a draft model left unused is measured only by one."""
    ledger = Ledger(verify=curve(10.0, 2.0))
    ledger.draft = CostCurve({1: 6.0, 2: 12.0})
    ledger.by_task[None] = {"ngram@2": seen(0.1), "model": seen(0.3)}
    chosen = []
    for _ in range(3 * EXPLORE_EVERY):
        c = choose(ledger.inputs(None, has_model=True, match=8, max_k=16, model_lag=1, match_len=2))
        ledger.chose(c.option)
        chosen.append((c.option, c.k))
    assert "ngram" not in {o for o, _ in chosen}
    assert chosen.count(("model", EXPLORE_K)) == 2  # after EXPLORE_EVERY steps unused, each time


def test_a_draft_model_is_re_tried_in_place_of_plain_steps_never_of_lookup_steps() -> None:
    """Exploring costs the step it displaces. A lookup step that would run (a long match)
    is a likely win to give up, and the steps where one comes right after the draft model
    was idle are those of a prompt seen before (its answer is in the memory): a greeting
    or a client's warm-up, the same one each time. Re-tried there, a draft whose first
    token on that one prompt is a near-tie it loses was measured failing again and again,
    and priced below plain on every task after it."""
    ledger = Ledger(verify=curve(10.0, 2.0))
    ledger.draft = CostCurve({1: 4.0, 2: 8.0})
    ledger.by_task[None] = {"ngram@32": seen(0.95), "ngram@0": seen(0.1), "model": seen(0.3)}

    def steps(match: int, match_len: int, n: int) -> list[tuple[Option, int]]:
        out = []
        for _ in range(n):
            c = choose(
                ledger.inputs(
                    None, has_model=True, match=match, max_k=16, model_lag=1, match_len=match_len
                )
            )
            ledger.chose(c.option)
            out.append((c.option, c.k))
        return out

    assert {o for o, _ in steps(32, 32, 3 * EXPLORE_EVERY)} == {"ngram"}
    # The matches end: the next plain step is the re-try.
    assert steps(0, 0, 1) == [("model", EXPLORE_K)]


def test_plain_is_measured_again_while_a_marginal_drafter_runs() -> None:
    """Only a plain step measures plain decoding's cost, and a one-token decode's cost wanders
    with the machine's memory traffic where a batched verify's does not. A draft model that
    paid a little when plain was measured keeps being weighed against that old cost unless a
    plain step measures it again: here plain gets twice as cheap while the draft model drafts,
    and the probes, one per PROBE_MS of decoding, see it and turn drafting off."""
    ledger = Ledger(verify=curve(10.0, 2.0))
    ledger.draft = CostCurve({1: 1.0, 2: 2.0})
    ledger.by_task[None] = {"ngram@0": seen(0.1), "model": seen(0.75)}

    def step() -> Choice:
        c = choose(ledger.inputs(None, has_model=True, match=0, max_k=16, model_lag=1, horizon=200))
        ledger.chose(c.option)
        if c.option == "none":
            ledger.observe_verify(1, 5.0)  # the machine's plain cost now
        else:
            ledger.observe_draft([(1, 1.0)] * c.k)
            ledger.observe_verify(c.k + 1, ledger.verify.at(c.k + 1) or 0.0)
        return c

    first = step()
    assert first.option == "model" and first.speedup < PROBE_BELOW
    step_ms = ledger.since_plain_ms  # one draft-model step's decoding
    chosen = [step() for _ in range(int(12 * PROBE_MS / step_ms))]
    probes = [i for i, c in enumerate(chosen) if "to measure it again" in c.reason]
    assert probes and probes[0] == math.ceil(PROBE_MS / step_ms) - 1  # PROBE_MS of decoding in
    # plain, once it is measured cheap (the draft model re-tried now and then, as any option)
    assert all(c.option == "none" or "exploring" in c.reason for c in chosen[-100:])
    assert sum(c.option == "none" for c in chosen[-100:]) >= 90


def test_plain_is_not_probed_near_an_answers_end_nor_in_place_of_lookup() -> None:
    """A probe leaves the draft model a token further behind, and near the answer's end that
    is a catch-up the few tokens left cannot repay; lookup steps give way to plain steps of
    their own wherever matches end, so they are not interrupted."""
    ledger = Ledger(verify=curve(10.0, 2.0))
    ledger.draft = CostCurve({1: 1.0, 2: 2.0})
    ledger.by_task[None] = {"ngram@0": seen(0.1), "ngram@8": seen(0.6), "model": seen(0.75)}
    ledger.since_plain_ms = 10 * PROBE_MS

    def option(**kw: int) -> Option:
        return choose(ledger.inputs(None, has_model=True, max_k=16, model_lag=1, **kw)).option

    assert option(match=0, horizon=200) == "none"  # the probe
    assert option(match=0, horizon=PROBE_HORIZON - 1) == "model"
    assert option(match=0, horizon=0) == "model"  # nothing known of what is left
    ledger.by_task[None]["model"] = seen(0.1)
    assert option(match=16, match_len=8, horizon=200) == "ngram"


def test_a_drafter_far_ahead_of_plain_is_not_interrupted() -> None:
    ledger = Ledger(verify=curve(10.0, 0.5))
    ledger.draft = CostCurve({1: 0.2, 2: 0.4})
    ledger.by_task[None] = {"ngram@0": seen(0.1), "model": seen(0.95)}
    ledger.since_plain_ms = 10 * PROBE_MS
    c = choose(ledger.inputs(None, has_model=True, match=0, max_k=16, model_lag=1, horizon=200))
    assert c.option == "model" and c.speedup > PROBE_BELOW


def test_a_probe_of_plain_says_so() -> None:
    ledger = Ledger(verify=curve(10.0, 2.0))
    ledger.draft = CostCurve({1: 1.0, 2: 2.0})
    ledger.by_task[None] = {"ngram@0": seen(0.1), "model": seen(0.75)}
    ledger.since_plain_ms = PROBE_MS - 1
    c = choose(ledger.inputs(None, has_model=True, match=0, max_k=16, model_lag=1, horizon=200))
    assert c.option == "model"
    ledger.observe_verify(4, 20.0)
    c = choose(ledger.inputs(None, has_model=True, match=0, max_k=16, model_lag=1, horizon=200))
    assert c.option == "none" and c.k == 0
    assert c.reason.startswith("governor: plain for one step, to measure it again")
    assert "last measured 2.0 s of decoding ago" in c.reason and "draft model est" in c.reason
    ledger.observe_verify(1, 10.0)  # the probe's own decode
    assert ledger.since_plain_ms == 0.0
    c = choose(ledger.inputs(None, has_model=True, match=0, max_k=16, model_lag=1, horizon=200))
    assert c.option == "model"


def test_no_match_means_no_n_gram_option_and_nothing_measured_means_plain() -> None:
    assert choose(inputs(curve(1.0, 0.01), ngram=0.9, match=0)).option == "none"
    c = choose(inputs(CostCurve(), ngram=0.9))
    assert (c.option, c.k) == ("none", 0)


def test_hysteresis_keeps_the_option_in_use_when_the_other_is_barely_better() -> None:
    v = curve(1.0, 0.05)
    c = choose(inputs(v, ngram=0.80, model=0.82, draft_ms=0.02, current="ngram", step=1))
    assert c.option == "ngram"


def test_a_single_measured_point_extrapolates_with_the_prior_slope() -> None:
    v = CostCurve({1: 10.0}, slope=0.25)
    assert v.at(5) == 20.0 and v.at(1) == 10.0
    v.observe(5, 30.0)
    assert v.at(3) == 20.0  # linear between measured points
    v.observe(5, 20.0)
    assert v.at(5) == 28.0  # a moving average, not the last value


def test_expected_tokens_counts_the_targets_own_token() -> None:
    acc = seen(0.5)
    assert abs(expected_tokens(acc, 2, prior=0.5) - (1 + 0.5 + 0.25)) < 0.02
    assert expected_tokens(Acceptance(), 0, prior=0.5) == 1.0


def test_the_governors_shortcuts_price_exactly_as_the_plain_formulas() -> None:
    """What the governor reads every step is computed the quick way (record and reach skip the
    positions never tried, expected_by_length writes rate out, upto walks the points once):
    the same numbers, to the bit, as each position's rate and each size's `at`."""
    rng = random.Random(8)
    seed_tries, seed_kept = [0.0] * MAX_K, [0.0] * MAX_K
    seed_tries[1:5], seed_kept[1:5] = [4.0, 3.0, 2.0, 1.0], [3.5, 2.0, 1.0, 0.5]
    acc = Acceptance(prior=0.7, prior_weight=3.0, seed_tries=seed_tries, seed_kept=seed_kept)
    assert acc.reach() == 10  # the seeds reach position 5 before anything is recorded
    naive_tries, naive_kept = list(acc.tries), list(acc.kept)
    for step in range(400):
        proposed = rng.choice([1, 2, 3, 6, 12, 30, 64] if step % 50 < 40 else [2])
        accepted = rng.randint(0, proposed)
        acc.record(proposed, accepted)
        naive_tries = [x * 0.99 for x in naive_tries]
        naive_kept = [x * 0.99 for x in naive_kept]
        for i in range(min(accepted + 1, proposed)):
            naive_tries[i] += 1
            naive_kept[i] += i < accepted
        assert acc.tries == naive_tries and acc.kept == naive_kept
        deepest = max(
            (i + 1 for i in range(MAX_K) if naive_tries[i] + acc.seed_tries[i] >= 1), default=0
        )
        assert acc.reach() == max(MIN_REACH, 2 * deepest)
        for stretch in (1.0, 0.9):
            rates, prior = [], 0.7
            for i in range(MAX_K):
                prior = acc.rate(i, prior * stretch if i else prior)
                rates.append(prior)
            want = list(itertools.accumulate(itertools.accumulate(rates, operator.mul), initial=1))
            assert list(expected_by_length(acc, 0.7, stretch)) == want[1:]
    for points in ({4: 3.0}, {1: 1.2, 2: 2.8, 8: 3.5, 32: 5.1}, {3: 2.0, 30: 9.0, 31: 8.0}):
        cost = CostCurve(dict(points))
        for n in (1, 2, 3, 5, 31, 64):  # short of, at, between and past the points
            assert cost.upto(n) == [cost.at(i) for i in range(1, n + 1)]
    assert CostCurve().upto(8) is None


def test_a_new_task_starts_from_what_the_pair_measured_on_its_other_tasks() -> None:
    """A draft that agrees with its target 95% of the time on one task is priced that way on
    a task never seen, and chosen there; a pair that measured nothing starts from the priors."""
    ledger = Ledger(verify=curve(23.0, 2.3))
    ledger.draft = CostCurve({1: 9.0, 8: 38.0, 32: 120.0})
    for _ in range(200):
        ledger.acceptance("code")["model"].record(6, 6 if _ % 20 else 0)
    fresh = ledger.acceptance("math")["model"]
    assert 0.9 < fresh.prior < 0.96 and fresh.tries[0] == 0  # a prior, not borrowed counts
    inp = ledger.inputs("math", has_model=True, match=0, max_k=8, model_lag=1)
    assert choose(inp).option == "model"
    assert Ledger().acceptance("math")["model"].prior == PRIOR
    assert Ledger().acceptance("math", 20)["ngram"].prior == MATCH_PRIORS[16]


def test_the_cost_curve_never_falls_past_its_last_point() -> None:
    """Real steps measure neighbouring sizes; noise that makes the last segment fall must not
    price a long batch at nothing (it priced a 243-token catch-up at 0 ms)."""
    v = CostCurve({1: 20.0, 2: 26.0, 4: 32.0, 8: 40.0, 16: 58.0, 30: 96.0, 31: 95.0})
    assert v.at(243) == pytest.approx(95.0 + (95.0 - 40.0) / 23 * 212)  # from 8, not 30
    flat = CostCurve({1: 20.0, 2: 19.0})
    assert flat.at(64) == 19.0


def test_a_curve_first_measured_at_a_batch_prices_one_token_above_zero() -> None:
    """In-process `ask` has no calibration: the draft's first measured decode may be its
    catch-up on a 300-token prompt. One token must not come out free, or negative."""
    v = CostCurve({301: 1200.0}, slope=0.25)
    assert v.at(1) == pytest.approx(1200.0 / 76)
    assert 0 < v.at(1) < v.at(8) < v.at(301) == 1200.0
    two = CostCurve({40: 150.0, 41: 120.0})  # noisy neighbours, first measured late
    assert 0 < two.at(1) < two.at(40)
    ledger = Ledger()
    ledger.observe_draft([(301, 1200.0)])
    assert ledger.draft_ms is not None and ledger.draft_ms > 10


def test_drafts_grow_past_what_was_tried_when_every_tried_position_is_kept() -> None:
    """Only 6-token drafts were ever tried (a forced drafter), all kept: on a flat curve the
    governor at most doubles the deepest tried length per step, and as those are kept too,
    doubles again: long drafts within a handful of steps, never a jump straight to 64 on no
    evidence."""
    acc = Acceptance()
    for _ in range(200):
        acc.record(6, 6)
    ks = []
    for step in range(16):
        inp = Inputs(
            curve(1.0, 0.01),
            None,
            0.01,
            {"ngram": acc, "model": Acceptance()},
            64,
            64,
            step,
            "ngram",
        )
        k = choose(inp).k
        ks.append(k)
        acc.record(k, k)  # every drafted token kept
    assert 6 < ks[0] <= 12  # beyond what was tried, not to the end on faith
    assert ks == sorted(ks) and ks[-1] == 64, ks
    assert ks.index(64) <= 4  # 12, 24, 48, 64: doubling, not a position at a time


def test_n_gram_acceptance_is_a_constant_hazard_and_the_draft_models_compounds() -> None:
    """A copied continuation that was right for 8 tokens is priced to stay right at the
    measured rate past them (an edit breaks it anywhere); a draft model's untried positions
    are priced lower and lower (its errors compound). Same measurements, same costs."""
    acc = Acceptance()
    for _ in range(300):
        acc.record(8, 8)
    v = curve(1.0, 0.05)
    ngram = Inputs(v, None, 0.01, {"ngram": acc, "model": Acceptance()}, 64, 64, 1, "ngram")
    model = Inputs(v, 0.001, 0.01, {"ngram": Acceptance(), "model": acc}, 0, 64, 1, "model")
    k_ngram, k_model = choose(ngram).k, choose(model).k
    assert k_ngram == 16  # the reach: twice the deepest tried, all priced at ~0.99
    assert 8 <= k_model < k_ngram
    # The reach is what was tried: failures early keep it short.
    short = Acceptance()
    for _ in range(300):
        short.record(8, 1)  # position 2 always rejected: positions 3.. never tried
    assert short.reach() == 8 and Acceptance().reach() == 8


def test_a_long_match_is_trusted_with_a_long_draft_and_a_short_one_is_not() -> None:
    ledger = Ledger(verify=curve(1.0, 0.3))  # a CPU: every drafted token costs
    ledger.by_task["code-edit"] = {"ngram@16": seen(0.95), "ngram@2": seen(0.3)}

    def pick(match_len: int) -> tuple[Option, int]:
        inp = ledger.inputs("code-edit", has_model=False, match=64, max_k=64, match_len=match_len)
        c = choose(inp)
        return c.option, c.k

    long_option, long_k = pick(20)
    assert long_option == "ngram" and long_k >= 6
    assert pick(2)[0] == "none"  # 2-token matches are mostly wrong here
    # An unmeasured bucket starts from its prior: longer matches are trusted more.
    fresh = Ledger(verify=curve(1.0, 0.1))
    rates = [fresh.acceptance(None, n)["ngram"].prior for n in (2, 5, 9, 17, 40)]
    assert rates == sorted(rates) and rates[0] < rates[-1]


def test_a_draft_model_hands_over_to_lookup_where_lookup_is_worth_more() -> None:
    """Part-way through a draft-model proposal lookup finds a continuation: a match that has
    been right is taken (its tokens cost nothing to propose, the model's 7 ms each); one that
    rarely is, is not, and the model drafts on."""
    model = seen(0.95, k=16)

    def taken(ngram: Acceptance, match: int) -> int:
        acc: dict[Option, Acceptance] = {"ngram": ngram, "model": model}
        inp = Inputs(DEMO_TARGET, DEMO_DRAFT.at(1), 0.02, acc, match, 12, 0, "model")
        return hand_over(replace(inp, draft_curve=DEMO_DRAFT))

    assert taken(seen(0.9), match=20) >= 8
    assert taken(seen(0.9), match=3) == 3  # all there is
    assert taken(seen(0.1), match=20) == 0
    assert taken(seen(0.9), match=0) == 0  # nothing found


def test_an_answers_first_token_is_looked_up_where_verifying_is_cheap_only() -> None:
    """A match that starts a chat's answer (bucket 1) is how an earlier answer went on after
    the same first word: a bet where verifying 2 tokens costs 1.5 plain steps, worth it where
    it costs about one."""
    for one, extra, drafts in ((10.0, 5.0, False), (1.2, 0.02, True)):
        ledger = Ledger(verify=curve(one, extra))
        inp = ledger.inputs("chat", has_model=False, match=5, max_k=8, match_len=1)
        assert inp.acceptance["ngram"].prior == MATCH_PRIORS[1]
        assert (choose(inp).option == "ngram") is drafts
    # Measured kept (for free on the steps that do not use it), it is drafted on a CPU too.
    ledger = Ledger(verify=curve(10.0, 5.0))
    ledger.by_task["chat"] = {"ngram@1": seen(0.95)}
    assert (
        choose(ledger.inputs("chat", has_model=False, match=5, max_k=8, match_len=1)).option
        == "ngram"
    )


def test_an_early_failure_narrows_the_answers_lookup_window_and_whole_drafts_widen_it() -> None:
    assert next_window(MAX_K, 31, 2) == MIN_REACH  # kept 2 of 31: REACH_GROWTH × 3, at least 8
    assert next_window(MAX_K, 31, 9) == 20  # kept 9: REACH_GROWTH × 10
    assert next_window(8, 8, 8) == 16 and next_window(48, 48, 48) == MAX_K  # kept whole
    assert next_window(MAX_K, 64, 40) == MAX_K  # failing late never widens past MAX_K


def test_the_window_caps_long_lookup_drafts_only_where_verifying_them_is_dear() -> None:
    # Acceptance learned on another answer says 64-token drafts pay; this answer's last one
    # failed at its 3rd token.
    cpu = replace(inputs(DEMO_TARGET, ngram=0.97), ngram_window=next_window(MAX_K, 31, 2))
    assert choose(replace(cpu, ngram_window=MAX_K)).k > 16
    assert choose(cpu).option == "ngram" and choose(cpu).k == MIN_REACH
    # On a flat curve a failed 64-token draft costs less than two plain steps: no cap.
    gpu = replace(cpu, verify=curve(2.1, 0.025))
    assert choose(gpu).k == choose(replace(gpu, ngram_window=MAX_K)).k > 32


# The demo pair on one H100 as homespec measured it in-process: a one-token decode replays a
# CUDA graph, anything longer does not (issue 8's GPU run).
H100 = CostCurve({1: 1.21, 2: 2.77, 4: 3.42, 8: 3.54, 16: 3.68, 32: 5.08})


def test_a_steps_own_work_is_priced_and_lookup_that_pays_on_decodes_alone_may_not() -> None:
    bare = inputs(H100, ngram=0.7)
    assert choose(bare).option == "ngram" and choose(bare).speedup > 1.05
    # Measured: a plain step 0.2 ms beyond its decode, a lookup step 1.5 ms beyond its verify
    priced = choose(replace(bare, overhead={"none": 0.2, "ngram": 1.5}))
    assert priced.option == "none" and "n-gram est 0.9" in priced.reason
    # Only plain's measured: a drafting step is priced as one (it does all a plain step does),
    # and the same overhead on both sides is a dearer plain step: drafting gains
    plain_only = replace(bare, overhead={"none": 0.2})
    assert step_ms(plain_only, "ngram") == step_ms(plain_only, "model") == 0.2
    assert choose(plain_only).speedup > choose(bare).speedup


def test_a_plain_choice_is_settled_only_while_nothing_came_close_and_no_new_match_came() -> None:
    far = choose(replace(inputs(H100, ngram=0.6), overhead={"none": 0.2, "ngram": 1.5}))
    assert far.option == "none" and 0 < far.rival < SETTLE_BELOW
    gpu = 0.2 / 1.21  # a plain step's own work over its decode, as on the H100
    assert stand_for(None, far, 0.3 / 20) == 0  # on a CPU asking costs nothing worth saving
    stood = replace(far, stands=stand_for(None, far, gpu))
    assert stood.stands == SETTLE_STEPS
    assert settled(stood, 1, "") and settled(stood, SETTLE_STEPS - 1, "")
    assert standing(stood, SETTLE_STEPS - 1) and not standing(stood, SETTLE_STEPS)
    assert not settled(stood, SETTLE_STEPS, "")  # asked again now and then
    assert not settled(stood, 1, "ngram@2")  # a match not priced at the asking is
    assert not settled(None, 0, "") and not standing(None, 0)  # an answer's first step asks
    assert not settled(far, 1, "")  # a choice given no stand never stands
    # Asked with a 2-token match that came well short of paying: another from the same table
    # waits (or none), a longer one (another table, likelier kept) or the prediction's does not.
    priced = replace(stood, lookup="ngram@2")
    assert settled(priced, 1, "ngram@2") and settled(priced, 2, "")
    assert not settled(priced, 1, "ngram@8") and not settled(priced, 1, "predicted@2")
    # Each asking that settles again stands twice as long, up to SETTLE_MAX
    stands = [stood.stands]
    while len(stands) < 6:
        stood = replace(far, stands=stand_for(stood, far, gpu))
        stands.append(stood.stands)
    assert stands[:3] == [SETTLE_STEPS, 2 * SETTLE_STEPS, 4 * SETTLE_STEPS]
    assert max(stands) == stands[-1] == SETTLE_MAX
    close = choose(inputs(H100, ngram=0.65))
    assert close.option == "none" and close.rival >= SETTLE_BELOW
    assert stand_for(stood, close, gpu) == 0  # something came close: asked every step
    drafting = choose(inputs(H100, ngram=0.8))
    assert drafting.option == "ngram" and stand_for(stood, drafting, gpu) == 0
    assert stand_for(drafting, far, gpu) == SETTLE_STEPS  # after drafting it starts over
