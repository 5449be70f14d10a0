from __future__ import annotations

import random

from homespec.engine.drafters import NgramDrafter
from homespec.engine.ngram_memory import NgramMemory, since_boundary
from homespec.engine.sampling import Draws, SamplingParams

GREEDY = SamplingParams()
RNG = Draws(0)


def test_proposes_what_followed_the_most_recent_match() -> None:
    d = NgramDrafter(n_min=2, n_max=3)
    history = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    # [1, 2, 3] occurred twice before; the most recent was followed by 7, 8, 5.
    assert d.propose(history, 3, GREEDY, RNG).tokens == [7, 8, 5]


def test_falls_back_to_shorter_ngrams_and_respects_k() -> None:
    d = NgramDrafter(n_min=2, n_max=4)
    history = [5, 6, 40, 41, 42, 43, 0, 6, 40]  # only the 2-gram [6, 40] matched before
    assert d.propose(history, 2, GREEDY, RNG).tokens == [41, 42]


def test_no_match_proposes_nothing() -> None:
    d = NgramDrafter()
    assert d.propose([1, 2, 3, 4, 5], 4, GREEDY, RNG).tokens == []


def test_index_grows_incrementally_and_reset_forgets() -> None:
    d = NgramDrafter(n_min=2, n_max=2)
    history = [1, 2, 3]
    assert d.propose(history, 2, GREEDY, RNG).tokens == []
    history += [4, 1, 2]  # the engine appends to the same list as tokens are committed
    assert d.propose(history, 2, GREEDY, RNG).tokens == [3, 4]
    d.reset()
    assert d.propose([9, 9, 1, 2], 2, GREEDY, RNG).tokens == []


def test_the_longest_agreement_wins_over_the_most_recent_place() -> None:
    d = NgramDrafter(n_min=2, n_max=2)
    # [3, 4] occurs twice: after [1, 2] (followed by 50) and after [8, 9] (followed by 60).
    history = [1, 2, 3, 4, 50, 51, 8, 9, 3, 4, 60, 61, 0, 1, 2, 3, 4]
    assert d.propose(history, 2, GREEDY, RNG).tokens == [50, 51]
    assert d.match_len == 4  # 1, 2, 3, 4 agree; before them, the history starts


def test_a_match_whose_places_went_on_differently_is_contested() -> None:
    """Where at most half of the places the last n-gram was seen at went on as the proposal
    does, the proposal is the next token far less often (prose's "of the"): the drafter says
    so, and proposes as it would have (the governor prices it from tables of its own)."""
    d = NgramDrafter(n_min=2, n_max=2)
    split = [1, 2, 3, 4, 50, 51, 8, 9, 3, 4, 60, 61, 0, 1, 2, 3, 4]  # [3, 4]: 50 once, 60 once
    assert d.propose(split, 2, GREEDY, RNG).tokens == [50, 51] and d.contested
    d.reset()
    agreed = [3, 4, 50, 7, 3, 4, 50, 8, 3, 4, 60, 9, 3, 4, 50, 6, 3, 4]  # 3 of 4 say 50
    assert d.propose(agreed, 1, GREEDY, RNG).tokens == [50] and not d.contested
    d.reset()
    assert d.propose([3, 4, 50, 3, 4], 1, GREEDY, RNG).tokens == [50] and not d.contested
    d.reset()  # the minority's place agrees longest: proposed, and contested
    minority = [7, 3, 4, 60, 1, 3, 4, 50, 2, 3, 4, 50, 7, 3, 4]
    assert d.propose(minority, 1, GREEDY, RNG).tokens == [60] and d.contested
    assert d.lookahead(minority[:-1], [4], 1) == ([60], 3, True)


def test_a_contested_match_in_the_memory_says_so() -> None:
    d = NgramDrafter(n_min=2, n_max=2, memory_tokens=1000)
    d.remember([5, 1, 2, 30, 6])
    d.remember([7, 1, 2, 40, 8])
    d.reset()
    assert d.propose([9, 1, 2], 1, GREEDY, RNG).tokens == [40]
    assert d.from_memory and d.contested
    d.remember([7, 1, 2, 40, 8])
    d.reset()  # 40 has two places of three behind it now
    assert d.propose([9, 1, 2], 1, GREEDY, RNG).tokens == [40]
    assert d.from_memory and not d.contested


