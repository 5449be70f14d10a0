"""The ledger's own bookkeeping (pure): what it keeps across restarts, how many tasks, and
where a new task's priors come from."""

from __future__ import annotations

import json

import pytest

from homespec.engine import learned
from homespec.engine.estimates import (
    MAX_K,
    MAX_TASKS,
    PRIOR,
    Acceptance,
    CostCurve,
    expected_by_length,
)
from homespec.engine.governor import STRETCH, choose
from homespec.engine.governor_types import Choice
from homespec.engine.ledger import (
    AGREEMENT_MAX,
    AGREEMENT_MIN,
    AGREEMENT_WEIGHT,
    HORIZON_UNKNOWN,
    Ledger,
)
from homespec.engine.lengths import MAX_TASKS as LENGTH_TASKS
from homespec.engine.lengths import SAMPLES, Answer, Lengths

from .governor_cases import curve, seen

# --- what is kept across restarts -----------------------------------------------------------


def test_learned_acceptance_survives_a_round_trip_through_json() -> None:
    before = Ledger()
    for _ in range(30):
        before.acceptance("code", 20)["ngram"].record(8, 8)
        before.acceptance(None)["model"].record(4, 1)
    state = json.loads(json.dumps(learned.state(before)))
    after = Ledger()
    assert learned.restore_state(after, state) == 2
    for task, match in (("code", 20), (None, 0)):
        for option in ("ngram", "model"):
            a, b = before.acceptance(task, match)[option], after.acceptance(task, match)[option]
            assert a.tries == pytest.approx(b.tries) and a.kept == pytest.approx(b.kept)
            assert a.prior == b.prior


def test_how_long_each_tasks_answers_run_survives_a_restart() -> None:
    before = Ledger()
    before.observe_answer("json", 181, room=200, cut=False)
    before.observe_answer(None, 12, room=64, cut=False)
    before.observe_answer(None, 64, room=64, cut=True)
    before.acceptance("json")["model"].record(4, 4)
    state = json.loads(json.dumps(learned.state(before)))
    after = Ledger()
    learned.restore_state(after, state)
    assert after.lengths.answers == before.lengths.answers
    assert after.lengths.answers[None] == [Answer(12, 64, False), Answer(64, 64, True)]
    # so a restarted pair expects the long task's next answer to run long from its start
    assert after.horizon("json", generated=8, room=400) == before.horizon("json", 8, 400) > 100
    # a file from before lengths were kept restores its acceptance and nothing else
    old = {k: v for k, v in state.items() if k != "lengths"}
    older = Ledger()
    assert learned.restore_state(older, old) == 1 and older.lengths.answers == {}
    # one from when a typical length was kept: that length, its room not known
    oldest = Ledger()
    assert learned.restore_state(oldest, {**old, "answers": {"json": 181.0}}) == 1
    assert oldest.lengths.answers == {"json": [Answer(181, 0, False)]}
    assert oldest.horizon("json", generated=8, room=400) == 181 - 8


def test_damaged_answer_lengths_are_skipped_and_this_processs_own_win() -> None:
    state = learned.state(Ledger())
    ledger = Ledger()
    ledger.observe_answer("kept", 40, room=64, cut=False)
    bad = {
        "kept": [[900, 1000, False]],
        "neg": [[-5, 10, False]],
        "nan": [[float("nan"), 10, False]],
        "big": [[1e12, 0, False]],
        "room": [[5, -1, False]],
        "text": [["7", 10, False]],
        "yes": [[True, 10, False]],
        "cut": [[5, 10, "no"]],
        "short": [[5, 10]],
        "row": [5, 10, False],
        "none": "7",
    }
    good = {"ok": [[77, 100, False], "junk", [20, 20, True]]}
    learned.restore_state(ledger, {**state, "lengths": {**bad, **good}, "answers": {"old": "x"}})
    assert ledger.lengths.answers == {
        "kept": [Answer(40, 64, False)],
        "ok": [Answer(77, 100, False), Answer(20, 20, True)],
    }
    learned.restore_state(ledger, {**state, "lengths": ["not", "a", "table"], "answers": 7})
    assert set(ledger.lengths.answers) == {"kept", "ok"}


