"""The messages between the daemon and a pair's engine child (pickled over a socket pair).

The daemon sends `Load` once, then `Generate`, `Cancel`, `CountPrompt`, `AttachDraft`,
`DetachDraft` and `Stop`; the child answers `Loaded` (or `LoadFailed`), then per request
`Steps` (one per verify step, or per `Generate.batch_s`) and a final `Finished` (with the
chunks still held), and `Counted` / `DraftAttached` / `DraftDetached` as asked (before
`DraftAttached`, `DraftHandedOver` as requests start to draft with it; `Remeasured` when
the engine measured its costs again on its own). Both sides
are homespec of the same version, started together: pickle is the framing, not a public
format.

No llama_cpp here: the daemon imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from homespec.engine.pages import Settled
from homespec.engine.repack import Verdict
from homespec.engine.types import Chunk, GenerationRequest, GenerationStats
from homespec.manifest import Manifest
from homespec.plan_types import PairPlan
from homespec.resources import Machine
from homespec.vocab import PairMode

# --- daemon → child -------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    manifest: Manifest
    pair: str
    # What to plan on: the daemon's first probe less what the other pairs hold. None: the
    # child probes (the daemon's first pair; the daemon itself never loads llama.cpp).
    machine: Machine | None
    without_draft: str = ""  # non-empty: load no draft model, for this reason
    learned_file: str = ""  # the governor's acceptance across restarts (engine/learned.py)


@dataclass(frozen=True)
class AttachDraft:
    """Load the draft now (the daemon sends this once its queue is quiet)."""


@dataclass(frozen=True)
class DetachDraft:
    """Free the draft model between requests (memory ran short); requests then say `reason`."""

    reason: str


@dataclass(frozen=True)
class Generate:
    rid: str
    req: GenerationRequest
    # Seconds between two `Steps`: steps' chunks wait and travel together until this much has
    # passed since the last send (or since the start, for the first, unless `first_at_once`:
    # a stream's first token goes as soon as it is out), and the rest rides on `Finished`.
    # 0: one `Steps` per step. Each message wakes the daemon, whose Python then runs on a
    # core the decoding threads need.
    batch_s: float = 0.0
    first_at_once: bool = True


@dataclass(frozen=True)
class Cancel:
    rid: str


@dataclass(frozen=True)
class CountPrompt:
    qid: int
    req: GenerationRequest


@dataclass(frozen=True)
class Stop:
    """Finish the running request, free the models, exit 0."""


# --- child → daemon -------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelCheck:
    """One loaded model: predicted vs measured memory right after loading, per device."""

    role: str
    predicted: dict[str, int]
    measured: dict[str, int]


@dataclass(frozen=True)
class EngineInfo:
    """What the daemon shows about a loaded pair (status, /health)."""

    pid: int
    plan: PairPlan
    n_ctx: int
    target_file: str
    draft_file: str | None
    draft_loaded: bool
    draft_unavailable_reason: str
    plain_only_reason: str
    mode: PairMode  # what the pair does now, and why (engine/policy.serving_mode)
    reason: str
    degraded: bool  # not as declared: the plan fell back, or the draft failed to load
    memory: list[ModelCheck] = field(default_factory=list)
    repack: dict[str, Verdict] = field(default_factory=dict)  # by role
    load_ms: dict[str, float] = field(default_factory=dict)
    pages: dict[str, Settled] = field(default_factory=dict)  # huge pages, by role, once settled
    # The governor's measured costs when this was sent: ms of one target decode by tokens in
    # it, and of one draft-model decode by tokens in it.
    verify_ms: dict[int, float] = field(default_factory=dict)
    draft_ms: dict[int, float] = field(default_factory=dict)
    agreement: float | None = None  # the draft model's with the target, measured at load
    # How the draft model catches up, and why (PairRuntime.sharing, engine/cache_share.py),
    # and ms per token a copy of the target's cache moves where it copies (Ledger)
    catch_up: str = ""
    copy_per_token: float | None = None
    step_ms: dict[str, float] = field(default_factory=dict)  # see Costs
    copy_ms: float | None = None  # see Costs
    read_ms: float | None = None
    prompt_note: str = ""  # the target's chat template is not rendered as written, and why


@dataclass(frozen=True)
class Costs:
    """The governor's costs as it prices them after a request (they move with every step):
    ms of one target decode and of one draft-model decode by tokens in it, at the sizes
    calibration measures, ms a step costs beyond its decodes, by what it ran ("plain",
    "n-gram", "draft model"), and what the target's prompt cache measured a token's copy
    and a prompt token's read to cost (None: not yet; engine/prompt_cache.py); how the draft
    model catches up now (EngineInfo's, which a failed copy of the target's cache changes).
    The daemon's status shows the latest."""

    verify_ms: dict[int, float]
    draft_ms: dict[int, float]
    step_ms: dict[str, float]
    copy_ms: float | None = None
    read_ms: float | None = None
    catch_up: str = ""
    copy_per_token: float | None = None


@dataclass(frozen=True)
class Loaded:
    info: EngineInfo
    probed: Machine | None  # the machine the child probed, when Load.machine was None


@dataclass(frozen=True)
class Failure:
    """A HomespecError (or a bug) as it crosses the process boundary."""

    kind: str  # the exception class name: RequestError, OutOfMemoryError, EngineError…
    what: str
    hint: str = ""

    def __str__(self) -> str:
        return f"{self.what} — {self.hint}" if self.hint else self.what


@dataclass(frozen=True)
class LoadFailed:
    failure: Failure


@dataclass(frozen=True)
class DraftHandedOver:
    """The draft model serves requests from now on: the engine still measures the costs
    (DraftAttached follows once it has), but /health and status say what requests get."""

    info: EngineInfo


@dataclass(frozen=True)
class DraftAttached:
    info: EngineInfo
    failure: Failure | None = None  # the draft failed to load: n-gram drafting only


@dataclass(frozen=True)
class DraftDetached:
    info: EngineInfo


@dataclass(frozen=True)
class Remeasured:
    """The engine measured its costs again (see Ledger.calibrated_busy)."""

    info: EngineInfo


@dataclass(frozen=True)
class Steps:
    rid: str
    chunks: list[Chunk]


@dataclass(frozen=True)
class Finished:
    rid: str
    stats: GenerationStats | None  # None when cancelled or failed
    failure: Failure | None = None
    cancelled: bool = False
    chunks: list[Chunk] = field(default_factory=list)  # the last ones, not yet sent in `Steps`
    costs: Costs | None = None  # after a request that ran
    # ms the request waited in the engine before it started (a piece of a measurement of the
    # governor's costs, a draft model handed over): part of its queue_ms, ttft and e2e
    waited_ms: float = 0.0


@dataclass(frozen=True)
class Counted:
    """The prompt fits the context and renders (no failure), or why not: what generating
    it would raise first."""

    qid: int
    failure: Failure | None = None