def test_a_repeating_answer_is_proposed_past_the_present() -> None:
    d = NgramDrafter(n_min=2, n_max=3)
    loop = [7, 8, 9, 10]
    history = [1, 2, *loop, *loop, *loop]
    # The last period's continuation ends at the present; the lookup goes on around the loop.
    assert d.propose(history, 10, GREEDY, RNG).tokens == [*loop, *loop, 7, 8]
    assert d.match_len >= 8


def test_lookahead_matches_after_unverified_drafts_and_never_indexes_them() -> None:
    """A draft model's tokens not verified yet are looked up after (to hand its proposal over
    to lookup) but never indexed: the target may reject them, and the history goes on without
    them."""
    d = NgramDrafter(n_min=2, n_max=3)
    history = [1, 2, 3, 7, 8, 5, 0]
    assert d.propose(history, 3, GREEDY, RNG).tokens == []
    assert d.lookahead(history, [1, 2], 3) == ([3, 7, 8], 2, False)
    assert d.match_len == 0  # the step's own lookup is what it was
    # Rejected: the history went on with 5, 0, 5 instead. The index holds only what was.
    history += [5, 0, 5]
    assert d.propose(history, 2, GREEDY, RNG).tokens == [0, 5]
    assert NgramDrafter(n_min=2, n_max=3).propose(history, 2, GREEDY, RNG).tokens == [0, 5]


# --- memory: earlier requests ---------------------------------------------------------------


def test_an_earlier_requests_continuation_is_proposed() -> None:
    d = NgramDrafter(n_min=2, n_max=3, memory_tokens=1000)
    d.remember([1, 2, 3, 4, 5, 6, 7, 8])
    d.reset()  # a new request: its own history knows nothing of the earlier one
    assert d.propose([40, 3, 4, 5], 3, GREEDY, RNG).tokens == [6, 7, 8]
    assert d.from_memory and d.match_len == 3
    # the continuation ends where the earlier request ended, not in the next one
    d.remember([90, 91, 92, 93])
    assert d.propose([40, 5, 6, 7], 5, GREEDY, RNG).tokens == [8]


def test_without_memory_nothing_is_kept_across_requests() -> None:
    d = NgramDrafter(n_min=2, n_max=3)
    d.remember([1, 2, 3, 4, 5, 6, 7, 8])
    d.reset()
    assert d.propose([40, 3, 4, 5], 3, GREEDY, RNG).tokens == []


def test_the_longer_agreement_wins_between_the_request_and_the_memory() -> None:
    d = NgramDrafter(n_min=2, n_max=3, memory_tokens=1000)
    d.remember([10, 11, 12, 13, 14, 70, 71])  # 11..14 agree: 4 tokens, then 70
    history = [12, 13, 14, 60, 61, 0, 11, 12, 13, 14]  # in this request: 3 agree, then 60
    assert d.propose(history, 2, GREEDY, RNG).tokens == [70, 71]
    assert d.from_memory and d.match_len == 4
    longer = [11, 12, 13, 14, 60, 61, 0, 11, 12, 13, 14]  # as long: the request wins a tie
    d.reset()
    assert d.propose(longer, 2, GREEDY, RNG).tokens == [60, 61]
    assert not d.from_memory


def test_memory_forgets_the_oldest_requests_and_stays_within_capacity() -> None:
    memory = NgramMemory(40, n=2)
    for r in range(20):  # 20 requests of 10 tokens: each its own n-grams
        memory.add([1000 * r + i for i in range(10)])
        assert len(memory) <= 40
    assert memory.lookup([0, 1]) is None  # the first request is forgotten
    found = memory.lookup([19_003, 19_004])  # the last is still there, at the right place
    assert found is not None and memory.continuation(found[1], 3) == [19_005, 19_006, 19_007]
    memory.clear()
    assert len(memory) == 0 and memory.lookup([19_003, 19_004]) is None


