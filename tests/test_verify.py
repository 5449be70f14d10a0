"""The accept/reject rule (`verify`, pure) and the loop's counted stats, on synthetic logits and
the scripted fake target: no model files."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from scipy.stats import chisquare

from homespec.cli_common import stats_line
from homespec.engine import generate as loop
from homespec.engine.drafters import ModelDrafter, NgramDrafter, Proposal
from homespec.engine.estimates import CostCurve
from homespec.engine.generate import generate
from homespec.engine.governor import SETTLE_MAX, SETTLE_STEPS
from homespec.engine.governor_types import Inputs
from homespec.engine.runtime import PairRuntime
from homespec.engine.sampling import Draws, SamplingParams, pick, verify
from homespec.engine.types import Chunk, GenerationRequest, GenerationStats, Message
from homespec.manifest import PairSpec

from .fake_target import FakeTarget
from .fixed_costs import asking_costs, cheap_drafts, fixed_costs

GREEDY = SamplingParams()


def peaked(*tokens: int, vocab: int = 8) -> np.ndarray:
    rows = np.zeros((len(tokens), vocab), dtype=np.float32)
    for i, t in enumerate(tokens):
        rows[i, t] = 5.0
    return rows


def test_greedy_keeps_the_agreeing_prefix_and_emits_the_targets_token_at_the_first_miss() -> None:
    draws = Draws(0)
    assert verify([3, 4, 5], peaked(3, 4, 6, 7), GREEDY, draws, 10) == (2, 6)
    assert verify([1], peaked(2, 7), GREEDY, draws, 10) == (0, 2)


def test_greedy_all_kept_gives_the_following_token_free() -> None:
    draws = Draws(0)
    assert verify([3, 4], peaked(3, 4, 7), GREEDY, draws, 10) == (2, 7)
    assert verify([], peaked(6), GREEDY, draws, 10) == (0, 6)  # plain decoding: k = 0


SAMPLED = SamplingParams(temperature=1.0)


def test_sampling_a_draft_is_kept_exactly_when_it_is_plain_decodings_pick() -> None:
    """Whatever is drafted, the emitted tokens are the ones `pick` draws position by position
    with the same seed: a sampled answer does not depend on the drafter."""
    rng = np.random.default_rng(3)
    logits = np.log(rng.dirichlet(np.ones(6), size=4)).astype(np.float32)
    for seed in range(300):
        plain = [pick(logits[i], SAMPLED, Draws(seed), 20 + i) for i in range(4)]
        drafts = [int(x) for x in rng.integers(0, 6, size=3)]
        kept, token = verify(drafts, logits, SAMPLED, Draws(seed), 20)
        assert drafts[:kept] == plain[:kept] and token == plain[kept]
        assert kept == 3 or drafts[kept] != plain[kept]


def test_sampling_with_a_one_hot_draft_keeps_the_targets_distribution() -> None:
    """A looked-up draft is kept with the target's probability of it, and what is emitted,
    over seeds, is distributed as p."""
    p = np.array([0.5, 0.3, 0.2])
    logits = np.log(np.vstack([p, p])).astype(np.float32)
    n = 20_000
    counts, kept_n = np.zeros(3), 0
    for seed in range(n):
        kept, token = verify([0], logits, SAMPLED, Draws(seed), 5)
        counts[0 if kept else token] += 1
        kept_n += kept
    assert chisquare(counts, p * n).pvalue > 1e-3
    assert kept_n / n == pytest.approx(p[0], abs=0.015)


def test_a_proposal_mixing_sampled_and_looked_up_drafts_keeps_the_targets_distribution() -> None:
    """A draft model's token drawn from q with the position's noise, then one that lookup
    proposed (a hand-over): each emitted position is distributed as the target's, and the
    draft's token is kept about as often as the distributions overlap."""
    p1, p2 = np.array([0.5, 0.3, 0.2]), np.array([0.1, 0.6, 0.3])
    q1 = np.array([0.45, 0.25, 0.3])
    logits = np.log(np.vstack([p1, p2, p2])).astype(np.float32)
    draft_logits = np.log(q1).astype(np.float32)
    n = 30_000
    first, second, kept_first = np.zeros(3), np.zeros(3), 0
    for seed in range(n):
        draws = Draws(seed)
        drafted = pick(draft_logits, SAMPLED, draws, 7)
        kept, token = verify([drafted, 2], logits, SAMPLED, draws, 7)
        first[drafted if kept else token] += 1
        kept_first += kept > 0
        if kept:
            second[2 if kept == 2 else token] += 1
    assert chisquare(first, p1 * n).pvalue > 1e-3
    assert chisquare(second, p2 * second.sum()).pvalue > 1e-3
    # Gumbel coupling keeps at least (1 - tv) / (1 + tv) of them (tv: total variation).
    tv = 0.5 * np.abs(p1 - q1).sum()
    assert (1 - tv) / (1 + tv) - 0.01 < kept_first / n <= 1 - tv + 0.01