def test_a_damaged_or_foreign_state_is_never_trusted() -> None:
    good = Ledger()
    good.acceptance("code")["model"].record(4, 4)
    state = learned.state(good)
    assert learned.restore_state(Ledger(), {**state, "version": 99}) == 0
    assert learned.restore_state(Ledger(), ["not", "a", "state"]) == 0
    bad = {"version": state["version"], "tasks": {"code": {"model": {"tries": "x"}}}}
    assert learned.restore_state(Ledger(), bad) == 0
    # kept above tried, negative counts, a prior above 1: clamped, not believed
    raw = state["tasks"]["code"]["model"]
    odd = {"tries": [1.0] * len(raw["tries"]), "kept": [5.0] * len(raw["kept"]), "prior": 7}
    ledger = Ledger()
    assert (
        learned.restore_state(
            ledger,
            {"version": state["version"], "tasks": {"code": {"model": odd, "ngram@999": odd}}},
        )
        == 1
    )
    acc = ledger.by_task["code"]["model"]
    assert acc.kept == acc.tries and acc.prior == 1.0 and set(ledger.by_task["code"]) == {"model"}
    # JSON's Infinity and NaN (json.loads reads both): not clamped into numbers, skipped
    for name, value in (("tries", float("inf")), ("kept", float("nan")), ("prior", float("nan"))):
        damaged = {**raw, name: value if name == "prior" else [value] * len(raw[name])}
        tables = {"version": state["version"], "tasks": {"code": {"model": damaged}}}
        assert learned.restore_state(Ledger(), json.loads(json.dumps(tables))) == 0, name
    # what this process already learned wins over the file
    live = Ledger()
    live.acceptance("code")["model"].record(4, 0)
    assert learned.restore_state(live, state) == 0


def test_the_task_table_is_bounded_and_forgets_the_least_recently_used() -> None:
    ledger = Ledger()
    for i in range(MAX_TASKS + 10):
        ledger.acceptance(f"t{i}")
        ledger.acceptance("kept")  # used all along
    assert len(ledger.by_task) == MAX_TASKS and "kept" in ledger.by_task
    assert "t0" not in ledger.by_task and f"t{MAX_TASKS + 9}" in ledger.by_task


# --- the draft model's prior ----------------------------------------------------------------


def test_a_draft_models_measured_agreement_is_its_prior_on_a_task_never_seen() -> None:
    """Calibration measures how often the draft predicts the target's next token; that is a
    new task's prior for the draft model, within bounds, until the pair measured real steps."""
    assert Ledger().acceptance("new")["model"].prior == PRIOR  # nothing measured
    assert Ledger(agreement=0.8).acceptance("new")["model"].prior == pytest.approx(0.8)
    assert Ledger(agreement=1.0).acceptance("new")["model"].prior == AGREEMENT_MAX
    assert Ledger(agreement=0.0).acceptance("new")["model"].prior == AGREEMENT_MIN
    # What the pair measured on its other tasks outweighs the scratch text's agreement...
    ledger = Ledger(agreement=0.3)
    for _ in range(200):
        ledger.acceptance("code")["model"].record(4, 4)
    assert ledger.acceptance("new")["model"].prior > 0.85


def test_a_measured_agreement_is_not_undone_by_one_rejected_draft() -> None:
    """...but it is 32 positions of evidence: one draft rejected at once (a near-tie on a
    greeting) leaves a new task's prior near it, where at PRIOR_WEIGHT it fell to 0.63 and
    the draft model was priced below plain everywhere. Steady failures still win."""
    ledger = Ledger(agreement=0.95)
    ledger.acceptance(None)["model"].record(3, 0)
    assert ledger.acceptance("new")["model"].prior > 0.85
    guessed = Ledger()  # nothing measured at load: the guess is a guess
    guessed.acceptance(None)["model"].record(3, 0)
    assert guessed.acceptance("new")["model"].prior < PRIOR
    for _ in range(100):
        ledger.acceptance("code")["model"].record(4, 0)
    assert ledger.acceptance("newer")["model"].prior < 0.3


