#!/usr/bin/env python3
"""The busy-neighbour drill: how fast the default pair answers with and without one CPU-bound
process beside it, with thread adaptation (the default) and with a fixed thread count.

    .venv/bin/python scripts/neighbour_drill.py [--repeat 3] [--max-tokens 128] [--fixed-busy]

One loaded pair, one prompt at temperature 0: quiet rounds (adaptive and fixed interleaved),
then rounds beside one CPU-bound process, then how long the engine takes to get its threads
back once that process is gone. Prints a table of median tok/s and the two ratios that matter:

- busy ÷ quiet, adaptive: what a neighbour costs the default config (target ≥ 0.5×);
- quiet adaptive ÷ quiet fixed: what adaptation costs when nobody is there (target ≥ 0.95×);

and, once the threads are back, quiet rounds again: after ÷ before the neighbour, whether the
governor drafts as it did before the spell (target ≥ 0.9×: costs measured beside the
neighbour must not keep pricing drafts out; see Ledger.slowdown).

--fixed-busy also runs the fixed config under load (slow: that is what the drill is about), for
at most 16 tokens.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import llama_cpp  # noqa: F401  (llama.cpp before numpy: see homespec/cli_common.py)

from homespec.engine.calibration import calibrate
from homespec.engine.generate import generate
from homespec.engine.loader import load_pair
from homespec.engine.runtime import PairRuntime
from homespec.engine.types import GenerationRequest, GenerationStats, Message
from homespec.manifest import load_manifest

PROMPT = "Write a bash function that backs up a directory with tar and keeps the 7 newest archives."


def answer(rt: PairRuntime, max_tokens: int) -> GenerationStats:
    rt.clear_caches()
    req = GenerationRequest(
        messages=[Message("user", PROMPT)], max_tokens=max_tokens, temperature=0.0, seed=0
    )
    out = list(generate(rt, req))
    stats = out[-1]
    assert isinstance(stats, GenerationStats)
    return stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--fixed-busy", action="store_true")
    ap.add_argument("--config", type=Path, default=None)
    args = ap.parse_args()

    manifest = load_manifest(args.config)
    loaded = load_pair(manifest, None)
    rt = loaded.runtime
    calibrate(rt)
    adapter = rt.threads
    if adapter is None:
        print("adapt_threads is off for this pair: nothing to drill", file=sys.stderr)
        return 2
    full = adapter.max_threads
    results: dict[str, list[float]] = {}
    notes: dict[str, set[str]] = {}

    def measure(name: str, adaptive: bool, max_tokens: int) -> None:
        if adaptive:
            rt.threads = adapter
            loaded.held.set_threads(adapter.state.threads)
        else:
            rt.threads = None
            loaded.held.set_threads(full)
        stats = answer(rt, max_tokens)
        results.setdefault(name, []).append(stats.tokens_per_s)
        notes.setdefault(name, set()).add(
            stats.threads_reason or f"{stats.threads or full} threads"
        )
        print(
            f"  {name:<16} {stats.tokens_per_s:7.1f} tok/s  {stats.threads_reason}", file=sys.stderr
        )

    answer(rt, 16)  # warm-up
    print(
        f"drill: pair {rt.name}, {full} threads configured, {args.repeat} rounds", file=sys.stderr
    )
    # 1. Quiet: adaptation must cost nothing (interleaved, alternating which goes first).
    for rnd in range(args.repeat):
        quiet = [("quiet adaptive", True), ("quiet fixed", False)]
        for name, adaptive in quiet[rnd % 2 :] + quiet[: rnd % 2]:
            measure(name, adaptive, args.max_tokens)
    # 2. One CPU-bound neighbour, there before the requests, as on a real box.
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.0)
        for _ in range(args.repeat):
            measure("busy adaptive", True, args.max_tokens)
            if args.fixed_busy:
                measure("busy fixed", False, 16)
    finally:
        hog.kill()
        hog.wait()
    # 3. The neighbour leaves: seconds of decoding until all threads are back.
    rt.threads = adapter
    loaded.held.set_threads(adapter.state.threads)
    t0, back = time.perf_counter(), None
    while back is None and time.perf_counter() - t0 < 30:
        answer(rt, 32)
        if adapter.state.threads == full:
            back = time.perf_counter() - t0
    # 4. Quiet again: the governor must draft as before the spell.
    for _ in range(args.repeat):
        measure("quiet after", True, args.max_tokens)
    loaded.close()

    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"\n{'config':<16} {'tok/s (median)':>14}  runs  threads")
    for k, v in med.items():
        print(f"{k:<16} {v:>14.1f}  {len(results[k]):>4}  {'; '.join(sorted(notes[k]))}")
    busy = med["busy adaptive"] / med["quiet adaptive"]
    cost = med["quiet adaptive"] / med["quiet fixed"]
    print(f"\nbusy ÷ quiet (adaptive):           {busy:.2f}×  (target ≥ 0.50×)")
    print(f"quiet adaptive ÷ quiet fixed:      {cost:.2f}×  (target ≥ 0.95×)")
    if "busy fixed" in med:
        print(f"busy fixed ÷ quiet fixed:          {med['busy fixed'] / med['quiet fixed']:.2f}×")
    after = "not within 30 s" if back is None else f"after {back:.1f} s of answering"
    print(f"neighbour gone: back to {full} threads {after}")
    again = med["quiet after"] / med["quiet adaptive"]
    print(f"quiet after ÷ before the neighbour: {again:.2f}×  (target ≥ 0.90×)")
    return 0 if busy >= 0.5 and cost >= 0.95 and again >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