def runtime(**draft: int) -> PairRuntime:
    spec = PairSpec(target="t", draft="d", draft_tokens=6)
    drafter = ModelDrafter(FakeTarget(decode_s=0, **draft))
    return PairRuntime("p", spec, FakeTarget(decode_s=0), drafter, NgramDrafter())


def run(rt: PairRuntime, req: GenerationRequest) -> tuple[str, GenerationStats]:
    out = list(generate(rt, req))
    stats = out[-1]
    assert isinstance(stats, GenerationStats)
    return "".join(c.text for c in out[:-1] if isinstance(c, Chunk)), stats


ASK = [Message("user", "forever speculation is a bet on the draft. ")]


@pytest.mark.parametrize("drafter", ["model", "ngram", "hybrid"])
def test_speculative_output_is_plains_and_the_counts_add_up(drafter: str) -> None:
    rt = runtime(wrong_every=5)
    plain_text, plain = run(rt, GenerationRequest(messages=ASK, max_tokens=80, speculative=False))
    req = GenerationRequest(messages=ASK, max_tokens=80, speculative=True, drafter=drafter)  # type: ignore[arg-type]
    text, s = run(rt, req)
    assert text == plain_text and s.completion_tokens == plain.completion_tokens == 80
    assert 0 < s.accepted_tokens <= s.proposed_tokens
    assert sum(s.accepted_per_position) == s.accepted_tokens
    assert s.draft_steps <= s.verify_steps < plain.verify_steps
    # every step commits its kept drafts plus one token of the target's (the first is the prompt's)
    assert s.completion_tokens == 1 + s.verify_steps + s.accepted_tokens


@pytest.mark.parametrize("drafter", ["model", "ngram", "hybrid", None])
def test_a_seed_gives_plain_decodings_sampled_answer_on_every_drafter(
    monkeypatch: pytest.MonkeyPatch, drafter: str | None
) -> None:
    """At a temperature where the fake strays from its script, a seed still fixes the answer: the
    drafter (None: the governor) changes which tokens are checked, not which are kept. With
    no seed the answer reports the one it drew, and sending that back repeats the answer.
    Drafting is priced cheap (cheap_drafts): on the fake's free decodes measured costs are
    noise, and on a busy machine the governor drafted nothing (one run in twelve)."""
    hot_ok = PairSpec(target="t", draft="d", draft_tokens=6, spec_max_temperature=2.0)
    rt = dataclasses.replace(runtime(wrong_every=3), spec=hot_ok)
    cheap_drafts(monkeypatch, rt)
    greedy_text, greedy = run(rt, GenerationRequest(messages=ASK, max_tokens=60))
    assert greedy.seed is None
    hot = GenerationRequest(messages=ASK, max_tokens=60, temperature=1.6)
    plain_text, plain = run(rt, dataclasses.replace(hot, seed=5, speculative=False))
    assert plain.seed == 5 and plain_text != greedy_text
    text, s = run(rt, dataclasses.replace(hot, seed=5, speculative=True, drafter=drafter))  # type: ignore[arg-type]
    assert text == plain_text and s.seed == 5
    assert s.proposed_tokens > 0, s.reason
    other, drawn = run(rt, hot)
    assert drawn.seed is not None and other != plain_text
    again, _ = run(rt, dataclasses.replace(hot, seed=drawn.seed, speculative=False))
    assert again == other


def test_a_draft_that_is_wrong_every_fifth_token_is_accepted_about_four_times_in_five() -> None:
    req = GenerationRequest(messages=ASK, max_tokens=120, speculative=True, drafter="model")
    _, s = run(runtime(wrong_every=5), req)
    assert s.accept_rate is not None and 0.6 < s.accept_rate < 0.9