def test_a_measured_agreement_weighs_as_much_in_the_table_where_the_draft_was_rejected() -> None:
    """The same 32 positions of evidence inside a table as in a new one's prior: the table
    that task-less requests share (a daemon's OpenAI clients) met the greeting's near-tie
    itself, and one rejection there priced the demo draft at 0.63 for every request after
    it. A table restored from disk before calibration measured the agreement weighs it too."""
    ledger = Ledger(agreement=0.95)
    shared = ledger.acceptance(None)["model"]
    shared.record(3, 0)
    assert shared.rate(0, shared.prior) > 0.85
    guessed = Ledger().acceptance(None)["model"]  # nothing measured at load: a guess
    guessed.record(3, 0)
    assert guessed.rate(0, guessed.prior) < 0.5
    for _ in range(30):
        shared.record(3, 0)
    assert shared.rate(0, shared.prior) < 0.5  # steady failures still win

    restarted = Ledger()
    learned.restore_state(restarted, learned.state(ledger))
    restarted.agreement = 0.95  # calibration runs after the restore
    assert restarted.acceptance(None)["model"].prior_weight == AGREEMENT_WEIGHT


def test_a_new_tasks_draft_model_positions_are_seeded_from_other_tasks_n_grams_are_not() -> None:
    """How far the draft model keeps agreeing is the pair's; how long an n-gram match stays
    right is the task's own. Seeds weigh SEED_WEIGHT observations and are not the task's
    tries (its trial still runs)."""

    def eight(acc: Acceptance) -> float:  # tokens a step drafting 8 commits, as best_k sees it
        return list(expected_by_length(acc, acc.prior, STRETCH))[7]

    ledger = Ledger(agreement=0.97)
    for _ in range(200):
        ledger.acceptance("email")["model"].record(8, 8)
        ledger.acceptance("list", 8)["ngram"].record(16, 16)
    model = ledger.acceptance("sql")["model"]
    assert model.tries == [0.0] * MAX_K
    assert sum(model.seed_tries[1:2]) == pytest.approx(4.0) and model.seed_tries[0] == 0.0
    assert eight(model) > 7.5  # of 9: not stretched down from position 1
    unseeded = Ledger(agreement=0.97).acceptance("sql")["model"]
    assert eight(unseeded) < 5.0
    ngram = ledger.acceptance("sql", 8)["ngram"]
    assert ngram.seed_tries == [0.0] * MAX_K


def test_a_task_never_seen_is_expected_to_run_at_most_half_the_room_left() -> None:
    ledger = Ledger()
    assert ledger.horizon("new", 4, room=500) == 2  # too early to tell: half of what ran
    assert ledger.horizon("new", 8, room=500) == HORIZON_UNKNOWN - 8
    assert ledger.horizon("new", 8, room=56) == 28  # max_tokens 64: half of the 56 left
    assert ledger.horizon("new", 40, room=16) == 16  # never past the room
    ledger.observe_answer("known", 200, room=200, cut=True)
    assert ledger.horizon("known", 8, room=56) == 56  # a known task's answers are measured


def test_a_task_never_seen_is_expected_to_run_as_the_pairs_other_tasks_answers_did() -> None:
    ledger = Ledger()
    for task, length in (("list", 150), ("email", 170), ("chat", 60)):
        ledger.observe_answer(task, length, room=508, cut=False)
    # asked with the same room, they ran 142, 162 and 52 tokens past the 8th
    assert ledger.horizon("sql", 8, room=500) == (142 + 162 + 52) // 3
    assert ledger.horizon("sql", 4, room=500) == 2  # nor before UNKNOWN_WAIT
    full = Ledger()  # a pair whose answers ran out of room
    full.observe_answer("table", 256, room=256, cut=True)
    assert full.horizon("table", 8, room=200) == 200
    assert full.horizon("sql", 8, room=200) == 100  # still no more than half the room


