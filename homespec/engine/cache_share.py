"""A draft model that reads the target's cache: catching up by a copy instead of a decode.

Before the draft model drafts, it must have read the whole history: the prompt, and whatever
n-gram or plain steps committed since it last drafted. That catch-up is one batched decode of
the tokens it missed, and on a CPU it is the draft's dearest moment: the demo Q4_1 draft read
a 325-token prompt in 1.0-1.3 s here, more than the F32 target took (llama.cpp has no fast
kernel for Q4_1), so the governor rarely let the draft model start on a new task's prompt.

Where the draft is the target's own model at another quantization (the partner a user with a
single model makes, and the demo pair), its cache has the target's shape (layers, heads, key
and value types), and the target has already computed every history token's keys and values,
from the better weights. llama.cpp copies one sequence's cache out of a context and into
another (`llama_state_seq_get_data`/`set_data`, as the prompt cache's snapshots do, and it
checks layer count, types and row sizes, refusing a cache of another shape): the same 325
tokens in about 6 ms. The draft then drafts from its own weights on the target's keys and
values; the answer is the target's either way (every draft is verified).

Whether a pair does this is measured when it is calibrated (calibration.probe_sharing): the two
models' caches must have the same shape (`cache_shape`), a copy must succeed, and the draft
model must predict the target's next token, reading the target's cache, at least as often as
reading its own, less SHARE_MARGIN (`decide`). A model of the same shape that is not the
target's (another fine-tune of the same base) reads keys and values it was not trained on: that
check is there for it (not tried: no such model was at hand). Then the draft model catches up
by copy wherever a copy is priced below the decode it spares (`catch_up.copy_pays`: a copy
costs per token the target holds, a decode per token the draft lacks;
PairRuntime.catch_up_by_copy makes it), and the governor prices a catch-up the cheaper way
(`catch_up.catch_up_cost`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from homespec.engine.target import Target

# Agreement reading the target's cache may fall this far below agreement reading its own. The
# calibration compares 32 next tokens, and the demo pair's two readings differ there by one
# either way (0.97 own, 0.94 shared in one calibration; over the shipped workload's answers,
# 416 positions, 0.971 own and 0.983 shared): a tenth is three of the 32. (A same-shaped
# model that is not the target's has not been tried here: none was at hand.)
SHARE_MARGIN = 0.1


@dataclass(frozen=True)
class Sharing:
    """Whether the draft model catches up by copying the target's cache, and why; what the
    probe's copy cost, in ms per token the target held (None where nothing was copied)."""

    on: bool
    why: str
    copy_ms_per_token: float | None = None


NOT_PROBED = Sharing(False, "")


def copy(target: Target, draft: Target) -> bool:
    """Make `draft`'s cache hold what `target`'s holds, copied (False where llama.cpp would
    not take it: the draft's cache is left empty then, and its next decode reads the history)."""
    data = target.snapshot()
    return bool(data) and draft.restore(target.tokens, data)  # (restore copies the list)


def timed_copy(target: Target, draft: Target) -> float | None:
    """copy(), and the ms it took (None: it failed)."""
    t0 = time.perf_counter()
    done = copy(target, draft)
    return (time.perf_counter() - t0) * 1000.0 if done else None


def decide(
    same_shape: bool, copied: bool, own: float | None, shared: float | None
) -> tuple[bool, str]:
    """Whether the draft model reads the target's cache: the two caches' shapes, whether a
    copy took, and the draft's agreement with the target reading its own cache and the
    target's (None: not measured)."""
    if not same_shape:
        return False, "decodes the history itself: its cache is not shaped like the target's"
    if not copied:
        return False, "decodes the history itself: llama.cpp would not copy the target's cache"
    if own is None or shared is None:
        return False, "decodes the history itself: its agreement could not be measured"
    both = f"agrees on {shared:.0%} of next tokens reading it, {own:.0%} reading its own"
    if shared < own - SHARE_MARGIN:
        return False, f"decodes the history itself: the target's cache misleads it ({both})"
    return True, f"catches up by copying the target's cache ({both})"
