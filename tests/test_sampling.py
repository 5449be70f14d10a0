from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from homespec.engine.sampling import Draws, SamplingParams, distribution, log_weights, pick, verify


def as_float64(p: np.ndarray) -> np.ndarray:
    """float32 probabilities summed again in float64: chisquare wants its sums to agree."""
    out = p.astype(np.float64)
    return out / out.sum()


def test_top_k_keeps_only_k_tokens() -> None:
    logits = np.array([1.0, 5.0, 3.0, 4.0, 2.0], dtype=np.float32)
    p = distribution(logits, SamplingParams(temperature=1.0, top_k=2))
    assert set(np.flatnonzero(p)) == {1, 3}
    assert p.sum() == pytest.approx(1.0)


def test_top_p_keeps_smallest_prefix_reaching_mass() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    p = distribution(logits, SamplingParams(temperature=1.0, top_p=0.7))
    assert set(np.flatnonzero(p)) == {0, 1}
    assert p[0] == pytest.approx(0.5 / 0.8)


def test_min_p_keeps_tokens_at_least_that_share_of_the_likeliest() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.12, 0.08], dtype=np.float32))
    p = distribution(logits, SamplingParams(temperature=1.0, min_p=0.2))  # cut below 0.1
    assert set(np.flatnonzero(p)) == {0, 1, 2}
    assert p[0] == pytest.approx(0.5 / 0.92)
    # Applied to the tempered distribution: hotter flattens it, so more tokens pass.
    hot = distribution(logits, SamplingParams(temperature=2.0, min_p=0.2))
    assert set(np.flatnonzero(hot)) == {0, 1, 2, 3}
    # min_p 1 keeps the likeliest only (greedy at any temperature); 0 keeps all.
    assert set(np.flatnonzero(distribution(logits, SamplingParams(1.0, min_p=1.0)))) == {0}
    assert np.count_nonzero(distribution(logits, SamplingParams(1.0))) == 4


def test_min_p_and_top_p_compose() -> None:
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1], dtype=np.float32))
    p = distribution(logits, SamplingParams(temperature=1.0, top_p=0.9, min_p=0.6))
    # top_p keeps 0.4/0.3/0.2 (renormalised 0.44/0.33/0.22); min_p 0.6 × 0.44 cuts 0.22.
    assert set(np.flatnonzero(p)) == {0, 1}
    assert p[0] == pytest.approx(4 / 7)


def test_speculative_sampling_keeps_min_p_cut_tokens_out() -> None:
    """Draft and target both filtered by the same min_p (as the engine does): a drafted token
    the target's filter cut is never emitted, and the output is distributed as p."""
    params = SamplingParams(temperature=1.0, min_p=0.3)
    target = np.log(np.array([[0.45, 0.25, 0.15, 0.1, 0.05]] * 2)).astype(np.float32)
    draft = np.log(np.array([0.05, 0.15, 0.2, 0.3, 0.3])).astype(np.float32)
    p = as_float64(distribution(target[0], params))
    assert p[3] == p[4] == 0.0  # the draft likes what the target cut
    n = 30_000
    counts = np.zeros(p.size)
    for seed in range(n):
        draws = Draws(seed)
        drafted = pick(draft, params, draws, 0)
        kept, token = verify([drafted], target, params, draws, 0)
        counts[drafted if kept else token] += 1
        assert verify([3], target, params, draws, 0)[0] == 0  # a looked-up draft the filter cut
    assert counts[3] == counts[4] == 0
    assert chisquare(counts[:3], p[:3] * n).pvalue > 1e-3


def test_greedy_pick_is_argmax() -> None:
    logits = np.array([0.1, 0.3, 0.2], dtype=np.float32)
    assert pick(logits, SamplingParams(temperature=0.0), Draws(0), 0) == 1