def test_a_dear_catch_up_waits_for_the_answer_to_run_a_few_tokens_whatever_the_task() -> None:
    """A task's typical length says little of the answer at hand where its answers differ (a
    daemon's task-less clients share one table): a 6-token answer after 256-token ones paid
    for catching the draft model up on its prompt and came at half plain's speed."""
    ledger = Ledger()
    ledger.observe_verify(1, 10.0)
    ledger.observe_draft([(1, 4.0), (2, 7.0), (64, 120.0)])  # 46 tokens: about 86 ms
    ledger.observe_answer("chat", 256, room=256, cut=True)
    assert ledger.horizon("chat", 1, room=255, lag=46) == 0  # over 2 plain steps: not yet
    assert ledger.horizon("chat", 8, room=248, lag=46) == 256 - 8
    assert ledger.horizon("chat", 1, room=255, lag=2) == 255  # its own lag: no catch-up
    assert ledger.horizon("chat", 1, room=255, lag=5) == 255  # about 13 ms: cheap enough
    gpu = Ledger()
    gpu.observe_verify(1, 2.1)
    gpu.observe_draft([(1, 1.1), (64, 2.6)])  # launch-bound: 46 tokens cost about one step
    gpu.observe_answer("chat", 256, room=256, cut=True)
    assert gpu.horizon("chat", 1, room=255, lag=46) == 255
    unmeasured = Ledger()  # no draft-model cost yet: half a target token each, as priced
    unmeasured.verify = curve(10.0, 3.0)  # 46 tokens: 145 ms, half of it for the draft
    unmeasured.observe_answer("chat", 256, room=256, cut=True)
    assert unmeasured.horizon("chat", 1, room=255, lag=46) == 0


def test_a_tasks_later_catch_ups_are_priced_per_token_the_draft_model_commits() -> None:
    """observe_upkeep: the catch-ups after the draft model's first drafting in an answer, in
    ms per answer token its steps committed, weighed by how much it drafted."""
    ledger = Ledger()
    ledger.observe_upkeep("list", 0.0, 0)  # it never drafted: nothing known
    assert "list" not in ledger.upkeep
    for _ in range(6):
        ledger.observe_upkeep("list", 30.0, 10)  # n-gram steps kept leaving it behind
    assert ledger.upkeep_ms("list") == pytest.approx(3.0)
    assert ledger.inputs("list", has_model=True, match=0, max_k=8).upkeep == pytest.approx(3.0)
    assert ledger.inputs("other", has_model=True, match=0, max_k=8).upkeep == 0.0
    # A long answer that needed no second catch-up weighs more than a short costly one.
    ledger.observe_upkeep("list", 0.0, 200)
    assert ledger.upkeep_ms("list") < 0.5
    # Answers in which it did not draft fade the estimate: the task re-tests it.
    ledger.observe_upkeep("email", 50.0, 10)
    for _ in range(4):
        ledger.observe_upkeep("email", 0.0, 0)
    assert ledger.upkeep_ms("email") < 0.5 * 5.0


def test_a_later_catch_up_costs_what_the_draft_curve_says_beyond_a_steps_own_re_decode() -> None:
    """Every draft-model step re-decodes 2 tokens (relag_ms, priced per step): only what a
    catch-up costs beyond that is upkeep."""
    ledger = Ledger()
    assert ledger.later_catch_up_ms(8) == 0.0  # never measured: nothing to price it by
    ledger.observe_draft([(1, 11.2), (8, 44.4)])  # the demo draft on 2 cores
    assert ledger.later_catch_up_ms(2) == 0.0
    assert ledger.later_catch_up_ms(3) == pytest.approx((44.4 - 11.2) / 7)  # one more token
    two = 11.2 + (44.4 - 11.2) / 7
    assert ledger.later_catch_up_ms(8) == pytest.approx(44.4 - two)
    assert ledger.later_catch_up_ms(30) > ledger.later_catch_up_ms(8)


