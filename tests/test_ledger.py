"""The ledger's own bookkeeping (pure): what it keeps across restarts, how many tasks, and
where a new task's priors come from."""

from __future__ import annotations

import json

import pytest

from homespec.engine.governor import PRIOR
from homespec.engine.ledger import (
    AGREEMENT_MAX,
    AGREEMENT_MIN,
    HORIZON_UNKNOWN,
    MAX_TASKS,
    Ledger,
)

# --- what is kept across restarts -----------------------------------------------------------


def test_learned_acceptance_survives_a_round_trip_through_json() -> None:
    before = Ledger()
    for _ in range(30):
        before.acceptance("code", 20)["ngram"].record(8, 8)
        before.acceptance(None)["model"].record(4, 1)
    state = json.loads(json.dumps(before.acceptance_state()))
    after = Ledger()
    assert after.restore_acceptance(state) == 2
    for task, match in (("code", 20), (None, 0)):
        for option in ("ngram", "model"):
            a, b = before.acceptance(task, match)[option], after.acceptance(task, match)[option]
            assert a.tries == pytest.approx(b.tries) and a.kept == pytest.approx(b.kept)
            assert a.prior == b.prior


def test_a_damaged_or_foreign_state_is_never_trusted() -> None:
    good = Ledger()
    good.acceptance("code")["model"].record(4, 4)
    state = good.acceptance_state()
    assert Ledger().restore_acceptance({**state, "version": 99}) == 0
    assert Ledger().restore_acceptance(["not", "a", "state"]) == 0
    bad = {"version": state["version"], "tasks": {"code": {"model": {"tries": "x"}}}}
    assert Ledger().restore_acceptance(bad) == 0
    # kept above tried, negative counts, a prior above 1: clamped, not believed
    raw = state["tasks"]["code"]["model"]
    odd = {"tries": [1.0] * len(raw["tries"]), "kept": [5.0] * len(raw["kept"]), "prior": 7}
    ledger = Ledger()
    assert (
        ledger.restore_acceptance(
            {"version": state["version"], "tasks": {"code": {"model": odd, "ngram@999": odd}}}
        )
        == 1
    )
    acc = ledger.by_task["code"]["model"]
    assert acc.kept == acc.tries and acc.prior == 1.0 and set(ledger.by_task["code"]) == {"model"}
    # what this process already learned wins over the file
    live = Ledger()
    live.acceptance("code")["model"].record(4, 0)
    assert live.restore_acceptance(state) == 0


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
    # What the pair measured on its other tasks outweighs the scratch text's agreement.
    ledger = Ledger(agreement=0.3)
    for _ in range(200):
        ledger.acceptance("code")["model"].record(4, 4)
    assert ledger.acceptance("new")["model"].prior > 0.95


def test_a_task_never_seen_is_expected_to_run_at_most_half_the_room_left() -> None:
    ledger = Ledger()
    assert ledger.horizon("new", 4, room=500) == 2  # too early to tell: half of what ran
    assert ledger.horizon("new", 8, room=500) == HORIZON_UNKNOWN - 8
    assert ledger.horizon("new", 8, room=56) == 28  # max_tokens 64: half of the 56 left
    assert ledger.horizon("new", 40, room=16) == 16  # never past the room
    ledger.observe_answer("known", 200)
    assert ledger.horizon("known", 8, room=56) == 56  # a known task's length is measured


def test_a_tasks_draft_model_runs_are_measured_and_re_tested_when_unused() -> None:
    """observe_run: what a catch-up served, until the draft model next fell behind."""
    ledger = Ledger()
    ledger.observe_run("list", 40, cut=True)  # ended by the answer, nothing known before
    assert "list" not in ledger.runs
    for _ in range(6):
        ledger.observe_run("list", 8)  # n-gram steps kept interrupting it
    assert 8 <= ledger.runs["list"] < 12
    assert ledger.inputs("list", has_model=True, match=0, max_k=8).run == ledger.runs["list"]
    assert ledger.inputs("other", has_model=True, match=0, max_k=8).run == 0.0
    ledger.observe_run("list", 4, cut=True)  # an answer that ended sooner says nothing
    assert ledger.runs["list"] < 12
    # Answers in which it never caught up count as uninterrupted runs: the estimate grows
    # back, so the draft model is given a catch-up again after a few of them.
    for _ in range(4):
        ledger.observe_run("list", 256, cut=True)
    assert ledger.runs["list"] > 150


def test_a_catch_up_ends_the_draft_models_run_only_when_it_costs_more_than_a_draft_token() -> None:
    """Every step re-decodes 2 tokens (relag_ms); a catch-up on a few more costs little (an
    exploring n-gram step leaves the draft model 3 behind) and must not end its run."""
    ledger = Ledger()
    assert not ledger.ends_run(2)
    assert ledger.ends_run(3)  # the draft model's costs never measured: any catch-up counts
    ledger.observe_draft([(1, 11.2), (8, 44.4)])  # the demo draft on 2 cores
    assert not ledger.ends_run(3)  # 4.7 ms over a 2-token decode: less than one token (11.2)
    assert not ledger.ends_run(4)
    assert ledger.ends_run(5)  # 14 ms over
    assert ledger.ends_run(30)
