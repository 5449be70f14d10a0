"""Token sampling and the speculative acceptance rule, on numpy logits.

Both the target and the draft distributions go through the same `distribution()` transform
(temperature, then top-k, top-p and min-p), so speculative sampling reproduces exactly the
distribution that plain sampling with the same settings draws from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Logits = npt.NDArray[np.float32]
Probs = npt.NDArray[np.float64]


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    min_p: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def distribution(logits: Logits, params: SamplingParams) -> Probs:
    """Probabilities after temperature, then top-k, top-p (nucleus) and min-p filtering, each
    on the tempered distribution (as vLLM orders them; llama.cpp filters before its
    temperature). min-p keeps the tokens at least `min_p` times as likely as the likeliest."""
    z = logits.astype(np.float64) / params.temperature
    if 0 < params.top_k < z.size:
        kth = np.partition(z, -params.top_k)[-params.top_k]
        z = np.where(z >= kth, z, -np.inf)
    z -= np.max(z)
    p = np.exp(z)
    p /= p.sum()
    if params.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        keep = order[: int(np.searchsorted(cum, params.top_p)) + 1]
        mask = np.zeros_like(p)
        mask[keep] = 1.0
        p = p * mask
        p /= p.sum()
    if params.min_p > 0.0:
        p = np.where(p >= params.min_p * p.max(), p, 0.0)  # the likeliest always stays
        p /= p.sum()
    return p


def sample(probs: Probs, rng: np.random.Generator) -> int:
    # Inverse-CDF sampling: one uniform draw, robust to probabilities that sum to 1 - eps.
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), probs.size - 1))


def pick(logits: Logits, params: SamplingParams, rng: np.random.Generator) -> int:
    """One token from the target's logits, as plain decoding would choose it."""
    if params.greedy:
        return int(np.argmax(logits))
    return sample(distribution(logits, params), rng)


def accept_or_resample(
    p: Probs, q: Probs | None, token: int, rng: np.random.Generator
) -> tuple[bool, int]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023) for one drafted token.

    `p` is the target's distribution, `q` the draft's (None: a deterministic proposal such as an
    n-gram, i.e. q is one-hot at `token`). Accept with probability min(1, p/q); on rejection draw
    from normalize(max(0, p - q)). Either way the emitted token is distributed exactly as p.
    Returns (accepted, token to emit).
    """
    q_tok = 1.0 if q is None else float(q[token])
    if q_tok > 0.0 and rng.random() * q_tok < p[token]:
        return True, token
    if q is None:
        residual = p.copy()
        residual[token] = 0.0
    else:
        residual = np.maximum(p - q, 0.0)
    total = residual.sum()
    if total <= 0.0:  # p == q up to rounding: any draw from p is right
        return False, sample(p, rng)
    return False, sample(residual / total, rng)


def verify(
    drafts: list[int],
    q: list[Probs | None] | None,
    logits: Logits,
    params: SamplingParams,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """One verify step: how many of `drafts` the target keeps, and the token that follows them.

    `logits` holds the target's rows for [last committed token] + drafts (len(drafts) + 1
    rows); `q` the draft's distribution per drafted token when it sampled them (None, for all
    or for one: a deterministic proposal). Greedy: keep drafts while they equal the target's argmax.
    Sampling: speculative sampling per draft (accept_or_resample). The first rejection emits the
    target's own token instead; if every draft is kept, the target's next token comes free.
    Returns (accepted count, next token). The output is exactly the target's: token-identical
    at temperature 0, the same distribution above it.
    """
    for i, draft in enumerate(drafts):
        if params.greedy:
            token = int(np.argmax(logits[i]))
            accepted = token == draft
        else:
            qi = q[i] if q is not None else None
            accepted, token = accept_or_resample(distribution(logits[i], params), qi, draft, rng)
        if not accepted:
            return i, token
    return len(drafts), pick(logits[len(drafts)], params, rng)