def test_lookups_share_of_a_tasks_answers_is_a_moving_average() -> None:
    """observe_lookup_share: the answer tokens n-gram steps committed over all of them,
    long answers weighing more; per task, 0 unknown."""
    ledger = Ledger()
    assert ledger.lookup_share("rewrite") == 0.0
    ledger.observe_lookup_share("rewrite", 0, 0)  # an answer of one token: nothing to learn
    assert "rewrite" not in ledger.shares
    ledger.observe_lookup_share("rewrite", 120, 160)
    assert ledger.lookup_share("rewrite") == pytest.approx(0.75)
    ledger.observe_lookup_share("rewrite", 0, 20)  # a short answer lookup had no part in
    assert ledger.lookup_share("rewrite") == pytest.approx(84 / (112 + 6))
    inp = ledger.inputs("rewrite", has_model=True, match=0, max_k=8)
    assert inp.lookup_share == pytest.approx(ledger.lookup_share("rewrite"))
    assert ledger.inputs("other", has_model=True, match=0, max_k=8).lookup_share == 0.0


def test_lookups_share_of_what_is_left_weighs_the_answer_at_hand_as_it_runs() -> None:
    """lookup_share_now: the task's share weighs SHARE_PRIOR_TOKENS answer tokens against what
    lookup committed in this answer so far. A table that lookup's copies filled says less and
    less of an answer lookup has no part in; one it copies stays lookup's."""
    ledger = Ledger()
    ledger.observe_lookup_share(None, 120, 160)  # the shared table: 75% lookup's
    assert ledger.lookup_share_now(None, 0, 0) == pytest.approx(0.75)  # nothing seen yet
    prose = [ledger.lookup_share_now(None, 0, n) for n in (8, 32, 96)]
    assert prose == pytest.approx([0.75 * 32 / 40, 0.75 / 2, 0.75 / 4])
    assert ledger.lookup_share_now(None, 32, 32) == pytest.approx((0.75 * 32 + 32) / 64)
    inp = ledger.inputs(None, has_model=True, match=0, max_k=8, answer_lookup=(0, 32))
    assert inp.lookup_share == pytest.approx(0.375)
    assert ledger.lookup_share_now("new", 0, 40) == 0.0  # no table: nothing to weigh


def test_a_match_the_step_did_not_use_is_learned_from_the_tokens_it_committed() -> None:
    """Ledger.learn_unused_match: lookup's proposal is known before a step that did not use it;
    the tokens the step committed say how many of its drafts would have been kept, as far
    as they go (position i is known tried only where the first i - 1 agreed and an i-th
    token was committed). Match lengths 9-15 share a table (bucket 8)."""
    ledger = Ledger()
    acc = ledger.acceptance("rewrite", 9)["ngram"]
    ledger.learn_unused_match("rewrite", [5, 6, 7], [5], 9)  # a plain step: position 1 kept
    assert (acc.tries[:2], acc.kept[:2]) == ([1.0, 0.0], [1.0, 0.0])
    ledger.learn_unused_match("rewrite", [5, 6, 7, 8], [5, 6, 9, 1, 2], 12)  # 2 kept, then not
    assert [round(x, 2) for x in acc.tries[:4]] == [1.99, 1.0, 1.0, 0.0]
    assert [round(x, 2) for x in acc.kept[:4]] == [1.99, 1.0, 0.0, 0.0]
    before = acc.rate(0, acc.prior)
    ledger.learn_unused_match("rewrite", [4], [5, 6], 9)  # wrong at once
    assert acc.rate(0, acc.prior) < before
    ledger.learn_unused_match("rewrite", [], [5], 9)  # no match: nothing
    assert ledger.acceptance("rewrite", 2)["ngram"].tries[0] == 0.0  # other buckets untouched


def test_contested_matches_are_priced_and_learned_apart() -> None:
    """A match whose places went on in different ways (NgramDrafter.contested) is priced from
    a table of its own, with a lower prior: in one table, contested 2-token matches had drafted
    on what the others had earned. Each learns from its own steps, and both are kept across a
    restart."""
    ledger = Ledger()
    plain = ledger.acceptance("chat", 2)["ngram"]
    contested = ledger.acceptance("chat", 2, contested=True)["ngram"]
    assert contested is not plain and contested.prior < plain.prior
    ledger.learn_unused_match("chat", [5, 6], [9], 2, contested=True)
    assert (contested.tries[0], contested.kept[0], plain.tries[0]) == (1.0, 0.0, 0.0)
    ledger.learn_unused_match("chat", [5, 6], [5, 6, 7], 2)
    assert (plain.kept[:2], contested.tries[0]) == ([1.0, 1.0], 1.0)  # untouched
    at = ledger.inputs("chat", has_model=False, match=4, max_k=8, match_len=2, contested=True)
    assert at.acceptance["ngram"] is contested
    again = Ledger()
    assert learned.restore_state(again, json.loads(json.dumps(learned.state(ledger)))) == 1
    assert again.by_task["chat"]["contested@2"].tries == contested.tries