def test_a_request_longer_than_the_memory_keeps_its_end() -> None:
    memory = NgramMemory(10, n=2)
    memory.add(list(range(100)))
    assert len(memory) == 10
    assert memory.lookup([10, 11]) is None
    found = memory.lookup([95, 96])
    assert found is not None and memory.continuation(found[1], 5) == [97, 98, 99]


def test_agreement_is_measured_back_to_the_last_control_token_only() -> None:
    """A chat template's turn markers are in every conversation: agreeing on them is no
    evidence that what follows will agree."""
    start, end = 900, 901  # control tokens, like <|im_start|> and <|im_end|>
    earlier = [5, 6, 7, end, start, 30, 31, 40, 41, 42, 43]  # an earlier turn: "30 31" opened it
    now = [8, 9, 7, end, start, 30, 31]  # this turn's opening so far
    plain = NgramDrafter(n_min=2, n_max=4)
    assert plain.propose(earlier + now, 3, GREEDY, RNG).tokens == [40, 41, 42]
    assert plain.match_len == 5  # 7, end, start, 30, 31
    marked = NgramDrafter(n_min=2, n_max=4, boundaries=frozenset({start, end}))
    assert marked.propose(earlier + now, 3, GREEDY, RNG).tokens == [40, 41, 42]
    assert marked.match_len == 2  # 30, 31: the markers and what precedes them do not count


def test_the_memory_measures_agreement_back_to_the_last_control_token_only() -> None:
    start, end = 900, 901
    d = NgramDrafter(n_min=2, n_max=4, memory_tokens=100, boundaries=frozenset({start, end}))
    d.remember([1, 2, end, start, 30, 31, 40, 41, 42, 43])
    d.reset()
    assert d.propose([3, 2, end, start, 30, 31], 3, GREEDY, RNG).tokens == [40, 41, 42]
    assert d.from_memory and d.match_len == 2
    d.reset()
    # The 4-gram key itself holds the marker: one token after it agrees.
    assert d.propose([3, 2, end, start, 30], 2, GREEDY, RNG).tokens == [31, 40]
    assert d.match_len == 1


def test_a_chat_answers_first_token_agrees_only_as_far_as_the_answer() -> None:
    """What precedes an answer is the template's role header ("assistant", a newline), the
    same before every answer: agreeing on it says nothing about how this answer goes on."""
    start, end = 900, 901
    header = [start, 70, 71]  # <|im_start|> assistant \n
    earlier = [5, end, *header, 30, 40, 41, 42, end]  # an earlier answer that began with 30
    prompt = [6, end, *header]
    d = NgramDrafter(n_min=2, n_max=4, memory_tokens=100, boundaries=frozenset({start, end}))
    d.remember(earlier)
    d.reset()
    assert d.propose([*prompt, 30], 3, GREEDY, RNG).tokens == [40, 41, 42]
    assert d.match_len == 3  # 70, 71, 30: the header counted
    d.reset()
    d.answer_start = len(prompt)
    assert d.propose([*prompt, 30], 3, GREEDY, RNG).tokens == [40, 41, 42]
    assert d.match_len == 1  # 30 alone
    # Within the answer it counts as before: here the answer's 3 tokens.
    assert d.propose([*prompt, 30, 40, 41], 1, GREEDY, RNG).tokens == [42]
    assert d.match_len == 3


