"""What a pair has measured, for the governor (engine/governor.py) to decide from: the target's
cost curve, the draft model's, acceptance per task and drafter (kept across restarts by
engine/learned.py) and how long each task's answers run. The loop writes it, with timings it
reads from the clock; `Ledger.inputs()` hands one step's view to `governor.choose()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from homespec.engine.catch_up import RELAG, catch_up_cost
from homespec.engine.estimates import (
    MAX_K,
    PRIOR,
    PRIOR_WEIGHT,
    Acceptance,
    CostCurve,
    keep_recent,
    match_bucket,
    match_priors,
    table_key,
)
from homespec.engine.governor_types import Inputs, Option
from homespec.engine.lengths import Lengths

DRAFT_COST_PRIOR = 0.5  # an unmeasured draft-model token, as a share of a target token
HORIZON_UNKNOWN = 64  # answer tokens expected of a task never seen, on a pair that saw none
SEED_WEIGHT = 4.0  # observations at position 2 that a new task's seed weighs (Ledger._new)
UPKEEP_FADE = 0.8  # see observe_upkeep
UNKNOWN_WAIT = 8  # answer tokens such a task's answer runs before a catch-up is spent on it
# A catch-up dearer than this many plain steps also waits for UNKNOWN_WAIT answer tokens on a
# task whose answers are known (see Ledger.horizon's `lag`)
DEAR_CATCH_UP = 2.0
# Of the room left (max_tokens), the most a never-seen task's answer is expected to run (see
# Ledger.horizon). At 0.75 (fixed-cost replay, CPU costs, eleven workloads), a 181-token JSON
# answer 1.08 -> 1.30x plain, but a 14-token product asked with max_tokens 80 1.12 -> 0.93x and
# a 63-token list of commands 1.19 -> 1.06x: the draft model caught up for answers that ended.
UNKNOWN_ROOM_SHARE = 0.5
# Answer tokens the task's lookup share weighs against what lookup committed in the answer at
# hand (Ledger.lookup_share_now). (Fixed-cost replay, CPU costs, no task, as a daemon's OpenAI
# clients send: unseen-11's story opening 0.98 -> 1.34x plain, unseen-10's explained command
# 1.03 -> 1.28x, its arithmetic 1.16 -> 1.27x; the shipped creative prompts 2.94 -> 2.83x.)
SHARE_PRIOR_TOKENS = 32.0
SLOWDOWN_ALPHA = 0.2  # weight of one target decode in Ledger.slowdown
OVERHEAD_ALPHA = 0.1  # weight of one step in Ledger.overhead
# The machine's slowdown moved less than this factor since a cost was measured: it stands as
# measured (Ledger._drift). (The curve's shape drifts too: on a 2-core VM one-token decodes went
# from 14 to 10 ms between runs while 8-token ones went from 27 to 33, so `slowdown` wanders by a
# quarter with the mix of step sizes; a neighbour taking the CPU doubles it.)
DRIFT_BAND = 1.5
AGREEMENT_MIN, AGREEMENT_MAX = 0.05, 0.95  # a measured agreement, as a prior, within these
# Observations at position 1 that a measured agreement weighs as a new task's prior for the
# draft model (Ledger._new): half the positions calibration compares (AGREEMENT_POSITIONS;
# along one text they are not independent). At PRIOR_WEIGHT (2), one rejected draft on a
# bench's warm-up greeting, a near-tie the demo draft loses, priced a draft measured at 95%
# at 0.63 on every task after it, below plain: it was never tried on them (fixed-cost replay,
# tasks named, a greeting before each prompt: 1.28x plain on unseen-1 where 1.38x without it).
AGREEMENT_WEIGHT = 16.0
COPY_ALPHA = 0.3  # weight of one copy of the target's cache in Ledger.copy_per_token


@dataclass
class Ledger:
    """What a pair has measured so far, kept for the engine's lifetime: the target's cost
    curve, the draft model's cost per token, and acceptance per task and drafter. The loop
    writes it (with timings it reads from the clock); `inputs()` hands it to `choose()`."""

    verify: CostCurve = field(default_factory=CostCurve)
    quiet: CostCurve = field(default_factory=CostCurve)  # the calibration's, never updated
    draft: CostCurve = field(default_factory=CostCurve)  # the draft model's, ms by tokens
    ngram_ms: float = 0.02
    # by task: "model", "ngram@B" for n-gram matches in bucket B (MATCH_BUCKETS), and
    # "predicted@B" for those found in a request's prediction (engine/prediction.py)
    by_task: dict[str | None, dict[str, Acceptance]] = field(default_factory=dict)
    steps: int = 0
    asked_at: int = 0  # `steps` when choose() last ran (a settled plain choice skips it)
    current: Option = "none"
    last_used: dict[Option, int] = field(default_factory=dict)
    lengths: Lengths = field(default_factory=Lengths)  # recent answers' lengths, by task
    # The draft model's agreement with the target, measured at load (engine/calibration.py)
    agreement: float | None = None
    # by task: moving averages of (ms of later catch-ups, tokens of draft-model steps) per
    # answer; see observe_upkeep
    upkeep: dict[str | None, tuple[float, float]] = field(default_factory=dict)
    # by task: moving averages of (answer tokens committed by n-gram steps, answer tokens)
    # per answer; see observe_lookup_share
    shares: dict[str | None, tuple[float, float]] = field(default_factory=dict)
    # The target's recent decodes' cost over the calibration's at their size (1: as quiet
    # as at load, 2: half as fast; see observe_verify), and what it was when the draft
    # model's costs were last measured (None: never; see draft_curve)
    slowdown: float = 1.0
    draft_ref: float | None = None
    verify_ref: dict[int, float] = field(default_factory=dict)  # the same, by verify size
    # ms of target and draft-model decodes since the last one-token target decode, the one
    # measure of plain decoding's cost (the governor's PROBE_MS)
    since_plain_ms: float = 0.0
    # ms a governed step costs beyond its decodes, by what it ran (moving averages; see
    # observe_step), and the decodes' ms of the step under way
    overhead: dict[Option, float] = field(default_factory=dict)
    step_decodes_ms: float = 0.0
    # ms per token the target holds that copying its cache into the draft model costs (a
    # moving average of the copies made; None: the draft model decodes its catch-ups itself,
    # engine/cache_share.py)
    copy_per_token: float | None = None

    @property
    def calibrated_busy(self) -> bool:
        """The target's decodes run DRIFT_BAND times faster than the calibration measured:
        it was taken while something else held the CPU (two engines starting together on two
        cores measured 28 ms for one token that takes 10), and its curve is wrong in ways no
        scaling mends: a long verify priced at 4× its cost is never drafted again, so nothing
        measures it again. Measure again (the engine child does, between requests)."""
        return bool(self.quiet.points) and self.slowdown < 1 / DRIFT_BAND

    def chose(self, option: Option) -> None:
        """Record a step's choice (for hysteresis and exploration)."""
        self.steps += 1
        self.current = option
        self.last_used[option] = self.steps

    def acceptance(
        self,
        task: str | None,
        match_len: int = 0,
        *,
        predicted: bool = False,
        contested: bool = False,
    ) -> dict[Option, Acceptance]:
        """The task's acceptance for the draft model and for an n-gram match this long
        (`predicted`: found in the request's prediction, `contested`: see
        NgramDrafter.contested; each has tables of its own). At most MAX_TASKS tasks are
        kept (a client names tasks): the least recently used goes."""
        table = self.by_task.get(task)
        if table is None:
            table = {}
        keep_recent(self.by_task, task, table)  # now the most recently used
        key = table_key(match_len, predicted, contested)
        if key not in table:
            priors = match_priors(predicted, contested)
            table[key] = self._new(key, priors[match_bucket(match_len)])
        if "model" not in table:
            table["model"] = self._new(
                "model", self.model_prior, seed=True, weight=self.model_prior_weight
            )
        # Position 1's prior weighs what the pair knows of the draft model now, in every table:
        # a new one, one restored before calibration measured the agreement, and the one that
        # task-less requests share (set here, the one place, as a recalibration may change it).
        table["model"].prior_weight = self.model_prior_weight
        return {"ngram": table[key], "model": table["model"]}

    def learn_unused_match(
        self,
        task: str | None,
        match: list[int],
        committed: list[int],
        match_len: int,
        predicted: bool = False,
        contested: bool = False,
    ) -> None:
        """What lookup would have had kept, on a step that did not use its proposal (`match`,
        known before the step): as far as the step's `committed` tokens show, free evidence.
        Position i is known tried only where the first i - 1 agreed and the step committed an
        i-th token. It is the same evidence as a verify step's: lookup's drafts are certain
        (q = 1), so a draft is kept with the target's probability of it, which is the chance
        that the target's own token is it (at temperature 0: a draft is kept when it is).

        Without it, a match length whose first two tries failed was priced too low to be drafted
        again, and stayed so while the answer copied a paragraph a token a step under a match
        growing from 9 to 15 tokens: plain steps, each of which lookup would have got right."""
        seen = min(len(match), len(committed))
        agree = next((i for i in range(seen) if match[i] != committed[i]), seen)
        if seen:
            proposed = agree + 1 if agree < seen else seen
            table = self.acceptance(task, match_len, predicted=predicted, contested=contested)
            table["ngram"].record(proposed, agree)

    def _new(
        self, key: str, default: float, *, seed: bool = False, weight: float = PRIOR_WEIGHT
    ) -> Acceptance:
        """A new task's table for `key`, from what the pair measured on its other tasks.

        Position 1's prior: their kept/tried there, shrunk toward `default`, which weighs
        `weight` observations (all of it, before anything was measured). A fixed 0.6 kept a
        draft that agrees 95% of the time with its target from ever being tried on a new task
        once it lagged behind the prompt: it priced it below plain. With `seed`, positions 2
        and on are seeded with their counts there, scaled to SEED_WEIGHT observations at
        position 2.

        The draft model is seeded: how far it keeps agreeing with its target is much the same
        from task to task. Left to STRETCH from position 1 alone, a new task priced the demo
        draft, which kept 6 drafts in a row most of the time on every other task, at 1.05×
        plain caught up (it drafted at 1.4×), and its trial on an SQL answer came or did not
        by a few ms of catch-up noise. N-gram lookup is not: how long a match stays right is
        the task's own (a copied file, a repeating list), and seeded from those, extraction
        answers proposed 30 tokens at a 4-token match and kept 1 (0.77× forced n-gram)."""
        tries, kept = [0.0] * MAX_K, [0.0] * MAX_K
        for table in self.by_task.values():
            if key in table:
                tries = [a + b for a, b in zip(tries, table[key].tries, strict=True)]
                kept = [a + b for a, b in zip(kept, table[key].kept, strict=True)]
        prior = (kept[0] + default * weight) / (tries[0] + weight)
        if not (seed and tries[1] > 0):
            return Acceptance(prior=prior)
        scale = min(1.0, SEED_WEIGHT / tries[1])
        seed_tries = [0.0] + [x * scale for x in tries[1:]]
        seed_kept = [0.0] + [x * scale for x in kept[1:]]
        return Acceptance(prior=prior, seed_tries=seed_tries, seed_kept=seed_kept)

    @property
    def model_prior(self) -> float:
        """The draft model's acceptance at position 1 before any task measured it: its
        agreement with the target where that was measured at load, else PRIOR. A fixed 0.6
        priced the demo draft, which agrees 97% of the time, below plain on the first tasks it
        met, and had every new task try a draft that rarely agrees (a trial catches it up on
        the prompt first)."""
        if self.agreement is None:
            return PRIOR
        return min(AGREEMENT_MAX, max(AGREEMENT_MIN, self.agreement))

    @property
    def model_prior_weight(self) -> float:
        """The observations `model_prior` weighs: AGREEMENT_WEIGHT where it was measured."""
        return PRIOR_WEIGHT if self.agreement is None else AGREEMENT_WEIGHT

    def observe_answer(self, task: str | None, tokens: int, *, room: int, cut: bool) -> None:
        """A finished answer's length, and the room it had at its start (max_tokens within
        the context): what the task's next answers are read from (engine/lengths.py). An
        answer `cut` at max_tokens or the context's end would have run longer."""
        self.lengths.observe(task, tokens, room, cut=cut)

    def later_catch_up_ms(self, lag: int, cells: int | None = None) -> float:
        """What a catch-up on `lag` tokens costs the draft model beyond every step's own
        2-token re-decode (relag_ms, priced per step), by its cost curve (draft_curve), or
        by a copy of the target's `cells` tokens where that is cheaper (copy_ms)."""
        if lag <= RELAG:
            return 0.0
        curve = self.draft_curve()
        two, now = curve.at(2), curve.at(lag)
        if two is None or now is None:
            return 0.0
        copy, one = self.copy_ms(cells), curve.at(1)
        if copy is not None and one is not None:
            now = min(now, copy + one)
        return max(0.0, now - two)

    def copy_ms(self, cells: int | None) -> float | None:
        """What copying the target's cache of `cells` tokens into the draft model costs now
        (None: the draft model does not read the target's cache, or `cells` is not known)."""
        if self.copy_per_token is None or cells is None:
            return None
        return self.copy_per_token * cells

    def observe_copy(self, cells: int, ms: float) -> None:
        """One copy of the target's cache of `cells` tokens into the draft model took `ms`: the
        step's native work, like its decodes (not homespec's own work: observe_step), and a
        price per token for the next."""
        self.since_plain_ms += ms
        self.step_decodes_ms += ms
        if cells <= 0:
            return
        per = ms / cells
        old = self.copy_per_token
        self.copy_per_token = per if old is None else old + COPY_ALPHA * (per - old)

    def observe_upkeep(self, task: str | None, ms: float, tokens: int) -> None:
        """One answer's later catch-ups: the `ms` they cost (later_catch_up_ms of every
        catch-up after the draft model's first drafting in the answer, which was priced as it
        happened) over the `tokens` its steps committed. Kept as moving averages of both, so
        the task's upkeep (`upkeep_ms`) weighs answers by how much the draft model drafted.

        Where an answer keeps repeating itself, n-gram steps and hand-overs leave the draft
        model behind every step or two, and before each of its steps it catches up on a few
        tokens: priced only as they came, each spread over the whole answer still expected,
        they looked free, and a list answer ran 15% slower than by n-gram lookup alone. (Spread
        instead over the task's recent runs between catch-ups, the prompt's catch-up was priced
        over 80 tokens where the draft model then served 148: an e-mail answer, whose runs end
        because n-gram lookup is better for a while, ran 5% slower.) An answer in which the
        draft model did not draft fades the estimate (UPKEEP_FADE): a task once measured as
        costly tries it again after a few answers, as the governor re-tests what it is not
        using."""
        old = self.upkeep.get(task)
        if tokens <= 0:
            if old is None:
                return
            value = (old[0] * UPKEEP_FADE, old[1])
        else:
            value = _blend(old, (ms, float(tokens)))
        keep_recent(self.upkeep, task, value)

    def observe_lookup_share(self, task: str | None, by_lookup: int, tokens: int) -> None:
        """One answer's `tokens`, `by_lookup` of them committed by n-gram steps: kept as
        moving averages of both, so long answers weigh more (`lookup_share`)."""
        if tokens <= 0:
            return
        value = _blend(self.shares.get(task), (float(by_lookup), float(tokens)))
        keep_recent(self.shares, task, value)

    def lookup_share(self, task: str | None) -> float:
        """The share of the task's answer tokens n-gram lookup committed lately (0 unknown)."""
        by_lookup, tokens = self.shares.get(task, (0.0, 0.0))
        return by_lookup / tokens if tokens > 0 else 0.0

    def lookup_share_now(self, task: str | None, by_lookup: int, generated: int) -> float:
        """The share of what is still to come of an answer that lookup is expected to commit:
        the task's (lookup_share), weighing SHARE_PRIOR_TOKENS answer tokens, and this
        answer's own so far (`by_lookup` of its `generated` tokens).

        The table that task-less requests share mixes every client's answers: after a Makefile
        and an nginx block lookup had mostly copied, a story's opening was expected to be 65%
        lookup's, a catch-up on its 23-token prompt was spread over the 35% left and priced
        below plain, and the draft model, 1.46x plain forced on it, never drafted while the
        story ran 150 tokens without a lookup step (0.98x plain, fixed-cost replay)."""
        prior = self.lookup_share(task)
        weight = SHARE_PRIOR_TOKENS + max(0, generated)
        return (prior * SHARE_PRIOR_TOKENS + max(0, by_lookup)) / weight

    def upkeep_ms(self, task: str | None) -> float:
        """The task's later catch-ups, in ms per answer token the draft model commits."""
        ms, tokens = self.upkeep.get(task, (0.0, 0.0))
        return ms / tokens if tokens > 0 else 0.0

    def horizon(
        self, task: str | None, generated: int, room: int, lag: int = 0, cells: int | None = None
    ) -> int:
        """Answer tokens still expected, over which a draft model's catch-up may be spread,
        within the `room` left: how far the task's recent answers, read as this one's, ran
        past `generated` (Lengths.residual), and never less than half of what is generated.
        An answer that has outrun its task's answers is a longer kind (answer lengths are
        long-tailed): expecting nothing more of it turned a draft model that was drafting well
        off for the rest of it, as the 2-token catch-up after each of its steps was then
        priced into a single step.

        A task never seen is read from the pair's other tasks' answers (HORIZON_UNKNOWN
        tokens where it has seen none), but only once its answer has run UNKNOWN_WAIT: until
        then it may be a few-token one ("22", "Hello! How are you today?"), which the draft
        model's catch-up on the prompt made 25% slower than plain.
        Nor past halfway through the room the client left it (max_tokens): all that is known
        of such an answer is that it stops somewhere in there. (A rewrite of one sentence,
        asked with max_tokens 64, was expected to run 56 more tokens at its 8th; the draft
        model caught up on the prompt for a trial, and the answer ended at 23 tokens, 0.88×
        plain.)

        Nor, for any task, before the answer has run UNKNOWN_WAIT tokens where the draft model
        is `lag` tokens behind and catching up costs more than DEAR_CATCH_UP plain steps (0:
        the catch-up is priced into one step, and not made; `cells`: the tokens the target
        holds, which a copy of its cache would move, where the draft model reads it). A
        task's answers say little about the answer at hand where they differ: a daemon whose
        clients send no task keeps one table for all of them, and there a 6-token answer to a
        creative prompt, after 256-token ones, caught the draft model up on the 23 tokens of
        its prompt it did not share with the last chat first, and came at 0.47-0.66x plain in
        five runs (1.04x with this). A cheap catch-up (a GPU's, a few tokens', or a copy of
        the target's cache) goes ahead."""
        if generated < UNKNOWN_WAIT and self._dear(lag, cells):
            return 0
        known = self.lengths.known(task)
        if known or generated >= UNKNOWN_WAIT:
            left = self.lengths.residual(task, generated, generated + room)
            if left is None:
                left = HORIZON_UNKNOWN - generated
            if not known:
                left = min(left, room * UNKNOWN_ROOM_SHARE)
        else:
            left = 0.0
        left = max(left, generated / 2)
        return max(0, min(room, int(left)))

    def _dear(self, lag: int, cells: int | None = None) -> bool:
        """Catching the draft model up on `lag` tokens costs over DEAR_CATCH_UP plain steps
        (by its measured curve, else the target's scaled by a draft token's cost, or by a
        copy of the target's `cells` tokens where that is cheaper)."""
        if lag <= RELAG:
            return False
        verify, curve = self.verify_curve(), self.draft_curve()
        plain = verify.at(1)
        cost = catch_up_cost(lag, verify, self._draft_ms(curve), curve, self.copy_ms(cells))
        return plain is not None and cost > DEAR_CATCH_UP * plain

    @property
    def draft_ms(self) -> float | None:
        """One draft-model token's cost as last measured (None: never measured)."""
        return self.draft.at(1)

    def observe_draft(self, decodes: list[tuple[int, float]]) -> None:
        """The draft model's decodes of one proposal: (tokens in it, ms)."""
        for n, ms in decodes:
            self.draft.observe(n, ms)
            self.since_plain_ms += ms
            self.step_decodes_ms += ms
        if decodes:
            self.draft_ref = self.slowdown

    def observe_verify(self, n: int, ms: float) -> None:
        """One target decode of n tokens that took `ms`: the cost curve, and how fast the
        machine runs now against the calibration's quiet cost at that size (`slowdown`)."""
        self.verify.observe(n, ms)
        self.since_plain_ms = 0.0 if n == 1 else self.since_plain_ms + ms
        self.step_decodes_ms += ms
        quiet = self.quiet.at(n)
        if quiet:
            self.slowdown = (1 - SLOWDOWN_ALPHA) * self.slowdown + SLOWDOWN_ALPHA * ms / quiet
            self.verify_ref[n] = self.slowdown

    def observe_step(self, option: Option, wall_ms: float) -> None:
        """A governed step that ran `option` took `wall_ms` from its choice to its tokens'
        commit: what it cost beyond the decodes observed since `step_started` (the lookup,
        the governor, checking the drafts, detokenizing) goes into `overhead`. A millisecond
        on a GPU's 1.2 ms steps, unpriced, made drafting that kept one token in five look
        like a win there (see governor.step_ms)."""
        beyond = max(0.0, wall_ms - self.step_decodes_ms)
        old = self.overhead.get(option)
        self.overhead[option] = beyond if old is None else old + OVERHEAD_ALPHA * (beyond - old)

    def own_share(self) -> float:
        """A plain step's own work over a one-token decode (0: either not measured yet)."""
        one = self.verify.at(1)
        return self.overhead.get("none", 0.0) / one if one else 0.0

    def step_started(self) -> None:
        """A step begins: the decodes observed from here on are its own (observe_step)."""
        self.step_decodes_ms = 0.0

    def verify_curve(self) -> CostCurve:
        """The target's costs as they are likely now: each size as last measured, scaled by
        how far the machine's slowdown has moved since it was (like draft_curve). One-token
        decodes are measured at every plain step, long verifies only while drafts run long:
        measured beside a busy neighbour, the long sizes priced long drafts out after it had
        gone, and nothing measured them again."""
        # _drift's band, as bounds on `then`: every step, over up to MAX_K sizes
        low, high = self.slowdown / DRIFT_BAND, self.slowdown * DRIFT_BAND
        moved = {n: self.slowdown / t for n, t in self.verify_ref.items() if not low < t < high}
        if not moved:
            return self.verify
        points = {n: ms * moved.get(n, 1.0) for n, ms in self.verify.points.items()}
        return CostCurve(points, self.verify.slope)

    def draft_curve(self) -> CostCurve:
        """The draft model's costs as they are likely now: as last measured, scaled by how
        far the machine's slowdown has moved since (`slowdown` over `draft_ref`). The draft model's
        costs are measured only while it drafts, the target's at every step: measured while
        a neighbour held the CPU and never again, a draft model priced out then stayed priced
        out after the neighbour left, as nothing re-measured it (its re-tries wait for it to
        be nearly caught up, which an unused one never is)."""
        drift = self._drift(self.draft_ref)
        if drift == 1.0:
            return self.draft
        return CostCurve({n: ms * drift for n, ms in self.draft.points.items()}, self.draft.slope)

    def _drift(self, then: float | None) -> float:
        """What a cost measured at slowdown `then` is scaled by now: the slowdown's move since,
        or 1 within DRIFT_BAND (and where nothing was measured)."""
        drift = self.slowdown / then if then else 1.0
        return 1.0 if 1 / DRIFT_BAND < drift < DRIFT_BAND else drift

    def _draft_ms(self, curve: CostCurve) -> float:
        """A draft-model token's cost by `curve` (draft_curve), or a prior until it drafts once."""
        measured = curve.at(1)
        return measured if measured is not None else (self.verify.at(1) or 0.0) * DRAFT_COST_PRIOR

    def inputs(
        self,
        task: str | None,
        *,
        has_model: bool,
        match: int,
        max_k: int,
        model_lag: int = 0,
        match_len: int = 0,
        predicted: bool = False,
        contested: bool = False,
        horizon: int = 0,
        ngram_window: int = MAX_K,
        model_run: float = 0.0,
        plain_streak: int = 0,
        answer_lookup: tuple[int, int] = (0, 0),
        cells: int | None = None,
    ) -> Inputs:
        """One step's view for `choose()` (the task's draft-model upkeep and lookup's share
        of its answers included, with `answer_lookup`: the answer tokens lookup committed so
        far and all generated so far, see lookup_share_now; `model_run` and `plain_streak`:
        Inputs'; `cells`: the tokens the target holds, what a copy of its cache moves)."""
        curve = self.draft_curve() if has_model else None
        return Inputs(
            self.verify_curve(),
            self._draft_ms(curve) if curve is not None else None,
            self.ngram_ms,
            self.acceptance(task, match_len, predicted=predicted, contested=contested),
            match,
            max_k,
            self.steps,
            self.current,
            model_lag,
            dict(self.last_used),
            curve,
            horizon,
            self.upkeep_ms(task),
            self.lookup_share_now(task, *answer_lookup),
            task,
            self.agreement is not None,
            ngram_window,
            self.since_plain_ms,
            dict(self.overhead),
            model_run,
            plain_streak,
            self.copy_ms(cells) if has_model else None,
        )


def _blend(old: tuple[float, float] | None, new: tuple[float, float]) -> tuple[float, float]:
    """A per-answer pair of counts folded into its moving averages (`new` at first)."""
    if old is None:
        return new
    return (0.7 * old[0] + 0.3 * new[0], 0.7 * old[1] + 0.3 * new[1])
