"""Conversations put aside: a context's cache copied to RAM when another conversation takes
the context, and copied back when the first one comes back.

A context holds one history. A daemon's clients take turns: a chat's next turn, a title or a
tag for it (Open WebUI asks for both after every answer), another user's chat. Each turn whose
history is not what the context holds re-reads its whole prompt: 4.3 s for a 1,500-token
conversation on the demo target here, where copying its cache aside took 4 ms and copying it
back 4 ms (35 MB, llama.cpp's `llama_state_seq_get_data`/`set_data`; the logits after a
restore are bit-identical to the ones the cache gave before). llama-server keeps conversations
in several slots of one cache for the same reason.

`plan()` is the decision, pure: whether the cache is worth keeping before it is overwritten,
and which kept snapshot, if any, holds more of the new history than the cache does.
`PromptCache` carries it out on a context, within a byte budget (`prompt_cache_mb` in
models.toml), least recently used first out, and never below RAM_FLOOR of available memory: a
memory-tight box keeps no snapshots rather than swapping for them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import psutil

from homespec.engine.target import shared_prefix
from homespec.sizes import GiB

# Fewer tokens than this are not worth a snapshot, nor a restore that gains fewer: a chat
# template's opening is shared by every conversation, and re-reading 64 tokens costs about
# one decode.
MIN_TOKENS = 64
# A snapshot is kept only while this much memory stays available beside it.
RAM_FLOOR = 1 * GiB


class Snapshotting(Protocol):
    """What a context offers for this: its tokens, a copy of its cache, and a way back."""

    @property
    def tokens(self) -> list[int]: ...

    def snapshot_size(self) -> int:
        """The bytes snapshot() would take now."""
        ...

    def snapshot(self) -> bytearray:
        """The cache as bytes (llama.cpp's sequence state)."""
        ...

    def restore(self, tokens: list[int], data: bytearray) -> None:
        """Make the cache hold `tokens` again, from what snapshot() gave when it held them."""
        ...


@dataclass
class Snapshot:
    tokens: list[int]
    data: bytearray


@dataclass(frozen=True)
class Plan:
    save: bool  # copy the cache aside before it is overwritten
    restore: int | None  # index of the snapshot to copy back, None: keep the cache
    reused: int  # tokens of the history the context holds afterwards


def plan(cached: list[int], history: list[int], kept: Sequence[list[int]]) -> Plan:
    """What to do before a request whose prompt is `history` runs on a context holding
    `cached`, given the token lists of the snapshots `kept`.

    Restore the snapshot sharing the longest prefix with `history`, when it shares at least
    MIN_TOKENS more than the cache does. Save the cache when the request would drop at least
    MIN_TOKENS of it (all of it, when a snapshot replaces it) and no snapshot already holds all
    of it (one restored and extended since is a longer copy, not this)."""
    limit = len(history) - 1  # the last position is decoded again anyway: its logits
    here = shared_prefix(cached, history, limit)
    shares = [shared_prefix(tokens, history, limit) for tokens in kept]
    # the longest, the most recent of equals
    best = max(reversed(range(len(kept))), key=shares.__getitem__, default=None)
    if best is not None and shares[best] < here + MIN_TOKENS:
        best = None
    dropped = len(cached) - (here if best is None else 0)
    held = any(shared_prefix(tokens, cached) == len(cached) for tokens in kept)
    reused = here if best is None else shares[best]
    return Plan(save=dropped >= MIN_TOKENS and not held, restore=best, reused=reused)


@dataclass(frozen=True)
class Recall:
    """What `PromptCache.recall` did, for the request's stats and log."""

    reused: int = 0  # tokens of the history the context holds now
    restored: int = 0  # of those, the ones a snapshot brought back
    saved: int = 0  # tokens of the cache put aside first


def _available() -> int:
    return int(psutil.virtual_memory().available)


def _take(ctx: Snapshotting) -> Snapshot:
    return Snapshot(list(ctx.tokens), ctx.snapshot())


class PromptCache:
    """A context's snapshots, most recently used last, `budget` bytes at most."""

    def __init__(self, budget: int, available: Callable[[], int] = _available) -> None:
        self.budget = budget
        self._available = available
        self.kept: list[Snapshot] = []

    @property
    def size(self) -> int:
        return sum(len(s.data) for s in self.kept)

    def recall(self, ctx: Snapshotting, history: list[int]) -> Recall:
        """Before `history` runs on `ctx`: put its cache aside if worth it, and bring back the
        snapshot holding most of `history` if that is more than the cache holds."""
        if self.budget <= 0:
            return Recall(reused=shared_prefix(ctx.tokens, history, len(history) - 1))
        p = plan(ctx.tokens, history, [s.tokens for s in self.kept])
        chosen = self.kept[p.restore] if p.restore is not None else None
        if chosen is not None:  # the most recently used: the save below must not evict it
            self.kept.remove(chosen)
            self.kept.append(chosen)
        saved = 0
        if p.save and self._room(ctx.snapshot_size(), ctx.tokens, chosen):
            self.kept.insert(len(self.kept) - (chosen is not None), _take(ctx))
            saved = len(ctx.tokens)
        if chosen is not None:
            ctx.restore(chosen.tokens, chosen.data)
        # what the context holds now, not what the plan meant it to (a restore can fail)
        reused = shared_prefix(ctx.tokens, history, len(history) - 1)
        return Recall(reused=reused, restored=reused if chosen else 0, saved=saved)

    def _room(self, size: int, tokens: list[int], chosen: Snapshot | None) -> bool:
        """Make room for a `size`-byte snapshot of `tokens`: drop the snapshots it extends,
        then the least recently used while the budget or RAM_FLOOR says so (never `chosen`,
        about to be restored). Whether it fits now."""
        self.kept = [s for s in self.kept if shared_prefix(s.tokens, tokens) < len(s.tokens)]

        def full() -> bool:
            return self.size + size > self.budget or self._available() - size < RAM_FLOOR

        if size > self.budget:
            return False
        while full() and (evictable := [s for s in self.kept if s is not chosen]):
            self.kept.remove(evictable[0])
        return not full()

    def clear(self) -> None:
        self.kept.clear()