def test_a_stop_string_inside_a_multi_token_step_ends_the_answer_there() -> None:
    ask = [Message("user", "alpha beta STOP gamma delta")]
    req = GenerationRequest(
        messages=ask, max_tokens=60, stop=["STOP"], speculative=True, drafter="model"
    )
    text, s = run(runtime(), req)
    assert text == "alpha beta " and s.finish_reason == "stop"


def test_eos_inside_a_step_ends_the_answer_and_counts_only_what_was_committed() -> None:
    req = GenerationRequest(
        messages=[Message("user", "short")], max_tokens=60, speculative=True, drafter="model"
    )
    text, s = run(runtime(), req)
    assert text == "short" and s.finish_reason == "stop"
    assert s.completion_tokens == len("short") + 1  # the EOS is a committed token
    assert s.accepted_tokens <= s.completion_tokens - 1


def test_max_tokens_inside_a_step_is_exact() -> None:
    req = GenerationRequest(messages=ASK, max_tokens=13, speculative=True, drafter="ngram")
    text, s = run(runtime(), req)
    assert s.completion_tokens == 13 and len(text) == 13 and s.finish_reason == "length"


@pytest.mark.parametrize("speculative", [False, True])
def test_an_answer_cut_by_the_context_says_so(speculative: bool) -> None:
    """finish_reason "length" reads as max_tokens reached: an answer that ran out of context
    first says how far it got, so a client asking for 400 tokens knows why it got fewer."""
    rt = runtime()
    rt.target = FakeTarget(decode_s=0, n_ctx=64)
    req = GenerationRequest(messages=ASK, max_tokens=400, speculative=speculative)
    _, s = run(rt, req)
    assert s.finish_reason == "length" and s.completion_tokens == 64 - s.prompt_tokens
    assert s.context_full and "cut: the context is full" in stats_line(s.to_dict())
    assert f"cut at the end of the 64-token context, {s.completion_tokens} of the 400" in s.reason
    _, enough = run(rt, dataclasses.replace(req, max_tokens=5))
    assert enough.finish_reason == "length" and "cut at the end" not in enough.reason
    assert not enough.context_full


@pytest.mark.parametrize("remember", [True, False])
def test_a_repeated_request_drafts_from_the_memory_of_the_first(remember: bool) -> None:
    """The alphabet after "x" has no repeat within 26 tokens, so only the n-gram memory (the
    earlier request's answer) can draft it; `remember=False` leaves the memory untouched."""
    spec = PairSpec(target="t", draft="ngram", spec_min_max_tokens=0)
    memory = NgramDrafter(memory_tokens=spec.ngram_memory)
    rt = PairRuntime("p", spec, FakeTarget(decode_s=0), None, memory)
    req = GenerationRequest(prompt="x", max_tokens=26, speculative=True, drafter="ngram")
    first_text, first = run(rt, dataclasses.replace(req, remember=remember))
    assert first.accepted_tokens == 0 and first_text.startswith("yz abc")
    again_text, again = run(rt, req)
    assert again_text == first_text
    if remember:
        assert again.accepted_tokens >= 20 and again.verify_steps <= 6
    else:
        assert again.accepted_tokens == 0


def test_an_answer_cut_at_max_tokens_does_not_teach_the_governor_it_was_short() -> None:
    """The governor spreads a draft model's catch-up over the answer it expects; an answer cut
    at max_tokens (a bench's warm-up, a client's preview) only says the task runs at least that
    long, while one that ended by itself is what its task's answers run."""
    spec = PairSpec(target="t", draft="d", spec_min_max_tokens=0)
    rt = PairRuntime("p", spec, FakeTarget(decode_s=0), ModelDrafter(FakeTarget()), NgramDrafter())
    cut = GenerationRequest(messages=ASK, max_tokens=13, speculative=None, task="long")
    assert run(rt, cut)[1].finish_reason == "length"
    assert rt.ledger.horizon("long", generated=0, room=500) == 500  # it would have run on
    ended = GenerationRequest(
        messages=[Message("user", "short")], max_tokens=60, speculative=None, task="brief"
    )
    assert run(rt, ended)[1].finish_reason == "stop"
    assert rt.ledger.horizon("brief", generated=0, room=60) == len("short") + 1


