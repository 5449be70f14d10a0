"""What the draft -> verify loop (engine/generate.py) runs on: one loaded pair's target context,
its drafters, what its governor has measured (engine/ledger.py) and the conversations it has put
aside.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from homespec.engine import cache_share
from homespec.engine.cache_share import NOT_PROBED, Sharing
from homespec.engine.catch_up import copy_pays
from homespec.engine.chat_text import prompt_tokens
from homespec.engine.drafters import Drafter, HybridDrafter, ModelDrafter, NgramDrafter
from homespec.engine.ledger import Ledger
from homespec.engine.neighbours import ThreadAdapter
from homespec.engine.prompt_cache import PromptCache
from homespec.engine.target import Target, shared_prefix
from homespec.engine.types import GenerationRequest
from homespec.manifest import PairSpec
from homespec.sizes import MiB

LOG = logging.getLogger("homespec.engine")


@dataclass
class PairRuntime:
    """What the loop runs on: the target's context and whatever drafters the pair has."""

    name: str
    spec: PairSpec
    target: Target
    draft: ModelDrafter | None
    ngram: NgramDrafter
    draft_unavailable_reason: str = ""
    plain_only_reason: str = ""  # the target cannot speculate at all (e.g. recurrent state)
    draft_failed: bool = False  # the draft model failed to load: the pair runs degraded
    ledger: Ledger = field(default_factory=Ledger)  # what the governor has measured
    threads: ThreadAdapter | None = None  # adapts llama.cpp's CPU threads to the neighbours
    # Whether the draft model catches up by copying the target's cache (calibration decides)
    sharing: Sharing = NOT_PROBED
    # Conversations put aside in RAM, the target's and the draft model's (prompt_cache.py),
    # within the pair's prompt_cache_mb each
    target_snapshots: PromptCache = field(init=False)
    draft_snapshots: PromptCache = field(init=False)
    # Warnings the log has had for this pair: said once, not at every request (each request's
    # stats still say theirs)
    warned: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.target_snapshots = PromptCache(self.spec.prompt_cache_mb * MiB)
        self.draft_snapshots = PromptCache(self.spec.prompt_cache_mb * MiB)

    def clear_caches(self) -> None:
        """Drop cached prompt prefixes, those put aside included (the bench starts each run
        from another chat with this)."""
        self.clear_contexts()
        self.target_snapshots.clear()
        self.draft_snapshots.clear()

    def clear_contexts(self) -> None:
        """Empty both contexts, the conversations put aside kept (a measurement's scratch text
        before a request: nothing to put aside)."""
        self.target.clear()
        if self.draft is not None:
            self.draft.ctx.clear()

    def recall(self, history: list[int]) -> int:
        """Before a request on `history`: each context's conversation put aside if it is about
        to be overwritten, and the one sharing most of `history` brought back. The target's
        tokens of `history` held now (its prompt tokens that need no evaluation)."""
        if self.draft is not None:  # priced as the target's copies and reads are
            self.draft_snapshots.recall(self.draft.ctx, history, self.target_snapshots.dear)
        return self.target_snapshots.recall(self.target, history).reused

    def prompt(self, req: GenerationRequest) -> tuple[list[int], str]:
        """The request's prompt tokens and how it was rendered (chat_text.prompt_tokens)."""
        allow = self.spec.allow_special_tokens
        return prompt_tokens(self.target, req, pair=self.name, allow_special=allow)

    def catch_up_by_copy(self, history: list[int], lag: int) -> bool:
        """The draft model, `lag` tokens behind `history`, catches up by copying the target's
        cache where the copy is priced below decoding what it spares (catch_up.copy_pays;
        engine/cache_share.py): whether it did. A copy that fails turns copying off for the
        pair, said once."""
        draft, ledger = self.draft, self.ledger
        if draft is None or ledger.copy_per_token is None:
            return False
        held = self.target.tokens
        if len(held) > draft.ctx.n_ctx:  # more than the draft's context holds: it decodes
            return False
        spared = shared_prefix(held, history) - (len(history) - lag)
        curve = ledger.draft_curve()
        cost = ledger.copy_ms(len(held))
        if not copy_pays(spared, ledger.verify_curve(), curve.at(1), curve, cost):
            return False
        ms = cache_share.timed_copy(self.target, draft.ctx)
        if ms is None:
            why = "decodes the history itself: a copy of the target's cache failed"
            self.sharing = Sharing(False, why)
            ledger.copy_per_token = None
            draft.catch_up = None
            LOG.warning("pair %s: the draft model %s", self.name, why)
            return False
        ledger.observe_copy(len(held), ms)
        return True

    def drafter(self, kind: str) -> Drafter:
        if kind == "ngram":
            return self.ngram
        assert self.draft is not None  # decide() only picks model drafters when one is loaded
        return self.draft if kind == "model" else HybridDrafter(self.draft, self.ngram)
