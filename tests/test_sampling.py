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
