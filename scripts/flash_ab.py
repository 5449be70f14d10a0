#!/usr/bin/env python3
"""Flash attention off against on for one pair: the same prompts, both ways, in one process.

    .venv/bin/python scripts/flash_ab.py [--modes plain,auto] [--repeat 2] [--workload F]

Loads the pair twice, once with `flash_attn = "off"` and once with "on" (whatever models.toml
says), and runs every prompt of the workload on both, alternating which goes first, each run
starting from another chat in the caches as `homespec bench` does. Prints tok/s (answer tokens
over end-to-end time) and the median ttft per task and mode, and on ÷ off. What
`flash_attn = "auto"` measures at load (engine/flash.py) is a three-second proxy for this.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import homespec.engine.llama_backend  # noqa: F401  (llama.cpp's library before numpy's)

# isort: split
from homespec.bench import _another_chat
from homespec.engine.generate import generate
from homespec.engine.loader import LoadedPair, load_pair
from homespec.engine.types import GenerationRequest, GenerationStats
from homespec.manifest import Manifest, load_manifest
from homespec.workload import default_workload, load_workload


def with_flash(manifest: Manifest, pair: str, value: str) -> Manifest:
    changed = copy.deepcopy(manifest)
    changed.spec.pairs[pair] = changed.spec.pairs[pair].model_copy(update={"flash_attn": value})
    return changed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair")
    ap.add_argument("--modes", default="plain,auto")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workload", type=Path, default=None)
    args = ap.parse_args()
    manifest = load_manifest(None)
    pair = args.pair or manifest.default_pair
    items = load_workload(args.workload or default_workload())
    modes = args.modes.split(",")
    # (task, mode, setting) -> answer tokens, seconds, ttfts
    runs: dict[tuple[str, str, str], tuple[int, float, list[float]]] = {}
    off_m, on_m = (with_flash(manifest, pair, v) for v in ("off", "on"))
    with load_pair(off_m, pair) as off, load_pair(on_m, pair) as on:
        both: list[tuple[str, LoadedPair]] = [("off", off), ("on", on)]
        for _, loaded in both:  # first-graph costs and page faults hit no measured run
            for mode in modes:
                warm = GenerationRequest(
                    messages=items[0].messages,
                    max_tokens=16,
                    speculative=False if mode == "plain" else None,
                )
                for _ in generate(loaded.runtime, warm):
                    pass
        for rep in range(args.repeat):
            for idx, item in enumerate(items):
                order = both if (rep + idx) % 2 == 0 else both[::-1]
                for setting, loaded in order:
                    for mode in modes:
                        _another_chat(loaded.runtime)
                        req = GenerationRequest(
                            messages=item.messages,
                            max_tokens=item.max_tokens,
                            speculative=False if mode == "plain" else None,
                            task=item.task,
                        )
                        t0 = time.perf_counter()
                        gen = generate(loaded.runtime, req)
                        stats = next(s for s in gen if isinstance(s, GenerationStats))
                        took = time.perf_counter() - t0
                        tok, secs, ttfts = runs.get((item.task, mode, setting), (0, 0.0, []))
                        runs[(item.task, mode, setting)] = (
                            tok + stats.completion_tokens,
                            secs + took,
                            [*ttfts, stats.ttft_ms],
                        )
    tasks = list(dict.fromkeys(item.task for item in items))
    print(f"pair {pair}, {args.repeat} × {len(items)} prompts, flash attention off and on")
    print(
        f"{'mode':6} {'task':12} {'off tok/s':>9} {'ttft':>6} {'on tok/s':>9} {'ttft':>6}  on/off"
    )
    for mode in modes:
        for task in [*tasks, "all"]:
            row = []
            for setting in ("off", "on"):
                keys = [k for k in runs if k[1:] == (mode, setting) and task in ("all", k[0])]
                tok = sum(runs[k][0] for k in keys)
                secs = sum(runs[k][1] for k in keys)
                ttft = statistics.median(t for k in keys for t in runs[k][2])
                row.append((tok / secs, ttft))
            (a, ta), (b, tb) = row
            print(f"{mode:6} {task:12} {a:9.1f} {ta:6.0f} {b:9.1f} {tb:6.0f}  {b / a:.3f}×")


if __name__ == "__main__":
    main()
