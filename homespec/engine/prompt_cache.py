"""Conversations put aside: a context's cache copied to RAM when another conversation takes
the context, and copied back when the first one comes back.

A context holds one history. A daemon's clients take turns: a chat's next turn, a title or a
tag for it (Open WebUI asks for both after every answer), another user's chat. Each turn whose
history is not what the context holds re-reads its whole prompt: 4.3 s for a 1,500-token
conversation on the demo target here, where copying its cache aside took 4 ms and copying it
back 4 ms (35 MB, llama.cpp's `llama_state_seq_get_data`/`set_data`; the logits after a
restore are bit-identical to the ones the cache gave before). llama-server does the same by
default (`--cache-ram`, 8 GiB of host memory).

`plan()` is the decision, pure: whether the cache is worth keeping before it is overwritten,
and which kept snapshot, if any, holds more of the new history than the cache does.
`PromptCache` carries it out on a context, within a byte budget (`prompt_cache_mb` in
models.toml), least recently used first out, and never below RAM_FLOOR of available memory
(under the cgroup limit, where the service has one): a memory-tight box keeps no snapshots
rather than swapping or being killed for them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from homespec.engine.target import Target, shared_prefix
from homespec.resources import probe_ram
from homespec.sizes import GiB

# A cache that a request would drop fewer tokens of is not worth a snapshot (a verify step
# drops its rejected drafts, up to 63).
MIN_TOKENS = 64
# A restore must spare reading at least MIN_GAIN tokens, and at least one for every
# RESTORE_RATIO it copies back: a copy costs per token restored, reading per token read, and
# reading costs more. Per token, a copy moved 23 KB at about 10 GB/s here where reading took
# 3 ms (1,000×); an 8B model on a GPU reads about 5,000 tokens a second where a host-to-card
# copy of its 128 KB per token takes 13 µs (15×). So a persona's shared system prompt (48
# tokens beyond the template's opening) is worth bringing back from a 160-token chat; a
# 1,500-token conversation is not brought back for 48 tokens of it.
MIN_GAIN = 16
RESTORE_RATIO = 16
# A snapshot is kept only while this much memory stays available beside it.
RAM_FLOOR = 1 * GiB


@dataclass
class Snapshot:
    tokens: list[int]
    data: bytearray


@dataclass(frozen=True)
class Plan:
    save: bool  # copy the cache aside before it is overwritten
    restore: int | None  # index of the snapshot to copy back, None: keep the cache
    reused: int  # tokens of the history the context holds afterwards


def _reusable(tokens: list[int], history: list[int]) -> int:
    """Tokens of `history` that a cache holding `tokens` spares reading: their common prefix,
    but for the history's last position, decoded again anyway for its logits."""
    return shared_prefix(tokens, history, max(0, len(history) - 1))


def plan(cached: list[int], history: list[int], kept: Sequence[list[int]]) -> Plan:
    """What to do before a request whose prompt is `history` runs on a context holding
    `cached`, given the token lists of the snapshots `kept`.

    Restore the snapshot sharing the longest prefix with `history`, when that spares reading
    enough of it (MIN_GAIN, RESTORE_RATIO). Save the cache when the request would drop at least
    MIN_TOKENS of it (all of it, when a snapshot replaces it) and no snapshot already holds all
    of it (one restored and extended since is a longer copy, not this)."""
    here = _reusable(cached, history)
    shares = [_reusable(tokens, history) for tokens in kept]
    # the longest, the most recent of equals
    best = max(reversed(range(len(kept))), key=shares.__getitem__, default=None)
    if best is not None:
        gain = shares[best] - here
        if gain < MIN_GAIN or gain * RESTORE_RATIO < len(kept[best]):
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
    """What a new allocation can take: available RAM, or less under the service's cgroup
    limit (systemd MemoryMax=), which the kernel enforces by killing the engine."""
    return probe_ram().free


class PromptCache:
    """A context's snapshots, most recently used last, `budget` bytes at most."""

    def __init__(self, budget: int, available: Callable[[], int] = _available) -> None:
        self.budget = budget
        self._available = available
        self.kept: list[Snapshot] = []

    @property
    def size(self) -> int:
        return sum(len(s.data) for s in self.kept)

    def recall(self, ctx: Target, history: list[int]) -> Recall:
        """Before `history` runs on `ctx`: put its cache aside if worth it, and bring back the
        snapshot holding most of `history` if that is more than the cache holds."""
        chosen, saved = None, 0
        if self.budget > 0:
            p = plan(ctx.tokens, history, [s.tokens for s in self.kept])
            if p.restore is not None:  # the most recently used: the save must not evict it
                chosen = self.kept.pop(p.restore)
                self.kept.append(chosen)
            if p.save and self._room(ctx.snapshot_size(), ctx.tokens, chosen):
                snap = Snapshot(list(ctx.tokens), ctx.snapshot())
                if snap.data:  # empty: the context could not copy it
                    self.kept.insert(len(self.kept) - (chosen is not None), snap)
                    saved = len(snap.tokens)
            if chosen is not None:
                ctx.restore(chosen.tokens, chosen.data)
        # what the context holds now, not what the plan meant it to (a restore can fail)
        reused = _reusable(ctx.tokens, history)
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