@pytest.mark.parametrize("temperature", [5e-324, 1e-300, 1e-46, 1e-45, 1e-40, 1e-12])
def test_a_temperature_near_zero_samples_the_argmax(temperature: float) -> None:
    """JSON allows any positive temperature: one that rounds to 0 in float32 is greedy, and a
    tiny one tempers every token but the likeliest to nothing, with no NaN on the way (5e-324
    with top_k 1 was a 500 from the daemon: IndexError in the top-k filter)."""
    logits = np.array([1.0, 3.0, 2.0, 3.0 - 1e-6, -5.0], dtype=np.float32)
    for filters in ({}, {"top_k": 1}, {"top_k": 2}, {"top_p": 0.9}, {"min_p": 0.05}):
        params = SamplingParams(temperature=temperature, seed=3, **filters)  # type: ignore[arg-type]
        for position in range(20):
            assert pick(logits, params, Draws(3), position) == 1
        if not params.greedy:
            p = distribution(logits, params)
            assert not np.isnan(p).any() and p[1] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.5, top_k=3),
        SamplingParams(temperature=1.3, top_p=0.8),
        SamplingParams(temperature=1.0, min_p=0.15),
    ],
)
def test_pick_draws_from_the_filtered_distribution(params: SamplingParams) -> None:
    """Gumbel-max over log-weights, one seed per answer: over seeds, `pick` is distributed as
    `distribution` says, filters included."""
    logits = np.log(np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])).astype(np.float32)
    p = as_float64(distribution(logits, params))
    n = 30_000
    counts = np.zeros(p.size)
    for seed in range(n):
        counts[pick(logits, params, Draws(seed), 3)] += 1
    kept = p > 0
    assert not counts[~kept].any()
    assert chisquare(counts[kept], p[kept] * n).pvalue > 1e-3


def test_positions_draw_independently_and_a_seed_repeats_its_draws() -> None:
    """Two positions of one answer are not correlated, and the same (seed, position) gives
    the same noise in any order of asking; a longer vocabulary extends it, it does not
    change the entries the shorter one saw."""
    logits = np.zeros(4, dtype=np.float32)  # uniform
    params = SamplingParams(temperature=1.0)
    pairs = np.zeros((4, 4))
    for seed in range(16_000):
        draws = Draws(seed)
        pairs[pick(logits, params, draws, 8), pick(logits, params, draws, 9)] += 1
    assert chisquare(pairs.ravel()).pvalue > 1e-3
    a, b = Draws(5), Draws(5)
    later = b.gumbel(12, 100).copy()
    assert np.array_equal(a.gumbel(11, 100), b.gumbel(11, 100))
    assert np.array_equal(a.gumbel(12, 50), later[:50])
    assert np.array_equal(a.gumbel(12, 300)[:100], later)
    assert not np.array_equal(a.gumbel(11, 100), a.gumbel(12, 100))
    assert not np.array_equal(Draws(6).gumbel(11, 100), a.gumbel(11, 100))


def test_the_fast_filters_keep_what_a_full_sort_keeps() -> None:
    """top-k and top-p look only near the top of the vocabulary (sampling._top_k,
    _likeliest); on flat and peaked rows, with ties, they keep what sorting all of it keeps."""
    rng = np.random.default_rng(4)
    for trial in range(400):
        scale = [0.3, 3.0, 30.0][trial % 3]
        logits = (rng.standard_normal(int(rng.choice([40, 3000]))) * scale).astype(np.float32)
        if trial % 4 == 0:
            logits = np.round(logits)  # ties, the k-th among them
        k, mass = int(rng.integers(1, logits.size)), float(rng.uniform(0.05, 0.999))
        kept_k = np.flatnonzero(np.isfinite(log_weights(logits, SamplingParams(1.0, top_k=k))))
        assert set(kept_k) == set(np.flatnonzero(logits >= np.sort(logits)[-k])), trial
        p = distribution(logits, SamplingParams(1.0))
        order = np.argsort(-p, kind="stable")
        nucleus = order[: int(np.searchsorted(np.cumsum(p[order]), mass)) + 1]
        kept_p = np.flatnonzero(distribution(logits, SamplingParams(1.0, top_p=mass)))
        assert set(kept_p) == set(nucleus), trial
