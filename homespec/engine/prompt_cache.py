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
and which kept snapshot, if any, holds more of the new history than the cache does, given what
a copied token costs against a read one, as measured (`PromptCache.dear`).
`PromptCache` carries it out on a context, within a byte budget (`prompt_cache_mb` in
models.toml), least recently used first out, and never below RAM_FLOOR of available memory
(under the cgroup limit, where the service has one): a memory-tight box keeps no snapshots
rather than swapping or being killed for them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

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
# What a copy costs is measured, not assumed (ms per token, moving averages): each cache times
# its own copies, and the loop tells the target's how long its prompt reads took (MIN_READ
# tokens or more; shorter ones are mostly fixed cost). On the 2-core CPU a copied token costs
# a thousandth of a read one. On one H100 the demo pair reads a few hundred tokens in a few
# ms, and copying its cache off the card and back cost more: chats taking turns ran 600 tok/s
# with 256 MiB of snapshots and 822 without, later turns' first token 20 ms against 13
# (issue 8's GPU run, scripts/conversations.py). So a restore must spare reading more than
# RESTORE_MARGIN x what it copies costs, and nothing is put aside while a copy costs over
# SAVE_SHARE of reading the same tokens: a snapshot, copied out and back, pays only where its
# conversation comes back more than dear / (1 - dear) of the time, 43% at 0.3 (a chat whose
# client asks for a title between turns comes back every turn; another user's, maybe never).
SAVE_SHARE = 0.3
RESTORE_MARGIN = 1.5
MIN_READ = 32
COST_ALPHA = 0.3

LOG = logging.getLogger("homespec.engine")


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


def plan(
    cached: list[int], history: list[int], kept: Sequence[list[int]], dear: float | None = None
) -> Plan:
    """What to do before a request whose prompt is `history` runs on a context holding
    `cached`, given the token lists of the snapshots `kept` and what copying a token costs
    over reading one (`dear`; None: not measured yet).

    Restore the snapshot sharing the longest prefix with `history`, when that spares reading
    enough of it (MIN_GAIN, RESTORE_RATIO, and RESTORE_MARGIN x what the copy costs). Save the
    cache when the request would drop at least MIN_TOKENS of it (all of it, when a snapshot
    replaces it), no snapshot already holds all of it (one restored and extended since is a
    longer copy, not this) and a copy costs at most SAVE_SHARE of reading."""
    here = _reusable(cached, history)
    shares = [_reusable(tokens, history) for tokens in kept]
    # the longest, the most recent of equals
    best = max(reversed(range(len(kept))), key=shares.__getitem__, default=None)
    if best is not None:
        gain, copied = shares[best] - here, len(kept[best])
        priced = copied * max(1 / RESTORE_RATIO, RESTORE_MARGIN * (dear or 0.0))
        if gain < MIN_GAIN or gain < priced:
            best = None
    dropped = len(cached) - (here if best is None else 0)
    held = any(shared_prefix(tokens, cached) == len(cached) for tokens in kept)
    reused = here if best is None else shares[best]
    save = dropped >= MIN_TOKENS and not held and puts_aside(dear)
    return Plan(save=save, restore=best, reused=reused)


def ratio(copy_ms: float | None, read_ms: float | None) -> float | None:
    """A copied token's cost over a read one's (None: either not measured yet)."""
    return copy_ms / read_ms if copy_ms is not None and read_ms else None


def puts_aside(dear: float | None) -> bool:
    """Whether conversations are copied aside at that ratio (SAVE_SHARE; unmeasured: yes)."""
    return dear is None or dear <= SAVE_SHARE


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
        self.copy_ms: float | None = None  # per token copied, this cache's snapshots and restores
        self.read_ms: float | None = None  # per token of its context's prompt reads
        self._said_dear = False

    @property
    def size(self) -> int:
        return sum(len(s.data) for s in self.kept)

    @property
    def dear(self) -> float | None:
        """What copying a token costs over reading one (None: either not measured yet)."""
        return ratio(self.copy_ms, self.read_ms)

    def observe_read(self, tokens: int, ms: float) -> None:
        """The context read `tokens` of a prompt in `ms` (ignored under MIN_READ tokens)."""
        if tokens >= MIN_READ:
            self.read_ms = _average(self.read_ms, ms / tokens)

    def _copied(self, tokens: int, t0: float) -> None:
        if tokens > 0:
            self.copy_ms = _average(self.copy_ms, (time.perf_counter() - t0) * 1000.0 / tokens)

    def recall(self, ctx: Target, history: list[int], dear: float | None = None) -> Recall:
        """Before `history` runs on `ctx`: put its cache aside if worth it, and bring back the
        snapshot holding most of `history` if that is more than the cache holds. `dear`: what
        a copy costs over a read, where this cache does not measure reads (a draft model's,
        priced as its target's); else its own."""
        chosen, saved = None, 0
        dear = self.dear if dear is None else dear
        if self.budget > 0:
            p = plan(ctx.tokens, history, [s.tokens for s in self.kept], dear)
            self._say(dear)
            if p.restore is not None:  # the most recently used: the save must not evict it
                chosen = self.kept.pop(p.restore)
                self.kept.append(chosen)
            if p.save and self._room(ctx.snapshot_size(), ctx.tokens, chosen):
                t0 = time.perf_counter()
                snap = Snapshot(list(ctx.tokens), ctx.snapshot())
                if snap.data:  # empty: the context could not copy it
                    self._copied(len(snap.tokens), t0)
                    self.kept.insert(len(self.kept) - (chosen is not None), snap)
                    saved = len(snap.tokens)
            if chosen is not None:
                t0 = time.perf_counter()
                ctx.restore(chosen.tokens, chosen.data)
                self._copied(len(chosen.tokens), t0)
        # what the context holds now, not what the plan meant it to (a restore can fail)
        reused = _reusable(ctx.tokens, history)
        return Recall(reused=reused, restored=reused if chosen else 0, saved=saved)

    def _say(self, dear: float | None) -> None:
        """Log when copies turn out too dear to put conversations aside, and when not again."""
        now = not puts_aside(dear)
        if now != self._said_dear:
            self._said_dear = now
            LOG.info(
                "prompt cache: a copied token costs %.2f× a read one: conversations %s",
                dear or 0.0,
                "are read again instead of put aside" if now else "are put aside again",
            )

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


def _average(old: float | None, new: float) -> float:
    return new if old is None else old + COST_ALPHA * (new - old)


def cache_report(copy_ms: float | None, read_ms: float | None) -> dict[str, Any]:
    """What status shows of a target's prompt cache (JSON): its measured costs per token, their
    ratio, and whether conversations are put aside at that ratio (SAVE_SHARE)."""
    dear = ratio(copy_ms, read_ms)
    return {
        "copy_ms_per_token": None if copy_ms is None else round(copy_ms, 4),
        "read_ms_per_token": None if read_ms is None else round(read_ms, 4),
        "copy_over_read": None if dear is None else round(dear, 4),
        "puts_aside": puts_aside(dear),
    }
