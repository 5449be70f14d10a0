"""The governor's data (engine/governor.py decides from them): the options a step can take,
what one step's choice is made from (`Inputs`, which Ledger.inputs() gathers) and what it
chose (`Choice`, with its estimate and the reason a response shows)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from homespec.engine.estimates import MAX_K, Acceptance, CostCurve

Option = Literal["none", "ngram", "model"]
OPTION_NAMES: dict[str, str] = {"none": "plain", "ngram": "n-gram", "model": "draft model"}


@dataclass(frozen=True)
class Estimate:
    option: Option
    k: int
    tokens_per_ms: float
    first_rate: float  # estimated acceptance at position 1 (0 for no drafting)


@dataclass(frozen=True)
class Choice:
    option: Option
    k: int
    speedup: float  # estimated throughput over plain decoding's
    reason: str
    rival: float = 0.0  # the best option not chosen, its estimate over plain (0: none could run)
    # The acceptance table lookup was priced from at this choice (estimates.table_key; "": no
    # match to price): a plain choice stands for a match from the same one (settled)
    lookup: str = ""
    stands: int = 0  # steps after its asking that it may stand without asking again (stand_for)


@dataclass
class Inputs:
    """What one step's choice is made from."""

    verify: CostCurve
    draft_ms: float | None  # per drafted token with the draft model; None: no draft model
    ngram_ms: float  # one lookup
    acceptance: dict[Option, Acceptance]
    ngram_match: int  # tokens the n-gram lookup can propose this step (0: no match)
    max_k: int  # room left, and what one decode may return logits for
    step: int  # steps this pair has run (for exploration)
    current: Option  # what the last step chose (for hysteresis)
    model_lag: int = 0  # history tokens the draft model has not decoded yet (catch-up first)
    last_used: dict[Option, int] = field(default_factory=dict)  # step each option last ran
    draft_curve: CostCurve | None = None  # the draft model's decode cost by tokens in it
    # Answer tokens still expected (0: unknown): a draft model's catch-up is paid once and
    # serves every step after it, so it is spread over these (see best_k).
    horizon: int = 0
    # What the draft model's later catch-ups cost on this task lately, in ms per answer token
    # its steps committed (Ledger.observe_upkeep): n-gram steps and hand-overs leave it behind
    # again, and each time it catches up once more. A cost of every token it drafts.
    upkeep: float = 0.0
    # The share of the task's answer tokens n-gram steps committed lately (0: unknown): the
    # draft model serves the rest, and a catch-up is spread over that part of the horizon.
    lookup_share: float = 0.0
    task: str | None = None  # the request's task, for the reasons (None: it named none)
    agreement_measured: bool = False  # the draft model's prior is its measured agreement
    ngram_window: int = MAX_K  # this answer's cap on a lookup proposal (next_window)
    since_plain_ms: float = 0.0  # ms of decoding since a plain step last measured plain's cost
    # ms a step costs beyond its decodes, by what it ran (Ledger.overhead; see step_ms)
    overhead: dict[Option, float] = field(default_factory=dict)
    # In this answer: answer tokens the draft model's steps committed per catch-up after its
    # first drafting (0: none yet), and those plain steps committed since either drafter last
    # ran. A later catch-up is spread over no more than the larger (best_k).
    model_run: float = 0.0
    plain_streak: int = 0
    # ms to catch the draft model up by copying the target's cache now, whatever its lag (None:
    # it does not read the target's cache; engine/cache_share.py)
    copy_ms: float | None = None
