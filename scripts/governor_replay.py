#!/usr/bin/env python3
"""The governor's choices priced at fixed costs: a deterministic A/B of decision changes.

    .venv/bin/python scripts/governor_replay.py [--workload F] [--task T,…] [--modes plain,auto]
        [--costs cpu|gpu|FILE.json] [--pair NAME] [--why] [--json OUT.json]

On a 2-core box one bench run's ratios swing by 10–20%: the machine's speed wanders, and the
governor, which decides from the costs it measures, decides differently from run to run (one
list answer ran at 43 and at 57 tok/s in `auto` on the same code). That hides the few percent
a change to the decision is worth. Here the real models answer the real prompts (temperature
0, so every answer is the target's own, the same in every mode), but the governor is given one
fixed cost table and never a timing, and each request's time is that table's price of every
decode that ran in it, target and draft model, the prompt's included: the same code gives the
same figures, to the digit, on any machine and under any load. Run it before and after a
change (a git worktree for the old code) and compare.

What it does not measure: homespec's own Python per step (scripts/step_overhead.py), and
whether the table is this machine's: `cpu` is the demo pair on the 2-core box these notes come
from (see README), `gpu` a launch-bound tiny pair on one H100 (issue 8's llama-bench figures),
FILE a JSON object {"verify": {"1": ms, …}, "draft": {"1": ms, …}} (ms of one decode by tokens
in it; `homespec doctor --measure` prints this machine's). Speed claims still come from
`homespec bench`; this says whether a decision change helps at given costs.

Each run starts as the bench's do (another chat in both caches), but with no warm-up before
the first, as a fresh daemon's first requests; the n-gram memory learns each prompt from the
last mode's run; the draft model's agreement with the target is measured as at load (argmax
on a fixed chat: the same every time); the thread adapter is off (no timings to adapt to).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import homespec.engine.llama_backend  # noqa: F401  (llama.cpp's library before numpy's)

# isort: split
from homespec.bench import _another_chat, _request
from homespec.engine.calibration import agreement
from homespec.engine.generate import PairRuntime, generate
from homespec.engine.governor import CostCurve
from homespec.engine.llama_backend import LlamaContext
from homespec.engine.loader import load_pair
from homespec.engine.types import GenerationStats
from homespec.manifest import load_manifest
from homespec.workload import load_workload

SHIPPED = Path(__file__).resolve().parent.parent.parent / "shared" / "prompts" / "workload.jsonl"
PRESETS: dict[str, dict[str, dict[int, float]]] = {
    # SmolLM2-135M F32 target, Q4_1 draft, 2 threads of a 2-core AMD EPYC (median live steps)
    "cpu": {
        "verify": {1: 26.0, 2: 36.0, 4: 42.0, 8: 52.0, 16: 76.0, 32: 112.0, 64: 190.0},
        "draft": {1: 10.0, 2: 17.0, 8: 40.0, 32: 125.0, 64: 240.0},
    },
    # The same pair on one H100, all layers on the GPU: launch-bound, verifying is about free
    "gpu": {
        "verify": {1: 2.1, 2: 2.15, 4: 2.2, 8: 2.4, 16: 2.7, 32: 3.1, 64: 3.7},
        "draft": {1: 1.08, 2: 1.1, 8: 1.3, 32: 1.9, 64: 2.6},
    },
}


def cost_table(spec: str) -> dict[str, dict[int, float]]:
    if spec in PRESETS:
        return PRESETS[spec]
    raw = json.loads(Path(spec).read_text())
    parts = ("verify", "draft")
    return {part: {int(n): float(ms) for n, ms in raw[part].items()} for part in parts}


def pin_costs(rt: PairRuntime, table: dict[str, dict[int, float]], clock: list[float]) -> None:
    """Give the governor `table` and nothing else, and add each decode's price to clock[0]."""
    ledger = rt.ledger
    verify, draft = CostCurve(dict(table["verify"])), CostCurve(dict(table["draft"]))
    ledger.verify, ledger.quiet, ledger.draft = verify, CostCurve(dict(table["verify"])), draft
    for curve in (verify, draft):
        curve.observe = lambda n, ms: None  # type: ignore[method-assign]
    rt.threads = None
    ref_verify, ref_draft = CostCurve(dict(table["verify"])), CostCurve(dict(table["draft"]))
    contexts = [(rt.target, ref_verify)]
    if rt.draft is not None:
        contexts.append((rt.draft.ctx, ref_draft))
    for ctx, ref in contexts:
        assert isinstance(ctx, LlamaContext)  # the real models: their decodes are priced
        decode: Callable[[list[int], int, int, int], None] = ctx._decode

        def priced(
            history: list[int],
            start: int,
            end: int,
            first_logit: int,
            decode: Callable[[list[int], int, int, int], None] = decode,
            ref: CostCurve = ref,
        ) -> None:
            clock[0] += ref.at(end - start) or 0.0
            decode(history, start, end, first_logit)

        ctx._decode = priced  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", type=Path, default=SHIPPED)
    ap.add_argument("--task", help="comma-separated tasks (default: all)")
    ap.add_argument("--modes", default="plain,ngram,model,auto")
    ap.add_argument("--costs", default="cpu", help="cpu, gpu or a JSON file (see above)")
    ap.add_argument("--pair")
    ap.add_argument("--why", action="store_true", help="print each auto answer's reason")
    ap.add_argument("--json", type=Path, help="write the per-prompt figures here")
    args = ap.parse_args()
    items = load_workload(args.workload)
    if args.task:
        items = [i for i in items if i.task in args.task.split(",")]
    modes = args.modes.split(",")
    clock = [0.0]
    rows: list[dict[str, Any]] = []
    with load_pair(load_manifest(None), args.pair) as loaded:
        rt = loaded.runtime
        rt.ledger.agreement = agreement(rt)  # before pin_costs: its decodes are not priced
        pin_costs(rt, cost_table(args.costs), clock)
        for idx, item in enumerate(items):
            for mode in modes:
                _another_chat(rt)
                clock[0] = 0.0
                stats: GenerationStats | None = None
                req = _request(item, mode, 0.0, None, remember=mode == modes[-1])
                for out in generate(rt, req):
                    if isinstance(out, GenerationStats):
                        stats = out
                assert stats is not None
                rows.append(
                    {
                        "task": item.task,
                        "prompt": idx,
                        "mode": mode,
                        "tokens": stats.completion_tokens,
                        "ms": round(clock[0], 1),
                        "reason": stats.reason,
                    }
                )
                print(
                    f"{item.task} #{idx + 1} {mode}: {stats.completion_tokens} tok, "
                    f"{1000 * stats.completion_tokens / clock[0]:.1f} tok/s at {args.costs} costs",
                    flush=True,
                )
                if args.why and mode == "auto":
                    print(f"    {stats.reason}")
    _table(rows, modes)
    if args.json:
        args.json.write_text(json.dumps({"costs": args.costs, "runs": rows}, indent=1))


def _table(rows: list[dict[str, Any]], modes: list[str]) -> None:
    """tok/s by task and mode (all answer tokens over all their priced time), with auto's
    ratios to plain and to the best forced mode."""
    tasks = [*dict.fromkeys(r["task"] for r in rows), "all"]
    forced = [m for m in modes if m not in ("plain", "auto")]
    print(f"{'task':<12}" + "".join(f"{m:>9}" for m in modes) + "  auto÷plain  auto÷best forced")
    for task in tasks:
        tps = {}
        for mode in modes:
            rs = [r for r in rows if r["mode"] == mode and task in ("all", r["task"])]
            ms = sum(r["ms"] for r in rs)
            tps[mode] = 1000 * sum(r["tokens"] for r in rs) / ms if ms else 0.0
        line = f"{task:<12}" + "".join(f"{tps[m]:>9.1f}" for m in modes)
        if "auto" in tps and tps.get("plain"):
            line += f"  {tps['auto'] / tps['plain']:>10.2f}"
            if forced:
                line += f"  {tps['auto'] / max(tps[m] for m in forced):>15.2f}"
        print(line)


if __name__ == "__main__":
    main()