def test_a_contested_match_is_learned_in_its_own_tables_and_the_answer_stays_plains(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fake echoes the prompt, in which "ab" went on five ways: at the answer's first "ab"
    lookup proposes the most recent way (5, where the answer goes on with 1), a contested
    match, and that is learned apart from the clean matches after it (each of "1 ab" and its
    like went on one way only, and the agreement grows as the answer copies), which are
    right. Costs are fixed (fixed_costs): measured on the fake's free decodes, noise chose the
    options, and a step that drafted past the first "ab" never looked up there (one CI run
    in many)."""
    rt = runtime(wrong_every=5)
    fixed_costs(monkeypatch, rt, 0.015)
    ask = [Message("user", "ab1 ab2 ab3 ab4 ab5 zz")]
    plain_text, _ = run(rt, GenerationRequest(messages=ask, max_tokens=40, speculative=False))
    text, _ = run(rt, GenerationRequest(messages=ask, max_tokens=40, task="echo"))
    assert text == plain_text == "ab1 ab2 ab3 ab4 ab5 zz"
    tables = rt.ledger.by_task["echo"]
    assert tables["contested@2"].tries[0] == 1.0 and tables["contested@2"].kept[0] == 0.0
    assert [key for key in tables if key.startswith("contested@")] == ["contested@2"]
    clean = [acc for key, acc in tables.items() if key.startswith("ngram@") and acc.tries[0]]
    # All right but, where it was looked up, the one after "zz": the prompt went on with its
    # newline, the answer ends
    assert clean and sum(acc.tries[0] - acc.kept[0] for acc in clean) <= 1.0


def test_a_draft_model_hands_a_copying_answer_over_to_lookup_and_the_output_stays_plains() -> None:
    """The answer copies the prompt. Its first step has no n-gram match (the answer's first
    token starts no earlier 2-gram), so the governor picks the draft model, measured right on
    the task; one drafted token later lookup finds the prompt's text, and the rest of the
    proposal is lookup's. Costs as the fakes sleep them: a target token 4.5 ms, a draft's 2."""
    spec = PairSpec(target="t", draft="d", spec_min_max_tokens=0)
    target = FakeTarget(decode_s=0.004, token_s=0.0005)
    rt = PairRuntime("p", spec, target, ModelDrafter(FakeTarget(decode_s=0.002)), NgramDrafter())
    rt.ledger.verify = CostCurve({n: 4.0 + 0.5 * n for n in (1, 2, 4, 8, 16, 32)})
    rt.ledger.draft = CostCurve({1: 2.0, 8: 2.0, 32: 2.0})
    rt.ledger.acceptance("copy")["model"].record(8, 8)
    rt.ledger.observe_answer("copy", 200, room=200, cut=True)
    ask = [Message("user", "Zebras quietly jump over seven lazy brown foxes at dawn.")]
    req = GenerationRequest(messages=ask, max_tokens=40, speculative=False)
    plain_text, _ = run(rt, req)
    text, s = run(rt, dataclasses.replace(req, speculative=None, task="copy"))
    assert text == plain_text
    assert "finished by n-gram lookup" in s.reason, s.reason
    assert s.completion_tokens == 1 + s.verify_steps + s.accepted_tokens
    model = rt.ledger.acceptance("copy")["model"]
    assert model.tries[0] > 1  # the draft model's own part was learned from


def test_a_governed_step_measures_its_own_work_beyond_its_decodes() -> None:
    spec = PairSpec(target="t", draft="ngram", spec_min_max_tokens=0)
    rt = PairRuntime("p", spec, FakeTarget(decode_s=0.004), None, NgramDrafter())
    req = GenerationRequest(prompt="x", max_tokens=26, speculative=False)
    plain_text, _ = run(rt, req)
    assert rt.ledger.overhead == {}  # plain decoding is not governed
    text, s = run(rt, dataclasses.replace(req, speculative=None))
    assert text == plain_text and s.draft_steps == 0
    assert set(rt.ledger.overhead) == {"none"}
    assert 0.0 < rt.ledger.overhead["none"] < 2.0  # the 4-ms decodes are not counted in it


def askings_of(monkeypatch: pytest.MonkeyPatch) -> list[Inputs]:
    """The Inputs of every asking of the governor from here on, as the loop asks it."""
    asked: list[Inputs] = []
    choose = loop.choose
    monkeypatch.setattr(loop, "choose", lambda inp: asked.append(inp) or choose(inp))
    return asked


def askings(steps: int) -> int:
    """How often a governed answer of `steps` plain steps asks the governor where asking is
    dear: once, then after SETTLE_STEPS steps stood, then after twice as many ... up to
    SETTLE_MAX."""
    asks, at, stand = 0, 0, 0
    while at < steps:
        asks += 1
        stand = min(2 * stand, SETTLE_MAX) if stand else SETTLE_STEPS
        at += stand + 1
    return asks


def test_askings_counts_each_stand_doubling() -> None:
    assert [askings(n) for n in (1, 5, 6, 14, 15, 31, 32, 48, 49)] == [1, 1, 2, 2, 3, 3, 4, 4, 5]


# 24 governed steps (the last has no room to draft): asked at the first, then the plain
# choice stands SETTLE_STEPS steps, then twice as many after each asking
@pytest.mark.parametrize(("own_share", "asks"), [(0.3, askings(24)), (0.01, 24)])
def test_a_settled_plain_choice_skips_the_governor_where_asking_is_dear(
    monkeypatch: pytest.MonkeyPatch, own_share: float, asks: int
) -> None:
    """The alphabet after "x" has no repeat within 26 tokens: lookup never matches and there
    is no draft model, so every step is plain. Where a step's own work is a good share of a
    decode (a GPU's), the plain choice stands SETTLE_STEPS steps after the first asking and
    longer after each that settles again; where it is not (a CPU's), every step asks."""
    spec = PairSpec(target="t", draft="ngram", spec_min_max_tokens=0)
    rt = PairRuntime("p", spec, FakeTarget(decode_s=0), None, NgramDrafter())
    asking_costs(monkeypatch, rt, own_share)
    asked = askings_of(monkeypatch)
    req = GenerationRequest(prompt="x", max_tokens=26, speculative=False)
    plain_text, _ = run(rt, req)
    assert not asked
    text, s = run(rt, dataclasses.replace(req, speculative=None))
    assert text == plain_text and s.draft_steps == 0 and s.verify_steps == 25
    assert len(asked) == asks and "governor: plain" in s.reason


@pytest.mark.parametrize(("own_share", "asks"), [(0.3, askings(24)), (0.01, 24)])
def test_a_settled_plain_choice_stands_through_matches_priced_from_the_same_table(
    monkeypatch: pytest.MonkeyPatch, own_share: float, asks: int
) -> None:
    """The prompt holds every pair of letters the answer will write, each followed by a digit:
    lookup matches at every step, two tokens long, and is always wrong. Priced from the one
    table of 2-token matches, learned well short of paying, the plain choice stands as it does
    with no match where asking is dear; every step asks where it is not."""
    spec = PairSpec(target="t", draft="ngram", spec_min_max_tokens=0)
    rt = PairRuntime("p", spec, FakeTarget(decode_s=0), None, NgramDrafter())
    fixed_costs(monkeypatch, rt, own_share)
    table = rt.ledger.acceptance("spell", 2)["ngram"]
    for _ in range(50):
        table.record(4, 0)
    asked = askings_of(monkeypatch)
    letters = "abcdefghijklmnopqrstuvwxyz"
    pairs = " ".join(f"{a}{b}{i % 10}" for i, (a, b) in enumerate(itertools.pairwise(letters)))
    req = GenerationRequest(prompt=pairs + " a", max_tokens=26, speculative=False, task="spell")
    plain_text, _ = run(rt, req)
    tried = table.tries[0]
    text, s = run(rt, dataclasses.replace(req, speculative=None))
    assert text == plain_text and s.draft_steps == 0
    assert all(inp.ngram_match > 0 for inp in asked)  # every asking priced a match
    assert table.tries[0] > tried  # and each step that looked learned what it would have kept
    assert len(asked) == asks


def spy_on_extend(
    extend: Callable[..., Any], waited: list[bool]
) -> Callable[[list[int], int, Callable[[], None] | None], Any]:
    """`extend`, noting at each decode whether something was asked to run while it decoded."""

    def spied(h: list[int], n: int = 1, w: Callable[[], None] | None = None) -> Any:
        waited.append(w is not None)
        return extend(h, n, w)

    return spied


def test_a_standing_plain_choice_learns_what_lookup_had_as_a_choice_asked_each_step_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The answer above, which meets a wrong 2-token match at every step: where asking is dear
    the plain choice stands and its steps only glance before deciding, but each looks up in
    full while the target decodes, so the 2-token table learns from every step as much as
    where every step asks (without that lookup it learned from the askings alone)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    pairs = " ".join(f"{a}{b}{i % 10}" for i, (a, b) in enumerate(itertools.pairwise(letters)))
    req = GenerationRequest(prompt=pairs + " a", max_tokens=26, task="spell")
    learned = {}
    for own_share in (0.01, 0.3):
        spec = PairSpec(target="t", draft="ngram", spec_min_max_tokens=0)
        target = FakeTarget(decode_s=0)
        rt = PairRuntime("p", spec, target, None, NgramDrafter())
        fixed_costs(monkeypatch, rt, own_share)
        table = rt.ledger.acceptance("spell", 2)["ngram"]
        for _ in range(50):
            table.record(4, 0)
        waited: list[bool] = []  # at each decode, whether something ran while it decoded
        monkeypatch.setattr(target, "extend", spy_on_extend(target.extend, waited))
        asked = askings_of(monkeypatch)
        _, s = run(rt, req)
        assert s.draft_steps == 0
        learned[own_share] = (table.tries[0], table.kept[0])
        if own_share == 0.3:
            assert len(asked) < s.verify_steps  # it stood
            # and each step that stood looked (the last one, with no room to draft, is plain)
            assert sum(waited) == s.verify_steps - 1 - len(asked)
        else:
            assert not any(waited)  # every step looked up before it asked
    assert learned[0.3] == learned[0.01]


def test_a_standing_plain_choice_looks_up_only_what_a_glance_finds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where asking is dear, a step while the plain choice stands only glances at lookup: the
    answer (the alphabet after "x": "yz abcdefghijklmnop...") meets "ab" and "bcd" of the
    prompt on steps that stand, and goes on without a look at them; it meets "klmn", a 4-gram
    the prompt has, and is looked up and asked about at once, whatever the stand had left.
    Short matches have failed before (their tables say so), so a plain choice stands."""
    spec = PairSpec(target="t", draft="ngram", spec_min_max_tokens=0)
    rt = PairRuntime("p", spec, FakeTarget(decode_s=0), None, NgramDrafter())
    fixed_costs(monkeypatch, rt, 0.3)
    for match_len in (2, 3):
        for _ in range(50):
            rt.ledger.acceptance(None, match_len)["ngram"].record(4, 0)
    asked = askings_of(monkeypatch)
    looked: list[int] = []  # the history's length at each full lookup before a decode
    shadowed: list[int] = []  # ... and at each while the target decodes (to learn from)
    decoding = [False]
    propose, extend = rt.ngram.propose, rt.target.extend

    def spy(h: list[int], *a: Any) -> Proposal:
        (shadowed if decoding[0] else looked).append(len(h))
        return propose(h, *a)

    def decode(h: list[int], n: int = 1, w: Callable[[], None] | None = None) -> Any:
        def meanwhile() -> None:
            assert w is not None
            decoding[0] = True
            w()
            decoding[0] = False

        return extend(h, n, meanwhile if w else None)

    monkeypatch.setattr(rt.ngram, "propose", spy)
    monkeypatch.setattr(rt.target, "extend", decode)
    prompt = "ab0bcd0klmnop0x"
    req = GenerationRequest(prompt=prompt, max_tokens=20, speculative=False)
    plain_text, _ = run(rt, req)
    assert plain_text.startswith("yz abcdefghijklmn")
    text, s = run(rt, dataclasses.replace(req, speculative=None))
    assert text == plain_text
    start = len(rt.target.model.tokenize(prompt, special=True))
    ends = [plain_text[: n - start] for n in looked]  # the answer so far, at each full lookup
    assert not any(e.endswith(("ab", "bcd")) for e in ends)  # stood past: not looked up
    learned = [plain_text[: n - start] for n in shadowed]  # ... but while the target decoded
    assert any(e.endswith("ab") for e in learned) and any(e.endswith("bcd") for e in learned)
    assert any(e.endswith("klmn") for e in ends)  # a long match: looked up
    assert any(inp.ngram_match > 0 for inp in asked)  # and asked about
    assert len(asked) < s.verify_steps  # the rest stood