def test_the_same_conversation_again_is_a_full_match_from_its_answers_first_token() -> None:
    """Asked again what it was asked before (a retry, a regenerated answer), the remembered
    answer is the one to draft, from the first token on, however short the question."""
    start, end = 900, 901
    header = [start, 70, 71]
    prompt = [start, 60, 61, 5, 6, end, *header]  # <|im_start|> user \n 5 6 <|im_end|> …
    answer = [30, 40, 41, 42, end]
    d = NgramDrafter(n_min=2, n_max=4, memory_tokens=100, boundaries=frozenset({start, end}))
    d.remember([*prompt, *answer])
    d.remember([start, 60, 61, 7, 6, end, *header, 30, 50, 51, end])  # another question
    d.reset()
    d.answer_start = len(prompt)
    assert d.propose(prompt, 8, GREEDY, RNG).tokens == answer
    assert d.from_memory and d.match_len == NgramMemory.MAX_MATCH
    # The other question's answer began the same way: it still agrees only as far as the answer.
    d.reset()
    other = [start, 60, 61, 8, 6, end, *header]
    d.answer_start = len(other)
    d.propose([*other, 30], 3, GREEDY, RNG)
    assert d.match_len == 1
    # Agreement over MAX_MATCH tokens counts across turn markers too (a long question's end).
    long_q = [start, 60, 61, *range(100, 140), end, *header]
    d.remember([*long_q, 30, 80, 81, end])
    d.reset()
    d.answer_start = len(long_q)
    assert d.propose([9, *long_q[1:]], 3, GREEDY, RNG).tokens == [30, 80, 81]
    assert d.match_len == NgramMemory.MAX_MATCH


def test_a_raw_prompts_answer_agrees_back_into_the_prompt() -> None:
    """A raw prompt is continued, not answered: its end is context like any other."""
    d = NgramDrafter(n_min=2, n_max=4)
    d.reset()  # answer_start 0
    seq = [1, 2, 3, 4, 5, 9, 1, 2, 3, 4]
    assert d.propose(seq, 2, GREEDY, RNG).tokens == [5, 9] and d.match_len == 4


def test_agreement_stops_at_the_last_boundary_token_within_the_limit() -> None:
    marks = frozenset({7, 9})
    assert since_boundary([1, 2, 3, 4], 32, marks) == 32  # none: the limit
    assert since_boundary([1, 7, 3, 4], 32, marks) == 2  # two tokens after the marker
    assert since_boundary([9, 3, 4, 5, 6], 3, marks) == 3  # the marker is past the limit
    assert since_boundary([3, 4, 9], 32, marks) == 0  # the marker is the last token
    assert since_boundary([], 32, marks) == 32
    assert since_boundary([7, 1], 32, frozenset()) == 32  # no boundaries: the limit


def test_a_glance_finds_every_match_a_lookup_would_price_as_long() -> None:
    """Where `glance` says no, `propose` on the same history matches fewer than n_max tokens
    (or none): a step that only glances misses no long match, in the request or the memory.
    Histories over a 3-token alphabet repeat often; glances and lookups interleave, as steps
    that stand and steps that ask do, so the index stays whole through glances."""
    rng = random.Random(7)
    looked, glanced = NgramDrafter(memory_tokens=64), NgramDrafter(memory_tokens=64)
    misses = 0
    for _ in range(3):
        history = [rng.randrange(3) for _ in range(6)]
        looked.reset()
        glanced.reset()
        for step in range(60):
            history.append(rng.randrange(3) if rng.random() < 0.7 else 9 + step)
            seen = glanced.glance(history) if step % 8 else None
            if step % 8 == 0:
                glanced.propose(history, 4, GREEDY, RNG)
            looked.propose(history, 4, GREEDY, RNG)
            if seen is False:
                misses += 1
                assert looked.match_len < looked.n_max, (history, looked.match_len)
        looked.remember(history)
        glanced.remember(history)
    assert misses > 10  # the property was tried where it could fail


def test_a_glance_sees_what_was_said_since_the_last_lookup() -> None:
    d = NgramDrafter()
    history = [9, 8, 7, 6, 5]
    d.propose(history, 4, GREEDY, RNG)
    seen = []
    for token in [1, 2, 3, 4, 1, 2, 3, 4]:  # only glanced at: said after the last lookup
        history.append(token)
        seen.append(d.glance(history))
    assert seen == [False] * 7 + [True]
    assert d.propose(history, 4, GREEDY, RNG).tokens == [1, 2, 3, 4]


def test_a_glance_always_looks_where_there_is_a_prediction() -> None:
    d = NgramDrafter()
    assert not d.glance([1, 2, 3, 4, 5])
    d.predict([7, 8], 5)
    assert d.glance([1, 2, 3, 4, 5])
