"""What the governor (engine/governor.py) reads: the measured cost of a decode by its size
(`CostCurve`) and how often each draft position is kept (`Acceptance`), with what a draft of
k tokens is expected to commit. Pure, like the governor: engine/ledger.py keeps them.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

MAX_K = 64
MAX_TASKS = 64  # task names are the client's: every table by task is bounded
V = TypeVar("V")
VERIFY_SIZES = (1, 2, 4, 8, 16, 32)  # target decodes calibration measures (status shows them)
DRAFT_SIZES = (1, 8, 32)  # draft-model decodes (a catch-up on history decodes a batch)
PRIOR = 0.6  # draft-model acceptance before anything was measured (n-grams: MATCH_PRIORS)
PRIOR_WEIGHT = 2.0  # pseudo-observations behind the prior
MIN_REACH = 8  # drafts may always be this long; longer only REACH_GROWTH × the deepest tried
REACH_GROWTH = 2
DECAY = 0.99  # per recorded step: acceptance evidence ages
# N-gram acceptance is kept per match length: a proposal whose context agrees with the
# history's end for 20 tokens is far likelier to be right than one found by a 2-gram. Each
# bucket holds matches of at least that many tokens; its prior says so until measured.
# Bucket 1 is an answer's first token after the chat template's role header (the n-gram key
# holds the header, which every answer shares; NgramDrafter.reset): how an earlier answer
# went on after the same first word. Its prior is below what a draft must be kept to pay
# where verifying 2 tokens costs 1.5 plain steps (a CPU), above it where that is nearly
# free (a GPU); the steps that do not use it measure it either way (Ledger.learn_unused_match).
MATCH_BUCKETS = (1, 2, 4, 8, 16, 32)
MATCH_PRIORS = {1: 0.4, 2: 0.6, 4: 0.65, 8: 0.75, 16: 0.85, 32: 0.9}  # the others optimistic
# The same for proposals from a request's prediction (engine/prediction.py), kept apart: a
# client sends one because it expects the answer to read so, and a 2-token agreement there is
# usually the answer's first token agreeing with the prediction's (the anchor is the other).
PREDICTED_PRIORS = {1: 0.6, 2: 0.75, 4: 0.8, 8: 0.85, 16: 0.9, 32: 0.95}
# And for contested matches, kept apart too: where at most half of the places the history's
# last n-gram was seen at went on as the proposal does (prose's "of the", a list's "/dev/sd"),
# the proposal is the next token far less often. Over the six workloads' lookups at the H100's
# fixed costs, no task (used or only learned from), position 1 was kept 0.21 of the time on
# contested 2-token matches against 0.63 on the others, 0.34 against 0.81 on 4-token ones; in
# one table, the contested ones drafted on what the others had earned.
CONTESTED_PRIORS = {1: 0.15, 2: 0.25, 4: 0.35, 8: 0.5, 16: 0.6, 32: 0.7}


def match_bucket(match_len: int) -> int:
    return max([b for b in MATCH_BUCKETS if b <= match_len], default=MATCH_BUCKETS[0])


def table_key(match_len: int, predicted: bool = False, contested: bool = False) -> str:
    """The name of the acceptance table a lookup match this long is priced from (and kept
    under in the learned file): by match length bucket, the prediction's and the contested
    matches' apart (a prediction's match is never contested: it is one text)."""
    kind = "predicted" if predicted else "contested" if contested else "ngram"
    return f"{kind}@{match_bucket(match_len)}"


def match_priors(predicted: bool = False, contested: bool = False) -> dict[int, float]:
    """The priors by match bucket of the tables `table_key` names."""
    return PREDICTED_PRIORS if predicted else CONTESTED_PRIORS if contested else MATCH_PRIORS


@dataclass
class CostCurve:
    """Milliseconds of one target decode of n tokens, from calibration and real steps.

    Each measured n keeps a moving average; between measured points the curve is linear, and
    past the last one it follows the last segment's slope (a single point: the `slope` prior,
    as a fraction of the one-token cost per extra token).
    """

    points: dict[int, float] = field(default_factory=dict)
    slope: float = 0.25
    alpha: float = 0.2  # weight of a new observation in the moving average

    def observe(self, n: int, ms: float) -> None:
        old = self.points.get(n)
        self.points[n] = ms if old is None else (1 - self.alpha) * old + self.alpha * ms

    def at(self, n: int) -> float | None:
        known = self.points.get(n)
        if known is not None:
            return known
        if not self.points:
            return None
        return self._between(n, sorted(self.points))  # a handful of points

    def upto(self, n: int) -> list[float] | None:
        """[at(1), …, at(n)], or None when nothing is measured: one walk along the sorted
        points for all of them (the governor prices every draft length each time it is asked;
        one `at` for each, sorting the points every time, was a quarter of choose()'s time in
        a profile, and a bisect for each the most of upto's)."""
        points = self.points
        if not points:
            return None
        xs = sorted(points)
        if len(xs) == 1:
            return [points[i] if i in points else self._between(i, xs) for i in range(1, n + 1)]
        # _between's arithmetic for each size, segment by segment: the same figures to the bit
        first, last = xs[0], xs[-1]
        out = [self._between(i, xs) for i in range(1, min(first, n + 1))]  # under the first
        for lo, hi in itertools.pairwise(xs):
            if lo > n:
                break
            y0, rise, span = points[lo], points[hi] - points[lo], hi - lo
            out.append(y0)
            out += [
                y if (y := y0 + rise * (i - lo) / span) > 0.0 else 0.0
                for i in range(lo + 1, min(hi, n + 1))
            ]
        if n >= last:
            top, tail = points[last], max(0.0, self._tail_slope(xs))
            out += [top + tail * (i - last) for i in range(last, n + 1)]
        return out

    def _between(self, n: int, xs: list[int]) -> float:
        """The cost of n tokens, not measured, from the measured sizes `xs` (sorted)."""
        if len(xs) == 1 or n < xs[0]:
            # From the first point by the prior slope: its one-token cost is y / (1 + slope ×
            # (x - 1)). (A draft's first decode is often a catch-up of hundreds of tokens;
            # read as a one-token cost and extrapolated down, it priced a draft token below 0.)
            x, y = xs[0], self.points[xs[0]]
            return y / (1 + self.slope * (x - 1)) * (1 + self.slope * (n - 1))
        if n > xs[-1]:
            # Past the last point, the slope over a wide stretch (from the last point measured
            # at half its size or less): real steps measure neighbouring sizes (30, 31 tokens)
            # whose noise can make the last segment fall, and a falling slope priced a draft
            # model's 243-token catch-up at nothing. Cost never falls with more tokens.
            return self.points[xs[-1]] + max(0.0, self._tail_slope(xs)) * (n - xs[-1])
        i = bisect.bisect_left(xs, n)
        lo, hi = (xs[0], xs[1]) if i == 0 else (xs[i - 1], xs[i])  # i == 0: n is the first
        y0, y1 = self.points[lo], self.points[hi]
        return max(0.0, y0 + (y1 - y0) * (n - lo) / (hi - lo))

    def _tail_slope(self, xs: list[int]) -> float:
        """The slope past the last measured size (sorted `xs`, two or more): over a wide
        stretch, from the last size measured at half the last one or less (see _between)."""
        hi = xs[-1]
        lo = max((x for x in xs if x <= hi / 2), default=xs[0])
        return (self.points[hi] - self.points[lo]) / (hi - lo) if hi != lo else 0.0


def sampled(curve: CostCurve, sizes: tuple[int, ...]) -> dict[int, float]:
    """The curve at `sizes` up to its largest measured one (real steps add a point at every
    size they decode: a report of all of them would run to dozens)."""
    top = max(curve.points, default=0)
    return {n: ms for n in sizes if n <= top and (ms := curve.at(n)) is not None}


def cost_report(
    verify: dict[int, float],
    draft: dict[int, float],
    agreement: float | None = None,
    step_ms: dict[str, float] | None = None,
    catch_up: str = "",
    copy_per_token: float | None = None,
) -> dict[str, Any]:
    """Measured costs as status and doctor show them (JSON): ms of one target decode and of
    one draft-model decode by tokens in it, ms per draft-model token, the share of next
    tokens on which the draft model agreed with the target at calibration, and what a step
    costs beyond its decodes by what it ran (homespec's own work: the lookup, the governor,
    checking drafts, detokenizing; governor.step_ms prices it); how the draft model catches
    up (`catch_up`, engine/cache_share.py: "" where it was not asked) and, where by copying
    the target's cache, ms per token that copy moves."""
    per_token = CostCurve(dict(draft)).at(1)
    return {
        "verify_ms": {str(n): round(ms, 2) for n, ms in sorted(verify.items())},
        "draft_ms_per_token": None if per_token is None else round(per_token, 2),
        "draft_ms": {str(n): round(ms, 2) for n, ms in sorted(draft.items())},
        "draft_agreement": None if agreement is None else round(agreement, 3),
        "step_overhead_ms": {name: round(ms, 3) for name, ms in (step_ms or {}).items()},
        "draft_catch_up": catch_up or None,
        "copy_ms_per_token": None if copy_per_token is None else round(copy_per_token, 4),
    }


@dataclass
class Acceptance:
    """How often draft position i is kept, given that every position before it was.

    Counts decay by DECAY a step (about the last 100 steps weigh), so a task whose drafts stop
    being right turns speculation off within tens of steps, not after its whole history.
    """

    tries: list[float] = field(default_factory=lambda: [0.0] * MAX_K)
    kept: list[float] = field(default_factory=lambda: [0.0] * MAX_K)
    prior: float = PRIOR  # position 1's acceptance before anything was measured
    # The observations `prior` weighs at position 1 (positions after it: PRIOR_WEIGHT, their
    # prior being a guess from the one before)
    prior_weight: float = PRIOR_WEIGHT
    # What the pair's other tasks measured at positions 2 and on, as a few observations
    # (Ledger._new seeds a new task's table with them; never decayed, never saved)
    seed_tries: list[float] = field(default_factory=lambda: [0.0] * MAX_K)
    seed_kept: list[float] = field(default_factory=lambda: [0.0] * MAX_K)
    # Positions from `depth` on hold no counts and no seed, and `reach_` is reach(): both kept
    # by record, as the governor asks for reach at every estimate and a draft rarely goes past
    # a dozen positions. Set tries, kept and the seeds at construction; change them through
    # record after it.
    depth: int = field(default=MAX_K, init=False, repr=False, compare=False)
    reach_: int = field(default=MIN_REACH, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._measure(self.depth)

    def record(self, proposed: int, accepted: int) -> None:
        tries, kept = self.tries, self.kept
        for i in range(self.depth):
            tries[i] *= DECAY
            kept[i] *= DECAY
        n = min(accepted + 1, proposed)
        for i in range(n):
            tries[i] += 1
            if i < accepted:
                kept[i] += 1
        self._measure(max(self.depth, n))

    def _measure(self, depth: int) -> None:
        """`depth` and `reach_` from the counts below `depth` (none hold any past it)."""
        tries, kept, seed = self.tries, self.kept, self.seed_tries
        down = range(depth - 1, -1, -1)
        self.depth = next((i + 1 for i in down if tries[i] or kept[i] or seed[i]), 0)
        tried = next((i + 1 for i in down if tries[i] + seed[i] >= 1), 0)  # the deepest
        self.reach_ = max(MIN_REACH, REACH_GROWTH * tried)

    def rate(self, i: int, prior: float) -> float:
        weight = self.prior_weight if i == 0 else PRIOR_WEIGHT
        kept = self.kept[i] + self.seed_kept[i] + prior * weight
        return kept / (self.tries[i] + self.seed_tries[i] + weight)

    def reach(self) -> int:
        """How long a draft may be on the evidence: REACH_GROWTH × the deepest position tried
        at least once lately (MIN_REACH before that). Draft lengths grow by doubling as long
        drafts keep being kept, like a congestion window, never straight to 64 on faith."""
        return self.reach_


def expected_by_length(acc: Acceptance, prior: float, stretch: float = 1.0) -> Iterator[float]:
    """Tokens one step commits on average when it drafts k = 1, 2, … (one value per k).
    A position's prior is `stretch` × the estimate of the position before it.

    N-gram lookup (stretch 1): a continuation that has been right so far is as likely to stay
    right at the next token as it was at the last; a copied file or a remembered answer breaks
    at an edit, anywhere, so acceptance is a constant hazard per position and untried
    positions are priced at the deepest measured rate (`reach` bounds how far that is taken).
    The draft model (STRETCH): its errors compound, so an untried position is taken to behave
    a little worse than the one before it. (Taken as equal, 6-token drafts kept 97% of the time
    priced a never-tried 64-token draft-model step as a win; on a CPU it cost 1 s a step.)"""
    total, survive = 1.0, 1.0
    tries, kept, seed_tries, seed_kept = acc.tries, acc.kept, acc.seed_tries, acc.seed_kept
    weight = acc.prior_weight
    for i in range(MAX_K):  # acc.rate(i, …), written out: the governor runs this every step
        if i:
            prior, weight = prior * stretch, PRIOR_WEIGHT
        prior = (kept[i] + seed_kept[i] + prior * weight) / (tries[i] + seed_tries[i] + weight)
        survive *= prior
        total += survive
        yield total


def expected_tokens(acc: Acceptance, k: int, prior: float) -> float:
    """expected_by_length at one k (k = 0: plain decoding's one token)."""
    return next(itertools.islice(expected_by_length(acc, prior), k - 1, None)) if k else 1.0


def keep_recent(table: dict[str | None, V], task: str | None, value: V) -> None:
    """Store `value` as the most recently used task's and drop the least recently used
    beyond MAX_TASKS (task names are the client's: a bounded table)."""
    table.pop(task, None)
    table[task] = value
    while len(table) > MAX_TASKS:
        del table[next(iter(table))]
