"""The speculative loop on the real demo pair (SmolLM2 F32 target + Q4_1 draft)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import pytest
from scipy.stats import chi2

from homespec.engine.drafters import NgramDrafter, Proposal
from homespec.engine.estimates import CostCurve
from homespec.engine.generate import generate
from homespec.engine.ledger import Ledger
from homespec.engine.loader import LoadedPair
from homespec.engine.runtime import PairRuntime
from homespec.engine.sampling import Draws, SamplingParams, distribution, log_weights
from homespec.engine.types import ChatFormat, Chunk, GenerationRequest, GenerationStats, Message
from homespec.errors import RequestError
from homespec.manifest import TaskPolicy

PROMPTS = [
    "Write a bash function that backs up a directory with tar and keeps the 7 newest archives.",
    "Write a Dockerfile for a small Python 3.11 Flask app with a non-root user.",
    "List the planets of the solar system in order, one per line.",
]
# Batched and one-token evaluation differ in the last bits on llama.cpp; where speculative and
# plain greedy outputs part, the plain path's top two logits there must be this close.
NEAR_TIE = 0.05


def run(rt: PairRuntime, **kw: object) -> tuple[str, GenerationStats, list[Chunk]]:
    chunks: list[Chunk] = []
    stats = None
    for out in generate(rt, GenerationRequest(**kw)):  # type: ignore[arg-type]
        if isinstance(out, GenerationStats):
            stats = out
        else:
            chunks.append(out)
    assert stats is not None
    return "".join(c.text for c in chunks), stats, chunks


def run_keeping_logits(
    rt: PairRuntime, monkeypatch: pytest.MonkeyPatch, **kw: object
) -> tuple[str, GenerationStats, list[Chunk], dict[int, np.ndarray]]:
    """`run`, keeping the target's logits for every position it predicted (the last row of
    each decode, by the history's length then)."""
    logits: dict[int, np.ndarray] = {}
    extend = rt.target.extend

    def recording_extend(
        history: list[int], n_logits: int = 1, while_waiting: Callable[[], None] | None = None
    ) -> np.ndarray:
        out = extend(history, n_logits, while_waiting)
        logits[len(history)] = out[-1].copy()
        return out

    with monkeypatch.context() as patched:
        patched.setattr(rt.target, "extend", recording_extend)
        text, stats, chunks = run(rt, **kw)
    return text, stats, chunks, logits


def chat(text: str) -> list[Message]:
    return [Message("user", text)]


class RecordingDrafter:
    """Wraps a drafter and keeps every proposal with the history length it was made at."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.kind = inner.kind  # type: ignore[attr-defined]
        self.calls: list[tuple[int, list[int]]] = []
        self.history: list[int] = []

    # What the loop reads from the pair's n-gram drafter, for a drafter standing in for it.
    NGRAM_DEFAULTS: ClassVar[dict[str, object]] = {
        "match_len": 0,
        "from_memory": False,
        "from_prediction": False,
        "contested": False,
    }

    def __getattr__(self, name: str) -> object:
        """The rest (an n-gram drafter's match_len, a draft model's ctx) is the wrapped
        drafter's."""
        if name in self.NGRAM_DEFAULTS and not hasattr(self.inner, name):
            return self.NGRAM_DEFAULTS[name]
        return getattr(self.inner, name)

    def reset(self) -> None:
        self.inner.reset()  # type: ignore[attr-defined]

    def remember(self, tokens: list[int]) -> None:
        """An n-gram drafter's memory of finished requests (others have none)."""
        if hasattr(self.inner, "remember"):
            self.inner.remember(tokens)

    def propose(
        self,
        history: list[int],
        k: int,
        params: SamplingParams,
        draws: Draws,
        **kw: Any,  # a draft model's `lag`
    ) -> Proposal:
        p: Proposal = self.inner.propose(history, k, params, draws, **kw)  # type: ignore[attr-defined]
        self.calls.append((len(history), list(p.tokens)))
        self.history = history  # the engine's live list: after the run it holds the whole answer
        return p


class RecordingRuntime(PairRuntime):
    """The real runtime, with every drafter it hands out wrapped in a RecordingDrafter. The
    governor ("auto") looks up n-grams every step, so its n-gram drafter records too."""

    recorder: RecordingDrafter | None = None

    def drafter(self, kind: str) -> RecordingDrafter:  # type: ignore[override]
        self.recorder = RecordingDrafter(super().drafter(kind))
        return self.recorder