def test_a_draft_model_priced_out_in_a_busy_spell_is_priced_back_in_after_it() -> None:
    """The draft model's costs are measured only while it drafts, the target's at every step.
    Measured while a neighbour doubled every decode, the draft model stops paying and is no
    longer used; once the target's steps run at their quiet cost again, the draft model's
    cost is taken to have come back with them (Ledger.slowdown), and it is chosen again. As
    measured, it would have stayed priced out for the daemon's lifetime."""
    quiet = curve(20.0, 2.0)
    ledger = Ledger(verify=CostCurve(dict(quiet.points)), quiet=quiet)
    ledger.observe_draft([(1, 7.0), (2, 14.0), (8, 42.0)])  # at load: as quiet as the target
    for i in range(200):  # it drafts well on this task
        ledger.acceptance("code")["model"].record(6, 6 if i % 4 else 3)

    def choice() -> Choice:
        return choose(ledger.inputs("code", has_model=True, match=0, max_k=8, model_lag=1))

    assert choice().option == "model"
    for _ in range(40):  # the busy spell: every decode takes twice as long
        ledger.observe_verify(7, 2 * (quiet.at(7) or 0.0))
        ledger.observe_draft([(1, 14.0), (2, 28.0)])
    assert ledger.slowdown == pytest.approx(2.0, rel=0.01)
    assert choice().option == "none"  # priced out
    for _ in range(40):  # the neighbour has gone: plain steps at the quiet cost
        ledger.observe_verify(1, quiet.at(1) or 0.0)
    assert ledger.slowdown == pytest.approx(1.0, rel=0.01)
    assert ledger.inputs("code", has_model=True, match=0, max_k=8).draft_ms == pytest.approx(
        7.0, rel=0.02
    )
    back = choice()
    assert back.option == "model" and back.speedup > 1.3
    assert ledger.draft_ms == pytest.approx(14.0, rel=0.01)  # what was measured stays shown
    # Without a calibration to measure a slowdown against, costs are taken as measured.
    plain = Ledger(verify=CostCurve({1: 20.0}))
    plain.observe_draft([(1, 7.0)])
    plain.observe_verify(1, 60.0)
    assert plain.slowdown == 1.0 and plain.draft_curve() is plain.draft


def test_long_verifies_measured_in_a_busy_spell_are_priced_as_quiet_after_it() -> None:
    """One-token decodes are measured at every plain step, long verifies only while drafts
    run long: those measured beside a busy neighbour are scaled back with the machine's
    slowdown once it has gone, and a copy task drafts as long as before the spell."""
    quiet = curve(20.0, 2.0)
    ledger = Ledger(verify=CostCurve(dict(quiet.points)), quiet=quiet)
    ledger.by_task["copy"] = {"ngram@32": seen(0.97)}

    def choice() -> Choice:
        return choose(ledger.inputs("copy", has_model=False, match=64, max_k=64, match_len=40))

    before = choice()
    assert before.option == "ngram" and before.k > 16
    for _ in range(40):  # the busy spell: long verifies take twice as long
        for n in (9, 17, 33):
            ledger.observe_verify(n, 2 * (quiet.at(n) or 0.0))
    assert choice().k < before.k
    for _ in range(40):  # the neighbour has gone: plain steps at the quiet cost
        ledger.observe_verify(1, quiet.at(1) or 0.0)
    now = ledger.inputs("copy", has_model=False, match=64, max_k=64, match_len=40).verify
    assert now.at(33) == pytest.approx(quiet.at(33), rel=0.02)
    assert ledger.verify.at(33) == pytest.approx(2 * (quiet.at(33) or 0.0), rel=0.02)
    assert choice().k == before.k


