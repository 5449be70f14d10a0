"""Whether llama.cpp's flash attention pays on this CPU for this model: measured, remembered.

llama.cpp turns flash attention on by default, and how fast its CPU kernel is depends on the
processor:
- where homespec was first built, decoding SmolLM2 F32 at 800 tokens of context took 50 ms a
  token with it and 28 ms without, and a 2-core AMD EPYC verified 32 tokens at 500 tokens of
  context at 405 tokens/s with it against 607 without;
- on another 2-core AMD EPYC (AVX-512, 2026-11-25) it was as fast or faster at every size and
  depth llama-bench tried, and the shipped workload ran faster with it: plain decoding 1.05×,
  `auto` 1.10×, first tokens 10-23% sooner (scripts/flash_ab.py: both ways in one process).

No fixed setting is right on both, and the same kernel is faster at one size and slower at
another (on that EPYC, at 384 tokens of context: as fast for one token, 9% slower for 8,
23% slower for 32, but 15% faster on a prompt), so for a pair on the CPU only,
`flash_attn = "auto"` asks the machine how long a request takes each way. In a scratch
context with flash attention and in one without, the target evaluates a PROMPT-token prompt
and, at DEPTH tokens of context, decodes one token and verifies eight (the faster of two tries
each); a request is priced as that prompt plus an answer of PLAIN_STEPS one-token steps and
VERIFY_STEPS eight-token verifies (the shipped workload's shape: a few hundred tokens of
prompt, a hundred-odd of answer, about half of it drafted), and flash attention is used when
its request takes at most (1 - MARGIN) of the time. Where one-token decodes slowed as the
context grew, the answer's steps outweigh any prompt it saves. About three seconds, once per
llama.cpp build, CPU and model file: the verdict is remembered beside the canary's
(flash.json in the cache dir). The draft model follows the target's verdict.
`flash_attn = "on" | "off"` in models.toml skips all of it.

Without flash attention, llama.cpp writes each decode's attention scores out in full (tokens
in the decode × cells of context, padded to 256, × heads), and on a long prompt those stop
fitting the CPU's caches: on the 2-core Xeon, SmolLM2's 799-token prompt took 1.9-2.1 s in a
context that decodes 512 tokens at once and 1.5-1.7 s in one that decodes 128 or 64 (the two
within this box's noise of each other; 0.37 s at every size for a 256-token prompt), where
llama-server, with flash attention, took 1.27 s; verifies of 32-63 tokens came up to 12%
quicker there, one-token decodes level. A smaller batch reads the weights more often, which a
big model feels more, and caps a verify at what one decode holds (63 drafts at 64), so where
flash attention stays off the verdict also times a LONG-token prompt in a scratch context of
each BATCHES size and keeps the fastest (the full batch unless another is MARGIN faster):
about seven seconds more on the demo pair, once; skipped where the 256-token prompt alone took
over BATCH_CAP_MS (a model that slow would spend a minute on it, and its weights, not its
scores, set a prompt's pace). The pair's contexts, the draft's too, then decode at most that
many tokens at once, and the memory plan counts scores for that many.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from homespec.engine import repack
from homespec.engine.neighbours import CpuMeter, wait_for_quiet
from homespec.footprint import N_UBATCH
from homespec.paths import cache_dir

if TYPE_CHECKING:  # numpy's: this module is read by the planner before llama.cpp loads
    from typing import Protocol

    from homespec.engine.target import Target

    class Scratch(Target, Protocol):
        """A context made for the measurement alone, freed after it."""

        def close(self) -> None: ...

    class Meter(Protocol):
        """What other processes took (cores) from resume() to others() (CpuMeter)."""

        def resume(self) -> None: ...

        def others(self) -> float | None: ...


LOG = logging.getLogger("homespec.engine")
PROMPT = 256  # tokens of the scratch prompt
DEPTH = 384  # tokens of context under the answer's steps
PLAIN_STEPS, VERIFY_STEPS = 64, 8  # a request's answer: one-token steps and 8-token verifies
MARGIN = 0.03
FULL_BATCH = N_UBATCH  # tokens a context decodes at once unless measured otherwise
LONG = 800  # tokens of the prompt the batch sizes are timed on (past 768: 1,024 cells of scores)
BATCHES = (FULL_BATCH, 128, 64)
BATCH_CAP_MS = 800.0
CACHE_NAME = "flash.json"  # in the cache dir, beside the canary's
# Other processes may take this many cores while the verdict is timed (as calibration allows),
# waited for at most QUIET_WAIT_S first; a verdict timed busier is provisional (verdict()).
QUIET = 0.5
QUIET_WAIT_S = 5.0
CACHE_PREFIX = "flash|"

Costs = dict[str, float]  # ms: "prompt", "decode" (one token), "verify" (eight)


@dataclass(frozen=True)
class FlashVerdict:
    on: bool
    source: str  # "measured" or "remembered"
    why: str
    n_batch: int = FULL_BATCH  # the most tokens one decode holds
    batch_why: str = ""
    busy: float | None = None  # cores other processes took while it was timed, QUIET or more


def request_ms(c: Costs) -> float:
    return c["prompt"] + PLAIN_STEPS * c["decode"] + VERIFY_STEPS * c["verify"]


def decide(off: Costs, on: Costs) -> tuple[bool, str]:
    """Flash attention or not, from the same costs measured both ways."""
    ratio = request_ms(on) / request_ms(off)
    parts = ", ".join(f"{k} {on[k] / off[k]:.2f}×" for k in ("prompt", "decode", "verify"))
    said = f"with it a request took {ratio:.2f}× its time without ({parts})"
    if ratio <= 1 - MARGIN:
        return True, f"flash attention on: {said}"
    return False, f"flash attention off: {said}"


def decide_batch(ms: dict[int, float]) -> tuple[int, str]:
    """The batch size to use, from a LONG-token prompt's time (ms) in contexts of each size."""
    full = ms[FULL_BATCH]
    best = min(ms, key=lambda b: (ms[b], -b))  # a tie goes to the bigger batch
    tried = ", ".join(f"{b}: {ms[b]:.0f} ms" for b in sorted(ms, reverse=True))
    if best != FULL_BATCH and ms[best] <= (1 - MARGIN) * full:
        return best, (
            f"{best}-token batches: a prompt of {LONG} tokens took {ms[best] / full:.2f}× the time "
            f"of {FULL_BATCH}-token ones ({tried})"
        )
    return FULL_BATCH, f"{FULL_BATCH}-token batches: no smaller one was faster ({tried})"


