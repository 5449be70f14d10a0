from __future__ import annotations

import numpy as np

from homespec.engine.drafters import NgramDrafter
from homespec.engine.sampling import SamplingParams

GREEDY = SamplingParams()
RNG = np.random.default_rng(0)


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


def test_a_repeating_answer_is_proposed_past_the_present() -> None:
    d = NgramDrafter(n_min=2, n_max=3)
    loop = [7, 8, 9, 10]
    history = [1, 2, *loop, *loop, *loop]
    # The last period's continuation ends at the present; the lookup goes on around the loop.
    assert d.propose(history, 10, GREEDY, RNG).tokens == [*loop, *loop, 7, 8]
    assert d.match_len >= 8