def test_a_calibration_the_steps_outrun_was_taken_on_a_busy_machine() -> None:
    """Slower steps than the calibration's are a busy spell now (scaled, above); faster ones
    by DRIFT_BAND say the calibration itself ran busy, and only a new one mends it."""
    measured = curve(30.0, 12.0)  # taken while another engine started beside this one
    ledger = Ledger(verify=CostCurve(dict(measured.points)), quiet=measured)
    assert not ledger.calibrated_busy
    for _ in range(40):  # a neighbour now: twice the calibration's cost
        ledger.observe_verify(1, 60.0)
    assert not ledger.calibrated_busy
    for _ in range(3):  # a few quiet steps are not evidence enough
        ledger.observe_verify(1, 10.0)
    assert not ledger.calibrated_busy
    for _ in range(20):  # one token takes 10 ms that it priced at 30
        ledger.observe_verify(1, 10.0)
    assert ledger.calibrated_busy
    assert not Ledger().calibrated_busy  # nothing calibrated: nothing to say


def test_a_steps_overhead_is_what_it_took_beyond_the_decodes_observed_in_it() -> None:
    ledger = Ledger()
    ledger.observe_verify(1, 9.0)  # a decode of an earlier step: not this one's
    ledger.step_started()
    ledger.observe_draft([(1, 1.0), (1, 1.0)])
    ledger.observe_verify(3, 3.0)
    ledger.observe_step("model", 5.5)
    assert ledger.overhead == {"model": pytest.approx(0.5)}
    ledger.step_started()
    ledger.observe_verify(1, 1.0)
    ledger.observe_step("model", 2.5)  # a moving average: one slow step moves it a little
    assert 0.5 < ledger.overhead["model"] < 1.0
    ledger.step_started()
    ledger.observe_verify(1, 1.2)
    ledger.observe_step("none", 1.0)  # a clock that read short is no negative cost
    assert ledger.overhead["none"] == 0.0
    assert ledger.inputs(None, has_model=False, match=0, max_k=8).overhead == ledger.overhead


def test_answer_lengths_are_a_bounded_table_of_recent_answers() -> None:
    """Task names are the client's: at most MAX_TASKS tasks, the least recently answered
    going first, and SAMPLES answers each, the oldest going first."""
    lengths = Lengths()
    for n in range(1, SAMPLES + 3):
        lengths.observe("chat", n, room=100, cut=False)
    assert [a.tokens for a in lengths.answers["chat"]] == list(range(3, SAMPLES + 3))
    for i in range(LENGTH_TASKS + 1):
        lengths.observe(f"task {i}", 10, room=100, cut=False)
    lengths.observe("task 1", 10, room=100, cut=False)  # answered again: now the most recent
    assert len(lengths.answers) == LENGTH_TASKS
    assert "chat" not in lengths.answers and "task 0" not in lengths.answers
    assert list(lengths.answers)[-1] == "task 1"
    lengths.observe("none", 0, room=100, cut=False)  # no answer: nothing to learn
    assert "none" not in lengths.answers


def test_a_task_never_seen_reads_the_answers_of_the_tasks_used_last() -> None:
    """Not every task's: the governor reads them at every step it is asked."""
    lengths = Lengths()
    for i in range(LENGTH_TASKS):  # 64 tasks of 16 answers: the old ones short, the new long
        for _ in range(SAMPLES):
            lengths.observe(f"task {i}", 10 if i < LENGTH_TASKS - 4 else 100, room=200, cut=False)
    assert lengths.residual("new", 0, 200) == 100.0  # the last 4 tasks' 64 answers alone
    lengths.observe("task 0", 10, room=200, cut=False)  # used again: now among the last
    assert lengths.residual("new", 0, 200) == (10 * 16 + 100 * 48) / 64  # task 0 and the last 3
    assert lengths.residual("task 0", 0, 200) == 10.0  # a task's own answers, when it has them