def measure_batches(make: Callable[[bool, int], Scratch], filler: list[int]) -> dict[int, float]:
    """A LONG-token prompt's time (ms) in a scratch context of each BATCHES size (flash
    attention off); the fastest two timed again (the fastest of two tries: a neighbour's burst
    only ever slows one down)."""

    def once(n_batch: int) -> float:
        ctx = make(False, n_batch)
        try:
            ctx.extend(filler * 8, 1)  # a throwaway decode: threads and buffers settle first
            ctx.clear()
            t0 = time.perf_counter()
            ctx.extend(filler * LONG, 1)
            return (time.perf_counter() - t0) * 1000.0
        finally:
            ctx.close()

    ms = {n_batch: once(n_batch) for n_batch in BATCHES}
    for n_batch in sorted(ms, key=ms.__getitem__)[:2]:
        ms[n_batch] = min(ms[n_batch], once(n_batch))
    return ms


def batch_verdict(
    make: Callable[[bool, int], Scratch], filler: list[int], off: Costs
) -> tuple[int, str]:
    """The batch size where flash attention stays off: timed, unless the model is so slow that
    timing it would take long and tell little (BATCH_CAP_MS)."""
    if off["prompt"] > BATCH_CAP_MS:
        return FULL_BATCH, (
            f"{FULL_BATCH}-token batches: not timed (a {PROMPT}-token prompt took "
            f"{off['prompt']:.0f} ms, over {BATCH_CAP_MS:.0f})"
        )
    return decide_batch(measure_batches(make, filler))


def measure(make: Callable[[bool, int], Scratch], filler: list[int]) -> dict[bool, Costs]:
    """The costs both ways, each in a scratch context made by `make(flash, FULL_BATCH)` (closed
    after)."""
    from homespec.engine.calibration import decode_costs  # numpy: only when measuring

    out: dict[bool, Costs] = {}
    for flash in (False, True):
        ctx = make(flash, FULL_BATCH)
        try:
            prompt = decode_costs(ctx, filler, filler, (PROMPT,), False)
            steps = decode_costs(ctx, filler * DEPTH, filler, (1, 8), True)
            out[flash] = {"prompt": prompt[PROMPT], "decode": steps[1], "verify": steps[8]}
        finally:
            ctx.close()
    return out


def _key(path: Path) -> str:
    return CACHE_PREFIX + repack.cache_key(path, 0)


def _known(path: Path, cache_file: Path) -> FlashVerdict | None:
    entry = repack.read_cache(cache_file).get(_key(path)) or {}
    on, n_batch = entry.get("on"), entry.get("n_batch")
    if not isinstance(on, bool) or n_batch not in BATCHES:
        return None  # (an entry from before batch sizes were timed is measured again)
    assert isinstance(n_batch, int)
    why, batch_why = str(entry.get("why", "")), str(entry.get("batch_why", ""))
    busy = entry.get("busy")
    busy = float(busy) if isinstance(busy, int | float) else None
    return FlashVerdict(on, "remembered", why, n_batch, batch_why, busy)


