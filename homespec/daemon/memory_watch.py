"""The runtime memory watch: drop a pair's draft model when memory runs short, and bring it
back when memory has come back and stayed back. Pure: the daemon probes, this decides.

The plan checked memory before loading, but a homelab box changes under a running daemon:
other services grow, a backup job fills the page cache, a VM starts. When the memory free
where a draft lives falls below `min_free`, the daemon drops that draft (n-gram drafting keeps
some of the speed) before the kernel's OOM killer picks a process, which could be the engine
that holds the target. llama.cpp allocates a context's KV cache and compute buffers for the
whole `n_ctx` when the pair loads, so a long request costs no more memory than a short one:
there is nothing to refuse per request, and the draft is what can give memory back.

Hysteresis: the draft comes back only when the memory free would still be at least twice
`min_free` after loading it again, for CALM_SAMPLES samples in a row, so a box hovering at the
threshold does not load and drop a draft every few seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from homespec.engine.protocol import EngineInfo
from homespec.resources import RAM
from homespec.sizes import fmt_size

CALM_SAMPLES = 3  # samples in a row with room to spare before a dropped draft comes back
ROOM_FACTOR = 2  # … room meaning: at least this many times min_free left after re-loading

Action = Literal["keep", "drop", "attach"]


@dataclass(frozen=True)
class DraftWatch:
    """One pair's draft, as the watch sees it between samples."""

    dropped: bool = False  # by the watch (a draft that never loaded is not its business)
    calm: int = 0  # samples in a row with room to bring it back
    reason: str = ""  # why it was dropped, for /health, status and every request's reason


@dataclass(frozen=True)
class Verdict:
    action: Action
    watch: DraftWatch
    why: str  # for the log: what was measured and decided


def draft_site(info: EngineInfo) -> tuple[str, int]:
    """Where a pair's draft lives (its GPU, or RAM) and what it takes there: the plan's
    figure, or what was measured when it loaded where that is more."""
    a = info.plan.arrangement
    device = a.gpu if a.gpu is not None and a.draft_gpu_layers not in (None, 0) else RAM
    planned = sum(u.draft_weights + u.draft_kv for u in info.plan.devices if u.device == device)
    measured = [c.measured.get(device, 0) for c in info.memory if c.role == "draft"]
    return device, max([planned, *measured])


def decide(
    watch: DraftWatch,
    *,
    device: str,
    free: int,
    min_free: int,
    draft_bytes: int,
    draft_loaded: bool,
) -> Verdict:
    """One sample for one pair: `free` bytes free on `device` (where its draft lives, or
    would), `draft_bytes` what the draft takes there (planned), whether it is loaded now."""
    have = f"{fmt_size(free)} free in {device}"
    if watch.dropped and draft_loaded:  # back by another way (an engine restart loads it)
        watch = DraftWatch()
    if not watch.dropped:
        if draft_loaded and free < min_free:
            reason = f"memory: draft dropped ({have}, below min_free {fmt_size(min_free)})"
            return Verdict("drop", DraftWatch(True, 0, reason), reason)
        return Verdict("keep", watch, f"{have}")
    after = free - draft_bytes
    if after < min_free * ROOM_FACTOR:
        calm = DraftWatch(True, 0, watch.reason)
        need = fmt_size(min_free * ROOM_FACTOR + draft_bytes)
        return Verdict("keep", calm, f"{have}; the draft comes back at {need} free")
    calm = DraftWatch(True, watch.calm + 1, watch.reason)
    if calm.calm < CALM_SAMPLES:
        return Verdict("keep", calm, f"{have}; room for the draft {calm.calm}/{CALM_SAMPLES}")
    return Verdict("attach", DraftWatch(), f"{have}: the draft comes back")
