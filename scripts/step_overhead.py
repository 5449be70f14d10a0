#!/usr/bin/env python3
"""What homespec's own Python costs per verify step, outside llama.cpp's decodes.

    .venv/bin/python scripts/step_overhead.py [--pair NAME] [--context 3000] [--json OUT.json]

At 700+ tok/s (a small pair on a GPU) a step costs about a millisecond, so the loop's own work
per step (n-gram lookup, the governor, copying logits, comparing the history with the cache,
sampling, detokenizing) decides whether `auto` can keep up with plain decoding. This runs the
same copy-heavy prompt (a source file to return with one line added, so n-gram drafts grow to
dozens of tokens) at a short and at a long context, in-process: plain, n-gram lookup forced
to NGRAM_K tokens a step (the same work in every run, for before/after comparisons) and
`auto` (whatever the governor chooses on this machine), and reports per step after the first
token: the time inside llama.cpp's decodes (target and draft, with the wait for their
results: on a GPU llama_decode only queues the work, and the first H100 run, timing
llama_decode alone, put about a millisecond of a plain step's GPU time in homespec's column)
and the rest, which is homespec's; and, once per request, homespec's setup before the first
token (chat template, tokenizing, n-gram indexing; the prompt's decode not counted). On a CPU
the decodes dominate; the rest is what matters on a GPU. Each row is the lowest of --repeat
runs (a noisy neighbour only ever adds time).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import homespec.engine.llama_backend  # noqa: F401  (llama.cpp's library before numpy's)

# isort: split
from homespec.engine.calibration import calibrate
from homespec.engine.generate import generate
from homespec.engine.loader import load_pair
from homespec.engine.runtime import PairRuntime
from homespec.engine.types import GenerationRequest, GenerationStats, Message
from homespec.manifest import load_manifest

SOURCE = Path(__file__).resolve().parent.parent / "homespec" / "engine" / "governor.py"
NGRAM_K = 32  # forced n-gram drafts this long: the same work per step in every run
ASK = "Return this file unchanged, with one comment line added at the top.\n\n```python\n{}\n```"


def prompt(rt: PairRuntime, context: int) -> list[Message]:
    """A copy-heavy prompt of about `context` tokens (whole lines of the source file)."""
    text = ""
    for line in SOURCE.read_text().splitlines(keepends=True):
        if len(rt.target.model.tokenize(text + line, special=False)) > context:
            break
        text += line
    return [Message("user", ASK.format(text))]


def decode_seconds(rt: PairRuntime) -> float:
    total: float = getattr(rt.target, "decode_seconds", 0.0)
    if rt.draft is not None:
        total += getattr(rt.draft.ctx, "decode_seconds", 0.0)
    return total


def run(rt: PairRuntime, messages: list[Message], mode: str, max_tokens: int) -> dict[str, Any]:
    rt.clear_caches()
    req = GenerationRequest(
        messages=messages,
        max_tokens=max_tokens,
        temperature=0.0,
        speculative=None if mode == "auto" else mode != "plain",
        drafter="ngram" if mode == "ngram" else None,
        draft_tokens=NGRAM_K if mode == "ngram" else None,
        task="step-overhead",
    )
    d0, t0 = decode_seconds(rt), time.perf_counter()
    d1 = t1 = None  # at the first token: the request's setup and its prompt are behind it
    stats = None
    for item in generate(rt, req):
        if d1 is None:
            d1, t1 = decode_seconds(rt), time.perf_counter()
        if isinstance(item, GenerationStats):
            stats = item
    t2, d2 = time.perf_counter(), decode_seconds(rt)
    assert stats is not None and d1 is not None and t1 is not None
    steps = max(1, stats.verify_steps)
    return {
        "mode": mode,
        "prompt_tokens": stats.prompt_tokens,
        "tokens": stats.completion_tokens,
        "steps": stats.verify_steps,
        "drafted_per_step": round(stats.proposed_tokens / steps, 1),
        "decode_ms_per_step": round((d2 - d1) * 1000 / steps, 3),
        "homespec_us_per_step": round(((t2 - t1) - (d2 - d1)) * 1e6 / steps, 1),
        "setup_ms": round(((t1 - t0) - (d1 - d0)) * 1000, 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=None)
    ap.add_argument("--pair", default=None)
    ap.add_argument("--context", type=int, default=3000, help="the long prompt's tokens")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    with load_pair(load_manifest(args.config), args.pair) as loaded:
        rt = loaded.runtime
        calibrate(rt)
        room = rt.target.n_ctx - args.max_tokens - 64
        for context in (300, min(args.context, room)):
            messages = prompt(rt, context)
            for mode in ("plain", "ngram", "auto"):
                run(rt, messages, mode, 16)  # warm-up: this context's first graphs
                results = [run(rt, messages, mode, args.max_tokens) for _ in range(args.repeat)]
                best = min(results, key=lambda r: r["homespec_us_per_step"])
                rows.append(best)
    head = (
        "mode",
        "prompt",
        "steps",
        "drafted/step",
        "decode ms/step",
        "homespec µs/step",
        "setup ms",
    )
    print(" | ".join(head))
    for r in rows:
        print(
            f"{r['mode']} | {r['prompt_tokens']} | {r['steps']} | {r['drafted_per_step']} | "
            f"{r['decode_ms_per_step']} | {r['homespec_us_per_step']} | {r['setup_ms']}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
