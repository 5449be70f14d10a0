from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from homespec.engine.sampling import SamplingParams, accept_or_resample, distribution, pick


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
    rng = np.random.default_rng(2)
    params = SamplingParams(temperature=1.0, min_p=0.3)
    p = distribution(np.log(np.array([0.45, 0.25, 0.15, 0.1, 0.05])), params)
    q = distribution(np.log(np.array([0.05, 0.15, 0.2, 0.3, 0.3])), params)
    assert p[3] == p[4] == 0.0 and q[3] > 0.0  # the draft likes what the target cut
    n = 30_000
    counts = np.zeros(p.size)
    for _ in range(n):
        d = int(rng.choice(p.size, p=q))
        counts[accept_or_resample(p, q, d, rng)[1]] += 1
    assert counts[3] == counts[4] == 0
    assert chisquare(counts[:3], p[:3] * n).pvalue > 1e-3


def test_greedy_pick_is_argmax() -> None:
    rng = np.random.default_rng(0)
    logits = np.array([0.1, 0.3, 0.2], dtype=np.float32)
    assert pick(logits, SamplingParams(temperature=0.0), rng) == 1


@pytest.mark.parametrize("deterministic_draft", [False, True])
def test_speculative_sampling_reproduces_target_distribution(deterministic_draft: bool) -> None:
    """Draft from q, accept/resample against p: the emitted tokens must be distributed as p."""
    rng = np.random.default_rng(1)
    p = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
    q = np.array([0.1, 0.1, 0.2, 0.2, 0.4])  # deliberately far from p
    n = 40_000
    counts = np.zeros(p.size)
    accepted = 0
    for _ in range(n):
        if deterministic_draft:  # an n-gram proposal: always token 4, one-hot q
            ok, tok = accept_or_resample(p, None, 4, rng)
        else:
            d = int(rng.choice(p.size, p=q))
            ok, tok = accept_or_resample(p, q, d, rng)
        counts[tok] += 1
        accepted += ok
    assert chisquare(counts, p * n).pvalue > 1e-3
    # Acceptance must be the theoretical sum(min(p, q)) (or p[4] for the one-hot proposal).
    expected_accept = p[4] if deterministic_draft else np.minimum(p, q).sum()
    assert accepted / n == pytest.approx(expected_accept, abs=0.01)