def recording(rt: PairRuntime) -> RecordingRuntime:
    fields = {f.name: getattr(rt, f.name) for f in dataclasses.fields(rt) if f.init}
    rec = RecordingRuntime(**fields)
    rec.recorder = rec.ngram = RecordingDrafter(rt.ngram)  # type: ignore[assignment]
    return rec


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "sampled"])
@pytest.mark.parametrize("drafter", ["model", None], ids=["draft-model", "governor"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_speculative_equals_plain(
    demo_pair: LoadedPair,
    prompt: str,
    drafter: str | None,
    temperature: float,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The answer is plain decoding's own: greedy, and sampled with the same seed too (a
    draft is kept only where it is the token plain decoding picks there)."""
    rt = demo_pair.runtime
    # Keep the plain run's own logits for every position it predicted.
    kw = {"messages": chat(prompt), "max_tokens": 96, "temperature": temperature, "seed": 11}
    plain, pstats, _, plain_logits = run_keeping_logits(rt, monkeypatch, speculative=False, **kw)
    rec_rt = recording(rt)
    spec, sstats, _ = run(rec_rt, speculative=True, drafter=drafter, **kw)
    assert pstats.mode == "plain"
    assert pstats.seed == sstats.seed == (11 if temperature else None)
    if drafter is not None:  # the governor may find a step not worth drafting; a forced one drafts
        assert sstats.mode == "speculative"
        assert sstats.proposed_tokens > 0 and sstats.accepted_tokens > 0
    if spec == plain:
        return
    # They part somewhere. Batched and one-token evaluations (and different KV-cache layouts)
    # differ in the last bits on llama.cpp, so at the first differing token the plain run's
    # scores (logits; sampled: log-weights plus the position's noise) for its choice and for
    # the speculative choice must be a near-tie.
    assert rec_rt.recorder is not None
    spec_tokens = rec_rt.recorder.history
    params = SamplingParams(temperature=temperature)
    for pos in sorted(plain_logits):
        if pos >= len(spec_tokens):
            break
        scores = plain_logits[pos]
        if temperature:
            noise = Draws(11).gumbel(pos, scores.size)
            scores = log_weights(scores, params) + noise
        mine, theirs = int(np.argmax(scores)), spec_tokens[pos]
        if mine != theirs:
            gap = float(scores[mine] - scores[theirs])
            limit = NEAR_TIE / (temperature or 1.0)
            assert gap < limit, f"outputs part at token {pos} with a score gap of {gap:.4f}"
            return
    pytest.fail("texts differ but every plain token matches the speculative tokens")


@pytest.mark.parametrize("drafter", ["model", "ngram", "hybrid"])
def test_counters_match_an_independent_recount(demo_pair: LoadedPair, drafter: str) -> None:
    rt2 = recording(demo_pair.runtime)
    _, stats, chunks = run(
        rt2, messages=chat(PROMPTS[0]), max_tokens=80, speculative=True, drafter=drafter
    )
    rec = rt2.recorder
    assert rec is not None
    final = rec.history
    proposed = sum(len(d) for _, d in rec.calls)
    accepted = 0
    for start, drafts in rec.calls:
        for i, tok in enumerate(drafts):
            if start + i < len(final) and final[start + i] == tok:
                accepted += 1
            else:
                break
    assert stats.proposed_tokens == proposed > 0
    assert stats.accepted_tokens == accepted
    assert stats.accepted_tokens == sum(stats.accepted_per_position)
    assert stats.completion_tokens == len(final) - stats.prompt_tokens
    assert stats.draft_steps == sum(1 for _, d in rec.calls if d)
    # Every proposal was verified; a step with no room left for a draft verifies without one.
    assert stats.verify_steps >= len(rec.calls)
    # Chunks marked as drafted come only from accepted drafts.
    assert any(c.drafted for c in chunks) == (accepted > 0)


class FixedDrafter:
    """Always proposes one given token: a deterministic proposal, as n-gram drafting makes."""

    kind = "ngram"

    def __init__(self, token: int) -> None:
        self.token = token

    def reset(self) -> None:
        pass

    def propose(self, history: list[int], k: int, params: SamplingParams, draws: Draws) -> Proposal:
        return Proposal([self.token] * k)


def _first_two_tokens(
    rt: PairRuntime, prompt: str, drafter: object, n: int, *, governed: bool = False
) -> list[tuple[int, int]]:
    """(first, second) generated tokens over n seeds; the second comes from a verify step.
    `governed`: the governor chooses (the drafter is the draft model), not a forced drafter."""
    rec = RecordingDrafter(drafter)
    if governed:  # no n-gram memory: earlier seeds' answers would be matched, not drafted
        no_memory = NgramDrafter(n_min=rt.ngram.n_min, n_max=rt.ngram.n_max)
        rt2 = replace(rt, draft=rec, ngram=no_memory, ledger=_ledger_that_drafts(rt))  # type: ignore[arg-type]
    else:
        # an n-gram kind is the pair's n-gram drafter; the draft model's slot keeps the model
        draft = rt.draft if rec.kind == "ngram" else rec
        rt2 = replace(rt, draft=draft, ngram=rec)  # type: ignore[arg-type]
    pairs = []
    for seed in range(n):
        rec.calls.clear()
        if governed:  # the same measurements before every sample: each run starts alike
            rt2.ledger = _ledger_that_drafts(rt)
        # max_tokens 3: the first token comes from the prompt pass, the second from the first
        # verify step (one draft token, accepted or resampled).
        run(
            rt2,
            prompt=prompt,
            max_tokens=3,
            temperature=1.0,
            seed=seed,
            speculative=True,
            drafter=None if governed else rec.kind,
            draft_tokens=1,
        )
        start, drafts = rec.calls[0]
        assert len(drafts) == 1, "the drafter must propose at this point for the test to bite"
        pairs.append((rec.history[start - 1], rec.history[start]))
    return pairs


def _ledger_that_drafts(rt: PairRuntime) -> Ledger:
    """Measurements under which the governor picks the draft model: a flat verify curve, a
    cheap draft token, drafts nearly always kept. What it picks must not bend the output."""
    ledger = Ledger(verify=CostCurve({1: 10.0, 2: 10.5, 4: 11.0, 8: 12.0}))
    ledger.draft = CostCurve({1: 1.0, 8: 1.5})
    table = ledger.acceptance(None)
    for _ in range(50):
        table["model"].record(1, 1)
    return ledger


@pytest.mark.parametrize("drafter", ["model", "deterministic", "governor"])
def test_temperature_1_speculative_sampling_matches_target_distribution(
    demo_pair: LoadedPair, drafter: str
) -> None:
    """Chi-square of the second token against the target's own distribution given the first.

    Samples are grouped by their first token; each group with enough samples contributes its
    chi-square statistic, and the pooled statistic is tested with the pooled degrees of freedom.
    """
    rt = demo_pair.runtime
    prompt = "Roll a die. Result: "  # first token '1' about half the time, then a spread
    base = rt.target.model.tokenize(prompt, special=True)
    if drafter in ("model", "governor"):
        source: object = rt.draft
    else:  # propose the target's 3rd most likely second token: accepted now and then
        p = distribution(rt.target.extend(base, 1)[0], SamplingParams(temperature=1.0))
        p2 = rt.target.extend([*base, int(np.argmax(p))], 1)[0]
        source = FixedDrafter(int(np.argsort(-p2)[2]))
    pairs = _first_two_tokens(rt, prompt, source, 400, governed=drafter == "governor")
    total_stat, total_dof, used = 0.0, 0, 0
    for first, n in Counter(a for a, _ in pairs).items():
        if n < 40:
            continue
        counts = Counter(b for a, b in pairs if a == first)
        p = distribution(rt.target.extend([*base, first], 1)[0], SamplingParams(temperature=1.0))
        big = [int(t) for t in np.argsort(-p)[:50] if p[t] * n >= 5]
        if not big:
            continue
        observed = [counts.get(t, 0) for t in big] + [n - sum(counts.get(t, 0) for t in big)]
        expected = [p[t] * n for t in big] + [n * (1.0 - sum(p[t] for t in big))]
        if expected[-1] < 5:  # lump a thin tail into the last named bin
            tail_obs, tail_exp = observed.pop(), expected.pop()
            observed[-1] += tail_obs
            expected[-1] += tail_exp
        if len(observed) < 2:
            continue
        total_stat += sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
        total_dof += len(observed) - 1
        used += n
    assert used >= 200 and total_dof >= 2, f"too few samples to test ({used}, dof {total_dof})"
    assert chi2.sf(total_stat, total_dof) > 1e-3


def test_ngram_reaches_high_acceptance_when_the_answer_repeats_the_prompt(
    demo_pair: LoadedPair,
) -> None:
    # A 135M model copies a repeated pattern reliably (it does not reliably copy code it is
    # asked to repeat), so the answer here provably repeats the prompt.
    prompt = "alpha bravo charlie delta echo foxtrot golf hotel, " * 4
    text, stats, chunks = run(
        demo_pair.runtime, prompt=prompt, max_tokens=60, speculative=True, drafter="ngram"
    )
    assert "bravo charlie delta" in text
    assert stats.drafter == "ngram"
    assert stats.proposed_tokens >= 30
    assert stats.accept_rate is not None and stats.accept_rate >= 0.8
    assert stats.mean_accepted_length is not None and stats.mean_accepted_length >= 3
    assert sum(len(c.text) for c in chunks if c.drafted) > len(text) / 2


def test_stop_string_and_finish_reasons(demo_pair: LoadedPair) -> None:
    rt = demo_pair.runtime
    text, stats, _ = run(rt, messages=chat(PROMPTS[2]), max_tokens=64, stop=["Venus"])
    assert "Venus" not in text and stats.finish_reason == "stop"
    _, stats, _ = run(rt, messages=chat(PROMPTS[2]), max_tokens=5)
    assert stats.finish_reason == "length" and stats.completion_tokens == 5
    _, stats, _ = run(rt, messages=chat("Say OK."), max_tokens=200)
    assert stats.finish_reason == "stop" and stats.completion_tokens < 200


@pytest.mark.parametrize("speculative", [False, None])
def test_a_begun_answer_is_continued_the_way_the_target_would_have(
    demo_pair: LoadedPair, speculative: bool | None
) -> None:
    """A prefill (a chat whose last message is the assistant's): the model goes on from that
    text, so a plain answer cut after its first words and sent back as the begun answer is
    finished the same way, and only the rest is the response's."""
    rt = demo_pair.runtime
    q = chat(PROMPTS[1])
    full, plain, _ = run(rt, messages=q, max_tokens=48, speculative=False)
    begun = full[: full.index(" ", 25)]
    more = [*q, Message("assistant", begun)]
    rest, stats, _ = run(
        rt,
        messages=more,
        chat=ChatFormat(continue_last=True),
        max_tokens=24,
        speculative=speculative,
    )
    assert len(rest) > 40 and full.startswith(begun + rest)
    assert stats.prompt_format == "chat template; continuing the assistant's last message"
    assert stats.prompt_tokens == plain.prompt_tokens + len(
        rt.target.model.tokenize(begun, special=False, add_bos=False)
    )
    # not continued: the begun answer is a finished turn, and a new answer starts after it
    again, closed, _ = run(rt, messages=more, max_tokens=24, speculative=False)
    assert closed.prompt_format == "chat template" and not full.startswith(begun + again)


def test_lookup_agrees_no_further_back_than_a_chat_answers_start(demo_pair: LoadedPair) -> None:
    """In a chat, what precedes the answer is the template's role header, the same before
    every answer (NgramDrafter.reset); a raw prompt is continued, so its end counts."""
    rt = demo_pair.runtime
    _, stats, _ = run(rt, messages=chat("Say yes."), max_tokens=4)
    assert rt.ngram.answer_start == stats.prompt_tokens
    _, stats, _ = run(rt, prompt="one two three four one two three", max_tokens=4)
    assert rt.ngram.answer_start == 0


def test_plain_runs_always_say_why(demo_pair: LoadedPair) -> None:
    def why(stats: GenerationStats) -> str:
        """The decision's reason, without a note on threads (a busy machine adds one)."""
        return stats.reason.split("; threads ", 1)[0]

    # A pair that sets the short-answer limit (off by default)
    rt = replace(
        demo_pair.runtime,
        spec=demo_pair.runtime.spec.model_copy(update={"spec_min_max_tokens": 32}),
    )
    _, stats, _ = run(rt, messages=chat("hi"), max_tokens=8)
    assert "max_tokens 8 < 32: n-gram lookup only" in why(stats)
    assert stats.mode == ("speculative" if stats.draft_steps else "plain")
    _, stats, _ = run(rt, messages=chat("hi"), max_tokens=8, drafter="model")
    assert (stats.mode, why(stats)) == ("plain", "max_tokens 8 < 32")
    off = {"creative": TaskPolicy(speculative=False)}
    rt_off = replace(rt, spec=rt.spec.model_copy(update={"tasks": off}))
    _, stats, _ = run(rt_off, messages=chat("a poem"), max_tokens=40, task="creative")
    assert (stats.mode, why(stats)) == ("plain", "task creative: speculation off")


def test_prompt_longer_than_context_is_refused(demo_pair: LoadedPair) -> None:
    with pytest.raises(RequestError, match=r"the prompt is \d+ tokens .* 2048-token context"):
        run(demo_pair.runtime, prompt="word " * 3000, max_tokens=4)


def test_stats_keys(demo_pair: LoadedPair) -> None:
    _, stats, _ = run(demo_pair.runtime, messages=chat(PROMPTS[1]), max_tokens=40)
    d = stats.to_dict()
    for key in (
        "proposed_tokens",
        "accepted_tokens",
        "accept_rate",
        "verify_steps",
        "ttft_ms",
        "e2e_ms",
        "tokens_per_s",
        "prompt_tokens",
        "completion_tokens",
        "drafter",
        "mode",
        "reason",
    ):
        assert key in d
    assert 0 < d["ttft_ms"] <= d["e2e_ms"]
    assert d["prompt_format"] == "chat template"
    _, raw, _ = run(demo_pair.runtime, prompt="Hello", max_tokens=4)
    assert raw.prompt_format == "raw prompt"


def test_prompt_longer_than_one_batch_is_chunked(demo_pair: LoadedPair) -> None:
    """Prompts over n_batch (512) are decoded in chunks; the last chunk yields the logits."""
    rt = demo_pair.runtime
    prompt = "The quick brown fox jumps over the lazy dog. " * 70  # ~700 tokens
    text, stats, _ = run(rt, prompt=prompt, max_tokens=40, speculative=True, drafter="ngram")
    assert stats.prompt_tokens > rt.target.n_batch
    assert stats.completion_tokens == 40
    assert "lazy dog" in text  # the model continues the pattern it was shown in full


def test_a_conversation_put_aside_comes_back_with_the_same_answer(demo_pair: LoadedPair) -> None:
    """A long chat, then another user's greeting, then the chat's next turn: with the pair's
    prompt cache the turn reads only what is new (the chat was copied aside and back, on the
    target and the draft model), and answers token for token as it does with no cache, which
    re-reads the whole conversation. Forced draft model, so the draft's restored cache is what
    it drafts from."""
    rt = demo_pair.runtime
    doc = " ".join(f"Step {i}: check the {w} before the release." for i, w in enumerate(PROMPTS))
    first = chat("Summarise these release notes in two sentences.\n" + doc * 8)
    budget = rt.target_snapshots.budget
    answers = []
    try:
        for mb in (256, 0):
            rt.target_snapshots.budget = rt.draft_snapshots.budget = mb << 20
            rt.clear_caches()
            force = {"max_tokens": 40, "speculative": True, "drafter": "model"}
            text, s1, _ = run(rt, messages=first, **force)
            run(rt, messages=chat("Say hello."), max_tokens=8)
            turn = [*first, Message("assistant", text), Message("user", "Now in one word.")]
            again, s2, _ = run(rt, messages=turn, **force)
            answers.append((again, s2))
            if mb:
                assert s2.cached_tokens >= s1.prompt_tokens + s1.completion_tokens - 2
                assert s2.prompt_tokens - s2.cached_tokens < 20
                assert s2.accept_rate is not None and s2.accept_rate > 0.5  # the draft's too
            else:  # the template's opening (SmolLM2's default system prompt) and no more
                assert s2.cached_tokens < 40 < s2.prompt_tokens - 300
    finally:
        rt.target_snapshots.budget = rt.draft_snapshots.budget = budget
        rt.clear_caches()
    assert answers[0][0] == answers[1][0]
    assert answers[0][1].completion_tokens == answers[1][1].completion_tokens


def test_a_prediction_speeds_the_answer_it_predicts_and_changes_none(demo_pair: LoadedPair) -> None:
    """OpenAI's Predicted Outputs on the real pair: the answer to a question asked before is
    sent back as the prediction of the next answer (a client regenerating it): it is drafted
    from, far fewer target decodes make the same answer; a prediction with a line changed is
    found again after the change; a sampled answer with its seed is plain decoding's."""
    rt = demo_pair.runtime
    # A question no other test asks: the n-gram memory holds other tests' answers, and an
    # answer remembered from the same question agrees as far back as any prediction (so the
    # memory's place is taken, drafting the same tokens: none counted from the prediction).
    ask = chat("Write a bash function that prints the five largest files in a directory.")
    kw: dict[str, Any] = {"messages": ask, "max_tokens": 80, "remember": False}
    plain, p, _ = run(rt, speculative=False, **kw)
    text, s, _ = run(rt, prediction=plain, **kw)
    assert text == plain
    assert s.prediction_tokens >= 70 and s.accepted_prediction_tokens >= 0.7 * s.completion_tokens
    assert s.verify_steps <= p.verify_steps / 3, s.reason
    lines = plain.splitlines(keepends=True)
    changed = "".join([*lines[:2], "# a line the answer does not have\n", *lines[3:]])
    text, s, _ = run(rt, prediction=changed, speculative=True, drafter="ngram", **kw)
    assert text == plain and s.accepted_prediction_tokens >= 0.5 * s.completion_tokens
    hot = {**kw, "temperature": 0.8, "seed": 11}
    sampled, _, _ = run(rt, speculative=False, **hot)
    text, s, _ = run(rt, prediction=sampled, **hot)
    assert text == sampled and s.accepted_prediction_tokens > 0


def test_the_demo_draft_catches_up_by_copying_the_targets_cache_and_answers_stay_plains(
    demo_pair: LoadedPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo draft is the target's own model at 4 bits: its cache has the target's shape,
    and reading the target's keys and values it predicts the target's next token as often as
    reading its own (engine/cache_share.py). Calibrated, the pair catches the draft model up on
    each new prompt by a copy, not a decode of the prompt, and its answers are plain's."""
    from homespec.engine import cache_share
    from homespec.engine.calibration import calibrate

    session = demo_pair.runtime
    fields = {f.name: getattr(session, f.name) for f in dataclasses.fields(session) if f.init}
    rt = PairRuntime(**{**fields, "ledger": Ledger()})  # the session's costs stay unmeasured
    assert rt.draft is not None
    copies: list[float] = []
    timed_copy = cache_share.timed_copy

    def counted(target: Any, draft: Any) -> float | None:
        ms = timed_copy(target, draft)
        copies.append(-1.0 if ms is None else ms)
        return ms

    try:
        calibrate(rt)
        assert rt.sharing.on, rt.sharing.why
        assert rt.ledger.copy_per_token is not None and rt.draft.catch_up is not None
        monkeypatch.setattr(cache_share, "timed_copy", counted)
        for prompt in PROMPTS[:2]:
            kw: dict[str, Any] = {"messages": chat(prompt), "max_tokens": 64, "remember": False}
            plain, pstats, pchunks, plain_logits = run_keeping_logits(
                rt, monkeypatch, speculative=False, **kw
            )
            rt.clear_caches()  # nothing cached: the draft model is the whole prompt behind
            before = len(copies)
            text, stats, chunks = run(rt, speculative=True, drafter="model", **kw)
            assert len(copies) > before and min(copies) >= 0  # caught up by copy, every copy took
            assert stats.accept_rate is not None and stats.accept_rate > 0.8
            if text != plain:  # only where plain's own top two were a near-tie (see above)
                pairs = enumerate(zip(pchunks, chunks, strict=False))
                at = next((i for i, (a, b) in pairs if a.text != b.text), len(pchunks))
                top = np.sort(plain_logits[pstats.prompt_tokens + at])[-2:]
                assert top[1] - top[0] < NEAR_TIE, f"parts from plain at answer token {at}"
    finally:
        rt.draft.catch_up = None  # the session's pair decodes its catch-ups, as before
        rt.clear_caches()
