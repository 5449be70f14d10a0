"""Token sampling and the speculative acceptance rule, on numpy logits.

One rule picks every token, drafted or not: `pick(logits, params, draws, position)`. Greedy
takes the argmax. Sampling takes the argmax of the tempered, filtered log-probabilities plus
Gumbel noise (the Gumbel-max trick: an exact draw from the softmax), where the noise is a
function of the request's seed and the token's position in the sequence only (`Draws`).

So a verify step keeps a draft exactly when it is the token plain decoding would have picked
at that position, with the same seed, and the first token it does not keep is replaced by that
token: the answer is plain decoding's own, token for token, at any temperature, whichever
drafter ran and however long its drafts were (the governor's choices change the speed, never
the answer). A draft model samples its proposals with the same noise, which couples them to
the target's picks: where the two distributions are close, so are the two draws (measured on
the demo pair, 60-token answers at temperature 0.3 / 0.7 / 1.0: kept 0.968 / 0.968 / 0.956
of the time, against 0.972 / 0.973 / 0.965 for Leviathan et al.'s rejection sampling, which
reaches the same distribution but not the same sample).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Logits = npt.NDArray[np.float32]
Probs = npt.NDArray[np.float32]
Noise = npt.NDArray[np.float32]


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    min_p: float = 0.0

    @property
    def greedy(self) -> bool:
        """Temperature 0, or one that rounds to 0 in the logits' float32 (under about 1e-45,
        which JSON allows): tempering by it would divide by zero."""
        return float(np.float32(self.temperature)) <= 0.0


class Draws:
    """The random numbers of one sampled answer: for each sequence position, one Gumbel value
    per vocabulary entry, from a numpy stream seeded by (seed, position) alone, so a position
    draws the same noise whether plain decoding, a draft model or a verify step asks, and in
    whatever order. Kept for the positions still ahead of the answer (`forget_before`)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._noise: dict[int, Noise] = {}

    def gumbel(self, position: int, size: int) -> Noise:
        noise = self._noise.get(position)
        if noise is None or noise.size < size:
            # numpy fills an array element by element, so the first `size` values of a longer
            # fill are these same ones: a draft with a larger vocabulary than its target (or a
            # smaller one) sees the target's noise on the tokens they share.
            rng = np.random.default_rng([self.seed, position])
            e = rng.standard_exponential(size, dtype=np.float32)
            noise = -np.log(np.maximum(e, np.finfo(np.float32).tiny))
            self._noise[position] = noise
        return noise[:size]

    def forget_before(self, position: int) -> None:
        for p in [p for p in self._noise if p < position]:
            del self._noise[p]


def distribution(logits: Logits, params: SamplingParams) -> Probs:
    """Probabilities after temperature, then top-k, top-p (nucleus) and min-p filtering, each
    on the tempered distribution (as vLLM orders them; llama.cpp filters before its
    temperature). min-p keeps the tokens at least `min_p` times as likely as the likeliest.
    In float32, like the logits: a float64 copy of a row of 49 152 cost more here than
    all the arithmetic on it."""
    return _filtered(_tempered(logits, params.temperature), params)


def _tempered(logits: Logits, temperature: float) -> Logits:
    """`logits / temperature`, less their largest first: at a temperature near 0 the others go
    to -inf and the largest stays at 0. (Divided as they were, the largest went to inf, and
    inf - inf in the filters is NaN: temperature 1e-300 failed a request with an IndexError.)"""
    with np.errstate(over="ignore"):  # a gap over float32's range at a tiny temperature: -inf
        return (logits - np.max(logits)) / np.float32(temperature)


def _filtered(z: Logits, params: SamplingParams) -> Probs:
    """`distribution` of the tempered logits `z`."""
    z = _top_k(z, params.top_k)
    p: Probs = np.exp(z - np.max(z))
    p /= p.sum()
    if params.top_p < 1.0:
        order, cum = _likeliest(p, params.top_p)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        keep = order[: int(np.searchsorted(cum, params.top_p)) + 1]
        mask = np.zeros_like(p)
        mask[keep] = 1.0
        p = p * mask
        p /= p.sum()
    if params.min_p > 0.0:
        p = np.where(p >= params.min_p * np.max(p), p, np.float32(0.0))  # the likeliest stays
        p /= p.sum()
    return p


def _likeliest(p: Probs, mass: float) -> tuple[npt.NDArray[np.intp], Probs]:
    """The likeliest tokens in order (ties: lower id first), enough of them to hold `mass`,
    and their cumulative probabilities. A nucleus is a few tokens of a vocabulary of 50 000
    to 250 000, and every token outside a set that holds `mass` is less likely than every
    token in it, so only the tokens above a threshold are sorted, the threshold lowered until
    they hold enough: sorting the whole vocabulary cost 5 ms a token here, a third of a
    decode."""
    top = float(np.max(p))
    for share in (1e-3, 1e-6, 0.0):
        ids = np.flatnonzero(p >= share * top)
        if share == 0.0 or float(p[ids].sum()) >= mass:
            break
    order = ids[np.argsort(-p[ids], kind="stable")]
    return order, np.cumsum(p[order])


def log_weights(logits: Logits, params: SamplingParams) -> Logits:
    """`distribution`'s log-probabilities up to a constant (filtered tokens: -inf), without
    the exponentials when no top-p or min-p filter needs the probabilities."""
    z = _tempered(logits, params.temperature)
    if params.top_p < 1.0 or params.min_p > 0.0:
        return np.where(_filtered(z, params) > 0.0, z, np.float32(-np.inf))
    return _top_k(z, params.top_k)


def _top_k(z: Logits, k: int) -> Logits:
    """`z` with all but its k largest at -inf (ties at the k-th: all of them); k = 0: all.
    The k-th largest is looked for among the values within a margin of the largest first:
    when k of them are there, it is one of them (selecting over the whole row cost 0.3 ms)."""
    if not 0 < k < z.size:
        return z
    top = float(np.max(z))
    for margin in (16.0, 64.0, np.inf):
        near = z[z >= top - margin]
        if near.size >= k:
            break
    kth = np.partition(near, -k)[-k]
    return np.where(z >= kth, z, np.float32(-np.inf))


def top_probability(z: Logits) -> float:
    """The likeliest token's probability under log-weights `z`."""
    return 1.0 / float(np.exp(z - np.max(z)).sum())


def pick(logits: Logits, params: SamplingParams, draws: Draws, position: int) -> int:
    """The token at sequence `position` as plain decoding chooses it: the argmax when greedy,
    else the argmax of log-weights plus the position's Gumbel noise (a draw from
    `distribution`)."""
    if params.greedy:
        return int(np.argmax(logits))
    return int(np.argmax(log_weights(logits, params) + draws.gumbel(position, logits.size)))


def verify(
    drafts: list[int], logits: Logits, params: SamplingParams, draws: Draws, position: int
) -> tuple[int, int]:
    """One verify step: how many of `drafts` the target keeps, and the token that follows them.

    `logits` holds the target's rows for [last committed token] + drafts (len(drafts) + 1
    rows), the first of which predicts sequence `position`. A draft is kept while it is the
    token `pick` chooses there; the first that is not is replaced by `pick`'s token, and if
    every draft is kept the target's next token comes free. Returns (kept count, next token):
    plain decoding's tokens, whatever was drafted.
    """
    for i, draft in enumerate(drafts):
        token = pick(logits[i], params, draws, position + i)
        if token != draft:
            return i, token
    return len(drafts), pick(logits[len(drafts)], params, draws, position + len(drafts))
