"""A draft model that reads the target's cache (engine/cache_share.py): the decision to, the
pricing of a catch-up by copy, and the loop's catch-ups through it, on the scripted fake (the
demo pair's own probe and answers: tests/test_engine.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from homespec.engine import cache_share
from homespec.engine.cache_share import SHARE_MARGIN, Sharing
from homespec.engine.calibration import probe_sharing, share_cache
from homespec.engine.catch_up import catch_up_cost, catch_up_ms, copy_pays
from homespec.engine.drafters import ModelDrafter, NgramDrafter
from homespec.engine.estimates import Acceptance, CostCurve
from homespec.engine.generate import complete
from homespec.engine.governor import choose
from homespec.engine.governor_types import Inputs
from homespec.engine.ledger import Ledger
from homespec.engine.runtime import PairRuntime
from homespec.engine.types import GenerationRequest, Message
from homespec.manifest import PairSpec

from .fake_target import FakeTarget
from .governor_cases import seen

# The demo pair on the 2-core CPU: the F32 target's decodes, the Q4_1 draft's (its batches
# dearer per token than the target's), and a copy of the target's cache at 0.02 ms a token
TARGET = CostCurve({1: 23.0, 8: 39.0, 32: 85.0, 64: 147.0})
DRAFT = CostCurve({1: 9.5, 8: 37.7, 32: 121.7, 256: 1000.0})
COPY_PER_TOKEN = 0.02


def test_a_draft_reads_the_targets_cache_only_where_it_is_shaped_alike_and_not_misled() -> None:
    assert cache_share.decide(False, False, 0.97, None) == (
        False,
        "decodes the history itself: its cache is not shaped like the target's",
    )
    assert "would not copy" in cache_share.decide(True, False, 0.97, None)[1]
    assert "could not be measured" in cache_share.decide(True, True, None, 0.9)[1]
    on, why = cache_share.decide(True, True, 0.97, 0.94)
    assert on and why == (
        "catches up by copying the target's cache (agrees on 94% of next tokens reading it, "
        "97% reading its own)"
    )
    assert cache_share.decide(True, True, 0.9, 0.99)[0]  # better weights' keys: better
    # A same-shaped model that is not the target's (another fine-tune of its base) reads keys
    # and values it was not trained on
    off, why = cache_share.decide(True, True, 0.97, 0.97 - SHARE_MARGIN - 0.01)
    assert not off and "misleads it" in why


def test_a_catch_up_costs_the_cheaper_of_a_decode_and_a_copy() -> None:
    decode = catch_up_cost(243, TARGET, 9.5, DRAFT)
    assert decode > 800  # the Q4_1 draft's 243-token batch: most of a second
    copy = COPY_PER_TOKEN * 300  # the target holds the prompt and the answer so far
    assert catch_up_cost(243, TARGET, 9.5, DRAFT, copy) == pytest.approx(copy + 9.5)
    assert catch_up_cost(2, TARGET, 9.5, DRAFT, 50.0) == catch_up_cost(2, TARGET, 9.5, DRAFT)
    assert catch_up_cost(0, TARGET, 9.5, DRAFT, copy) == 0.0
    assert copy_pays(243, TARGET, 9.5, DRAFT, copy)
    assert not copy_pays(243, TARGET, 9.5, DRAFT, None)  # the draft decodes: no copy to make
    assert not copy_pays(2, TARGET, 9.5, DRAFT, copy)  # every step's own re-decode
    # A GPU's draft decodes a long batch in a few ms; a copy through the host costs more
    gpu = CostCurve({1: 1.1, 8: 1.3, 32: 1.9, 256: 4.0})
    assert not copy_pays(243, curve_of(2.1), 1.1, gpu, 12.0)


def curve_of(one: float) -> CostCurve:
    return CostCurve({n: one * (1 + n / 64) for n in (1, 2, 4, 8, 16, 32, 64)})


def test_a_draft_model_priced_out_behind_a_long_prompt_is_chosen_where_a_copy_catches_it_up():
    """A new task's first step, 243 prompt tokens behind: decoding them costs the Q4_1 draft
    most of a second, more than its drafts could win back over one step, so plain decoding
    runs; a copy of the target's cache costs 6 ms, and the draft model drafts at once, the
    reason saying how it catches up."""
    acc = {"ngram": Acceptance(), "model": seen(0.97)}
    behind = Inputs(TARGET, 9.5, 0.01, acc, 0, 8, 1, "none", model_lag=243, draft_curve=DRAFT)
    assert choose(behind).option == "none"
    copied = replace(behind, copy_ms=COPY_PER_TOKEN * 300)
    assert catch_up_ms(copied) == pytest.approx(6.0 + 9.5)
    c = choose(copied)
    assert c.option == "model" and c.speedup > 1.2
    assert "catching up on 243 tokens first by copying the target's cache (6 ms)" in c.reason


def test_the_ledger_prices_copies_by_the_tokens_moved_and_keeps_that_current() -> None:
    ledger = Ledger()
    assert ledger.copy_ms(300) is None  # the draft decodes its catch-ups
    ledger.copy_per_token = 0.05  # the probe's copy: a short chat, its fixed costs in it
    assert ledger.copy_ms(300) == pytest.approx(15.0)
    for _ in range(20):
        ledger.observe_copy(1000, 20.0)
    assert ledger.copy_per_token == pytest.approx(0.02, rel=0.01)
    ledger.observe_copy(0, 5.0)  # an empty cache copied: nothing to learn per token
    assert ledger.copy_per_token == pytest.approx(0.02, rel=0.01)
    # A copy is the step's native work, as its decodes are, not homespec's own (observe_step)
    ledger.step_started()
    ledger.observe_copy(300, 6.0)
    ledger.observe_step("model", 40.0)
    assert ledger.overhead["model"] == pytest.approx(34.0)
    ledger.draft = CostCurve(dict(DRAFT.points))
    # A later catch-up beyond every step's own 2-token re-decode: by copy where cheaper
    assert ledger.later_catch_up_ms(200, cells=400) < 10.0 < ledger.later_catch_up_ms(200)
    copy = ledger.inputs(None, has_model=True, match=0, max_k=8, cells=400).copy_ms
    assert copy == pytest.approx(8.0, rel=0.01)
    assert ledger.inputs(None, has_model=False, match=0, max_k=8, cells=400).copy_ms is None


def shaped_pair(token_s: float) -> PairRuntime:
    """A fake pair whose draft's cache is the target's shape; the draft's decodes cost
    `token_s` a token, so a long catch-up is worth copying."""
    target, draft = FakeTarget(decode_s=0.0), FakeTarget(decode_s=0.0, token_s=token_s)
    target.model.shape = draft.model.shape = (30, 576, 9, 3)
    spec = PairSpec(target="t", draft="d")
    rt = PairRuntime("p", spec, target, ModelDrafter(draft), NgramDrafter())
    ms = token_s * 1000
    rt.ledger.draft = CostCurve({1: ms, 8: 8 * ms, 64: 64 * ms})  # as calibration measures
    return rt


LONG = "Here is a long request, long enough that decoding it costs the draft model: " * 4


def test_the_probe_lets_a_same_shaped_draft_read_the_targets_cache() -> None:
    rt = shaped_pair(0.0)
    sharing = probe_sharing(rt, own=1.0)
    assert sharing.on and sharing.copy_ms_per_token is not None
    assert rt.draft is not None and rt.draft.ctx.tokens == [] == rt.target.tokens
    other = shaped_pair(0.0)
    assert other.draft is not None
    other.draft.ctx.model.shape = (24, 2048, 32, 8)
    assert probe_sharing(other, own=1.0) == Sharing(
        False, "decodes the history itself: its cache is not shaped like the target's"
    )


def test_the_draft_model_catches_up_on_a_prompt_by_copy_and_the_answer_is_the_same() -> None:
    def answer(rt: PairRuntime) -> tuple[str, int]:
        assert rt.draft is not None
        draft = rt.draft.ctx
        assert isinstance(draft, FakeTarget)
        req = GenerationRequest([Message("user", LONG)], max_tokens=40, drafter="model")
        text, _ = complete(rt, req)
        return text, draft.restores

    decoding = shaped_pair(0.0005)
    copying = shaped_pair(0.0005)
    share_cache(copying, Sharing(True, "catches up by copying the target's cache", 0.001))
    assert copying.draft is not None and copying.draft.catch_up is not None
    plain_text, no_copies = answer(decoding)
    text, copies = answer(copying)
    assert text == plain_text == LONG[:40]
    assert no_copies == 0 and copies >= 1
    assert copying.ledger.copy_per_token is not None  # observed, the probe's prior moved
    # Where copying is off again, the hook is gone and the draft decodes
    share_cache(copying, Sharing(False, "decodes the history itself"))
    assert copying.draft.catch_up is None and copying.ledger.copy_per_token is None


def test_a_copy_that_fails_turns_copying_off_for_the_pair_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rt = shaped_pair(0.0005)
    share_cache(rt, Sharing(True, "catches up by copying the target's cache", 0.001))
    assert rt.draft is not None
    draft = rt.draft.ctx
    assert isinstance(draft, FakeTarget)
    draft.restore = lambda tokens, data: False  # type: ignore[method-assign]
    req = GenerationRequest([Message("user", LONG)], max_tokens=20, drafter="model")
    text, stats = complete(rt, req)
    assert text == LONG[:20]
    assert stats.reason.endswith("; the draft model " + rt.sharing.why)
    from homespec.engine.engine_info import costs_now  # what the daemon's status shows after it

    costs = costs_now(rt)
    assert costs.catch_up == rt.sharing.why and costs.copy_per_token is None
    assert not rt.sharing.on and "a copy of the target's cache failed" in rt.sharing.why
    assert rt.ledger.copy_per_token is None and rt.draft.catch_up is None
    assert any("copy of the target's cache failed" in r.getMessage() for r in caplog.records)


def test_a_target_cache_longer_than_the_drafts_context_is_not_copied() -> None:
    """The target holds its rejected drafts past the history until its next decode; where
    that is more than the draft's context holds, llama.cpp would refuse the copy (and a failed
    copy turns copying off): the draft decodes its catch-up this once instead."""
    rt = shaped_pair(0.0005)
    share_cache(rt, Sharing(True, "catches up by copying the target's cache", 0.001))
    assert rt.draft is not None
    draft = rt.draft.ctx
    assert isinstance(draft, FakeTarget)
    draft.n_ctx = 100
    history = list(range(60))
    rt.target.extend([*history, *range(60, 110)], 1)  # 50 drafts past the history
    assert not rt.catch_up_by_copy(history, 60)
    assert draft.restores == 0 and rt.sharing.on
    rt.target.extend(history, 1)
    assert rt.catch_up_by_copy(history, 60) and draft.tokens == history