def remembered(path: Path, *, cache_file: Path | None = None) -> bool | None:
    """The verdict this machine remembers for the model file at `path` (None: none yet)."""
    try:
        entry = repack.read_cache(cache_file or cache_dir() / CACHE_NAME).get(_key(path)) or {}
    except OSError:  # no such file (yet): nothing to remember
        return None
    on = entry.get("on")  # (an entry from before batch sizes were timed says this too)
    return on if isinstance(on, bool) else None


def remembered_verdict(path: Path, *, cache_file: Path | None = None) -> FlashVerdict | None:
    """The whole verdict this machine remembers for the model file at `path` (doctor shows
    it), None where it has none with a batch size yet."""
    try:
        return _known(path, cache_file or cache_dir() / CACHE_NAME)
    except OSError:
        return None


def remembered_batch(path: Path, *, cache_file: Path | None = None) -> int:
    """The batch size this machine measured for the model file at `path` (else the full one)."""
    known = remembered_verdict(path, cache_file=cache_file)
    return FULL_BATCH if known is None or known.on else known.n_batch


def describe(flash_attn: str, path: Path) -> str:
    """What a pair on the CPU only runs with, for `doctor`: its models.toml setting, or for
    "auto" the remembered verdict and batch size, or that the first load measures them."""
    if flash_attn != "auto":
        return f"flash attention {flash_attn} (models.toml), {FULL_BATCH}-token batches"
    known = remembered_verdict(path)
    if known is None:
        return "not measured yet: the first load times flash attention and batch sizes"
    said = f"{known.why}; {known.batch_why or f'{known.n_batch}-token batches'}"
    if known.busy is not None:
        said += (
            f" (provisional: timed while other processes took {known.busy:.1f} cores; "
            "timed again at a load that finds this machine quiet)"
        )
    return said


def _quiet(max_s: float) -> float | None:
    return wait_for_quiet(QUIET, max_s)


def verdict(
    name: str,
    path: Path,
    make: Callable[[bool, int], Scratch],
    filler: list[int],
    *,
    cache_file: Path | None = None,
    quiet: Callable[[float], float | None] = _quiet,
    meter: Callable[[], Meter] = CpuMeter,
) -> FlashVerdict:
    """The remembered verdict for the model file at `path`, else a measured one (remembered).

    Timed on a quiet machine: the first measurement on the 2-core Xeon, while four servers
    started beside it, timed a 256-token prompt at 828 ms, over BATCH_CAP_MS, so the
    batch size went untimed and the box kept 512-token batches, first
    tokens 1.2× slower on 800-token prompts. So it waits (at most QUIET_WAIT_S) for other
    processes to take under QUIET cores, and a verdict timed while they took more is
    remembered as provisional (`busy`): a later load that finds the machine quiet (one
    quarter-second look) times it again, a busy one keeps it without waiting. `quiet(max_s)`
    waits and says what the others took; `meter` reads it over the timing
    (engine/neighbours.py)."""
    cache_file = cache_file or cache_dir() / CACHE_NAME
    known = _known(path, cache_file)
    if known is not None and known.busy is None:
        return known
    before = quiet(0.0 if known is not None else QUIET_WAIT_S)
    if known is not None and (before is None or before >= QUIET):
        return known  # still busy: the provisional verdict stands
    LOG.info(
        "%s: measuring flash attention and batch sizes on this CPU (once; about ten seconds)…", name
    )
    others = meter()
    others.resume()
    times = measure(make, filler)
    on, why = decide(times[False], times[True])
    if on:  # no scores written out: the full batch
        n_batch, batch_why = FULL_BATCH, f"{FULL_BATCH}-token batches (flash attention)"
    else:
        n_batch, batch_why = batch_verdict(make, filler, times[False])
    LOG.info("%s: %s; %s", name, why, batch_why)
    took = others.others()
    busy = round(took, 2) if took is not None and took >= QUIET else None
    if busy is not None:
        LOG.warning(
            "%s: other processes took %.1f cores while flash attention and batch sizes were "
            "timed: kept for now, timed again at a load that finds this machine quiet",
            name,
            busy,
        )
    entry = {"on": on, "why": why, "n_batch": n_batch, "batch_why": batch_why, "busy": busy}
    repack.remember(cache_file, _key(path), {**entry, "model": name}, path)
    return FlashVerdict(on, "measured", why, n_batch, batch_why, busy)
