#!/usr/bin/env python3
"""Would the draft model's catch-up pay on a thread of its own? The measurements that decide.

    .venv/bin/python scripts/catch_up_threads.py [--pair NAME] [--lag 200] [--rounds 3]

A draft model behind the history catches up in one batched decode, and the answer stalls for
it (docs/GOVERNOR_EVIDENCE.md, "What the CPU's catch-up rules cost"). The alternative: the draft
catches up on some of the pair's CPU threads while the target steps on with the rest. Whether
that pays depends on how much the target slows on fewer threads. On the 2-core machine here it
did not (1.3× a step on 1 thread of 2; the docs have the arithmetic); on a CPU whose decode is
bound by memory with cores to spare it may. Per round, in the pair's own loaded contexts:

- the target's one-token decode at all threads and at all but the draft's share (median of 20);
- the draft's catch-up on --lag tokens at all threads and at its share (one batch);
- both at once: the draft catching up on its share in chunks of 8 on a Python thread while the
  target decodes one token at a time on the rest, and how fast each went.

CPU only: on a GPU the target does not use these threads.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import homespec.engine.llama_backend  # noqa: F401  (llama.cpp's library before numpy's)

# isort: split
from homespec.engine.loader import load_pair
from homespec.engine.neighbours import physical_cores
from homespec.engine.target import Target
from homespec.manifest import load_manifest

CHUNK = 8
STEPS = 20


def step_ms(target: Target, history: list[int]) -> float:
    """Median one-token decode after `history`."""
    target.clear()
    target.extend(history, 1)
    h, times = list(history), []
    for i in range(STEPS):
        h.append(history[i % len(history)])
        t0 = time.perf_counter()
        target.extend(h, 1)
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def catch_up_ms(draft: Target, history: list[int], threads: int) -> float:
    draft.set_threads(threads)
    draft.clear()
    t0 = time.perf_counter()
    draft.extend(history, 1)
    return (time.perf_counter() - t0) * 1000.0


def overlapped(
    target: Target, draft: Target, prompt: list[int], lag: list[int]
) -> tuple[float, int, float]:
    """(the draft's catch-up ms, target steps meanwhile, their median ms)."""
    draft.clear()
    target.clear()
    target.extend(prompt, 1)
    done: list[float] = []

    def catch_up() -> None:
        t0 = time.perf_counter()
        for end in range(CHUNK, len(lag) + CHUNK, CHUNK):
            draft.extend(lag[:end], 1)
        done.append((time.perf_counter() - t0) * 1000.0)

    worker = threading.Thread(target=catch_up)
    worker.start()
    h, times = list(prompt), []
    while worker.is_alive():
        h.append(prompt[len(h) % len(prompt)])
        t0 = time.perf_counter()
        target.extend(h, 1)
        times.append((time.perf_counter() - t0) * 1000.0)
    worker.join()
    return done[0], len(times), statistics.median(times) if times else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", default=None)
    ap.add_argument("--lag", type=int, default=200, help="tokens the draft catches up on")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with load_pair(load_manifest(None), args.pair, huge_pages="now") as loaded:
        rt = loaded.runtime
        if rt.draft is None:
            raise SystemExit(f"pair {rt.name!r} has no draft model loaded")
        target, draft = rt.target, rt.draft.ctx
        threads = rt.spec.threads or physical_cores()
        if threads < 2:
            raise SystemExit("the pair runs on 1 thread: there is none to spare")
        share = threads // 2
        vocab = 300  # ordinary token ids, past the control tokens
        lag = [vocab + i % 5000 for i in range(min(args.lag, draft.n_ctx - 1))]
        prompt = lag[:60]
        print(
            f"pair {rt.name}: {threads} threads; the draft's share {share}, "
            f"the target's {threads - share}"
        )
        print(
            f"{'round':>5}  {'target 1-tok ms':>24}  {'draft catch-up ms':>24}  "
            f"{'overlapped: draft ms, target steps, step ms':>44}"
        )
        for r in range(args.rounds):
            target.set_threads(threads)
            full = step_ms(target, prompt)
            target.set_threads(threads - share)
            rest = step_ms(target, prompt)
            fg = catch_up_ms(draft, lag, threads)
            bg = catch_up_ms(draft, lag, share)
            draft.set_threads(share)
            both = overlapped(target, draft, prompt, lag)
            target.set_threads(threads)
            draft.set_threads(threads)
            print(
                f"{r + 1:>5}  {f'{full:.1f} all / {rest:.1f} rest':>24}  "
                f"{f'{fg:.0f} all / {bg:.0f} share':>24}  "
                f"{f'{both[0]:.0f}, {both[1]}, {both[2]:.1f}':>44}"
            )
        target.clear()
        draft.clear()


if __name__ == "__main__":
    main()
