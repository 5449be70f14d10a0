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
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from homespec.engine import repack
from homespec.paths import cache_dir

if TYPE_CHECKING:  # numpy's: this module is read by the planner before llama.cpp loads
    from typing import Protocol

    from homespec.engine.target import Target

    class Scratch(Target, Protocol):
        """A context made for the measurement alone, freed after it."""

        def close(self) -> None: ...


LOG = logging.getLogger("homespec.engine")
PROMPT = 256  # tokens of the scratch prompt
DEPTH = 384  # tokens of context under the answer's steps
PLAIN_STEPS, VERIFY_STEPS = 64, 8  # a request's answer: one-token steps and 8-token verifies
MARGIN = 0.03
N_BATCH = PROMPT  # the scratch contexts evaluate the prompt in one decode, as a pair does
CACHE_NAME = "flash.json"  # in the cache dir, beside the canary's
CACHE_PREFIX = "flash|"

Costs = dict[str, float]  # ms: "prompt", "decode" (one token), "verify" (eight)


@dataclass(frozen=True)
class FlashVerdict:
    on: bool
    source: str  # "measured" or "remembered"
    why: str


def request_ms(c: Costs) -> float:
    return c["prompt"] + PLAIN_STEPS * c["decode"] + VERIFY_STEPS * c["verify"]


def decide(off: Costs, on: Costs) -> tuple[bool, str]:
    """Flash attention or not, from the same costs measured both ways."""
    ratio = request_ms(on) / request_ms(off)
    parts = ", ".join(f"{k} {on[k] / off[k]:.2f}×" for k in ("prompt", "decode", "verify"))
    said = f"a request took {ratio:.2f}× the time without it ({parts})"
    if ratio <= 1 - MARGIN:
        return True, f"flash attention on: {said}"
    return False, f"flash attention off: {said}"


def measure(make: Callable[[bool], Scratch], filler: list[int]) -> dict[bool, Costs]:
    """The costs both ways, each in a scratch context made by `make(flash)` (closed after)."""
    from homespec.engine.calibration import decode_costs  # numpy: only when measuring

    out: dict[bool, Costs] = {}
    for flash in (False, True):
        ctx = make(flash)
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
    on = entry.get("on")
    if not isinstance(on, bool):
        return None
    return FlashVerdict(on, "remembered", str(entry.get("why", "")))


def remembered(path: Path, *, cache_file: Path | None = None) -> bool | None:
    """The verdict this machine remembers for the model file at `path` (None: none yet)."""
    try:
        known = _known(path, cache_file or cache_dir() / CACHE_NAME)
    except OSError:  # no such file (yet): nothing to remember
        return None
    return None if known is None else known.on


def verdict(
    name: str,
    path: Path,
    make: Callable[[bool], Scratch],
    filler: list[int],
    *,
    cache_file: Path | None = None,
) -> FlashVerdict:
    """The remembered verdict for the model file at `path`, else a measured one (remembered)."""
    cache_file = cache_file or cache_dir() / CACHE_NAME
    known = _known(path, cache_file)
    if known is not None:
        return known
    LOG.info("%s: measuring flash attention on this CPU (once; about three seconds)…", name)
    times = measure(make, filler)
    on, why = decide(times[False], times[True])
    LOG.info("%s: %s", name, why)
    repack.remember(cache_file, _key(path), {"on": on, "why": why, "model": name}, path)
    return FlashVerdict(on, "measured", why)
