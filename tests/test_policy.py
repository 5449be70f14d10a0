from __future__ import annotations

import pytest

from homespec.engine.policy import decide
from homespec.engine.types import GenerationRequest
from homespec.errors import RequestError
from homespec.manifest import PairSpec, TaskPolicy

PAIR = PairSpec(
    target="t",
    draft="d",
    draft_tokens=6,
    spec_min_max_tokens=32,
    tasks={
        "creative": TaskPolicy(speculative=False),
        "code": TaskPolicy(draft_tokens=10),
        "edit": TaskPolicy(drafter="ngram"),
    },
)


def _decide(pair: PairSpec = PAIR, available: bool = True, **kw: object):  # type: ignore[no-untyped-def]
    req = GenerationRequest(prompt="x", **kw)  # type: ignore[arg-type]
    return decide("p", pair, req, draft_available=available, unavailable_reason="draft dropped")


def test_by_default_the_governor_drafts_capped_by_a_draft_tokens_set_anywhere() -> None:
    d = _decide(max_tokens=256)
    assert (d.mode, d.drafter, d.draft_tokens) == ("speculative", "auto", 6)
    assert "(governor, at most 6 tokens/step)" in d.reason
    unset = PairSpec(target="t", draft="d")  # draft_tokens not given: only the hard cap
    assert _decide(unset).draft_tokens == 64
    forced = _decide(PAIR.model_copy(update={"drafter": "hybrid"}))
    assert (forced.drafter, forced.draft_tokens) == ("hybrid", 6)
    assert "n-gram lookup, else draft model, 6 tokens/step" in forced.reason


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"speculative": False}, "request: speculation off"),
        ({"task": "creative"}, "task creative: speculation off"),
        ({"max_tokens": 8, "drafter": "hybrid"}, "max_tokens 8 < 32"),
        ({"temperature": 1.5}, "temperature 1.5 > 1"),
    ],
)
def test_each_plain_decision_says_why(kw: dict[str, object], reason: str) -> None:
    d = _decide(**kw)
    assert d.mode == "plain"
    assert d.drafter == "none"
    assert d.reason == reason


def test_by_default_a_short_answer_is_left_to_the_governor() -> None:
    """The governor prices the draft model's catch-up against the answer's room: on a GPU an
    8-token answer can pay for it; spec_min_max_tokens is a hard limit to set, off by default."""
    d = _decide(PairSpec(target="t", draft="d"), max_tokens=8)
    assert (d.mode, d.drafter, d.use_model) == ("speculative", "auto", True)
    assert "n-gram lookup only" not in d.reason
    forced = _decide(PairSpec(target="t", draft="d"), max_tokens=8, drafter="model")
    assert (forced.mode, forced.drafter) == ("speculative", "model")


def test_a_short_answer_limit_keeps_the_draft_model_out_but_may_look_up_n_grams() -> None:
    d = _decide(max_tokens=8)  # PAIR sets the limit: the governor, without the draft model
    assert (d.mode, d.drafter, d.use_model) == ("speculative", "auto", False)
    assert d.reason.endswith("; max_tokens 8 < 32: n-gram lookup only)")
    assert _decide(max_tokens=32).use_model  # at the limit the draft model is allowed again
    forced = _decide(max_tokens=8, drafter="model")
    assert (forced.mode, forced.reason) == ("plain", "max_tokens 8 < 32")
    # a draft already dropped is still said, not replaced by the short-answer note
    dropped = _decide(max_tokens=8, available=False)
    assert "draft dropped: n-gram lookup only" in dropped.reason and not dropped.use_model


def test_forcing_speculation_overrides_the_static_rules() -> None:
    d = _decide(speculative=True, max_tokens=4, task="creative")
    assert d.mode == "speculative"
    assert d.reason.startswith("request: speculation forced on")


def test_task_overrides_draft_length_and_drafter() -> None:
    assert _decide(task="code").draft_tokens == 10
    assert _decide(task="edit").drafter == "ngram"
    assert _decide(draft_tokens=3).draft_tokens == 3


def test_unavailable_draft_falls_back_to_ngram_or_plain_and_says_so() -> None:
    d = _decide(available=False)  # the governor: n-gram lookup needs no model
    assert (d.mode, d.drafter) == ("speculative", "auto")
    assert "draft dropped: n-gram lookup only" in d.reason
    d = _decide(available=False, drafter="hybrid")
    assert (d.mode, d.drafter) == ("speculative", "ngram")
    assert "draft dropped: n-gram lookup only" in d.reason
    d = _decide(available=False, drafter="model")
    assert (d.mode, d.reason) == ("plain", "draft dropped")


def test_ngram_pair_and_no_draft_pair() -> None:
    ngram = PAIR.model_copy(update={"draft": "ngram"})
    assert _decide(ngram).drafter == "auto"
    with pytest.raises(RequestError, match="has no draft model"):
        _decide(ngram, drafter="model")
    none = PAIR.model_copy(update={"draft": "none", "tasks": {}})
    assert _decide(none).reason == 'pair p: draft = "none"'


def test_a_target_that_cannot_roll_back_never_speculates() -> None:
    for kw in ({}, {"speculative": True}, {"drafter": "ngram"}):
        req = GenerationRequest(prompt="x", **kw)  # type: ignore[arg-type]
        d = decide("p", PAIR, req, draft_available=False, plain_only_reason="recurrent")
        assert (d.mode, d.reason) == ("plain", "recurrent")


def test_each_step_drafts_within_the_room_left_and_the_logits_one_decode_returns() -> None:
    from homespec.engine.policy import step_tokens
    from homespec.engine.types import Decision

    spec = Decision("speculative", "ngram", 6, "speculative")
    assert step_tokens(spec, room=100, max_outputs=65) == 6
    assert step_tokens(spec, room=2, max_outputs=65) == 2
    assert step_tokens(spec, room=100, max_outputs=4) == 3
    assert step_tokens(spec, room=-1, max_outputs=65) == 0
    assert step_tokens(Decision("plain", "none", 0, "off"), room=100, max_outputs=65) == 0
