#!/usr/bin/env python3
"""What a client's prediction (OpenAI's Predicted Outputs) is worth, in one run, in-process.

    .venv/bin/python scripts/prediction_bench.py [--pair NAME] [--repeat 2] [--json OUT.json]
    .venv/bin/python scripts/prediction_bench.py --workload-out predicted.jsonl

The second writes the same requests, predictions included, as a workload for `homespec bench
--workload` and scripts/llama_server_compare.sh (which send other servers OpenAI's field).

Two ways clients send one, on the shipped workload's prompts:
- edit: a code edit ("rename this function and return the whole file") with the file as the
  prediction, as OpenAI's guide has it. The file is in the prompt too, so prompt lookup
  already drafts most of it: what is left to win is the answer's start and the ties.
- regenerate: the question asked again after a small change (7 archives became 5, user app
  became web, a cat became a dog), with the answer to the question as it was before as the
  prediction (a client regenerating an answer after an edit). Nothing in the prompt drafts it.

Each prompt runs plain, `auto` without the prediction and `auto` with it (every run from an
empty cache, nothing remembered across runs; auto learns from its own runs, as a server
would), --repeat times, greedy. The table: tokens per second over each task's runs, × plain,
the share of the answer's tokens that came from the prediction, and how many answers were
plain decoding's token for token (they must all be).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import homespec.engine.llama_backend  # noqa: F401  (llama.cpp's library before numpy's)

# isort: split
from homespec.engine.calibration import calibrate
from homespec.engine.generate import complete
from homespec.engine.loader import load_pair
from homespec.engine.runtime import PairRuntime
from homespec.engine.types import GenerationRequest, GenerationStats, Message
from homespec.manifest import load_manifest
from homespec.workload import default_workload, load_workload

# (a phrase of a shipped prompt, what it said in the question asked before)
EARLIER = [
    ("the 7 newest archives", "the 5 newest archives"),
    ("run by user app", "run by user web"),
    ("Python 3.11", "Python 3.12"),
    ("Make it strange.", "Make it eerie."),
    ("in the voice of a cat", "in the voice of a dog"),
]
FENCED = re.compile(r"```[a-z]*\n.*?```", re.S)
MODES = ("plain", "auto", "auto+prediction")


@dataclass
class Case:
    task: str
    messages: list[Message]
    max_tokens: int
    prediction: str = ""


def cases(rt: PairRuntime) -> list[Case]:
    out = []
    for item in load_workload(default_workload()):
        ask = item.messages[-1].content
        if item.task == "code-edit" and (block := FENCED.search(ask)):
            out.append(Case("edit", item.messages, item.max_tokens, block.group(0)))
        for now, before in EARLIER:
            if now in ask:
                earlier = [*item.messages[:-1], Message("user", ask.replace(now, before))]
                previous, _ = answer(rt, Case("", earlier, item.max_tokens), "plain")
                out.append(Case("regenerate", item.messages, item.max_tokens, previous))
    return out


def answer(rt: PairRuntime, case: Case, mode: str) -> tuple[str, GenerationStats]:
    rt.clear_caches()
    req = GenerationRequest(
        messages=case.messages,
        max_tokens=case.max_tokens,
        temperature=0.0,
        speculative=False if mode == "plain" else None,
        task=case.task,
        prediction=case.prediction if mode == "auto+prediction" else None,
        remember=False,
    )
    return complete(rt, req)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=None)
    ap.add_argument("--pair", default=None)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="write every run here")
    ap.add_argument("--workload-out", type=Path, default=None, help="write the requests; no runs")
    args = ap.parse_args()
    runs: list[dict[str, Any]] = []
    with load_pair(load_manifest(args.config), args.pair) as loaded:
        rt = loaded.runtime
        calibrate(rt)
        todo = cases(rt)
        if args.workload_out:
            lines = [
                {
                    "task": c.task,
                    "messages": [{"role": m.role, "content": m.content} for m in c.messages],
                    "max_tokens": c.max_tokens,
                    "prediction": c.prediction,
                }
                for c in todo
            ]
            args.workload_out.write_text("".join(json.dumps(x) + "\n" for x in lines))
            print(f"{args.workload_out}: {len(lines)} requests")
            return 0
        answer(rt, todo[0], "plain")  # warm-up: the first request's costs hit no measured run
        t0 = time.perf_counter()
        for rep in range(args.repeat):
            for i, case in enumerate(todo):
                plain = ""
                for mode in MODES:
                    text, s = answer(rt, case, mode)
                    plain = text if mode == "plain" else plain
                    runs.append(
                        {
                            "task": case.task,
                            "case": i,
                            "rep": rep,
                            "mode": mode,
                            "tokens": s.completion_tokens,
                            "ms": s.e2e_ms,
                            "steps": s.verify_steps,
                            "from_prediction": s.accepted_prediction_tokens,
                            "same": text == plain,
                        }
                    )
                    print(
                        f"[{len(runs)}] {case.task} #{i + 1} {mode}: {s.completion_tokens} tok "
                        f"{s.tokens_per_s:.1f} tok/s, {s.verify_steps} steps, "
                        f"{s.accepted_prediction_tokens} from the prediction",
                        flush=True,
                    )
    print(f"\n{len(runs)} runs in {time.perf_counter() - t0:.0f} s\n")
    head = ("task", "mode", "runs", "tok/s", "× plain", "predicted", "same")
    print("{:<11} {:<16} {:>4} {:>7} {:>8} {:>9} {}".format(*head))
    for task in [*sorted({r["task"] for r in runs}), "all"]:
        rows = [r for r in runs if task in ("all", r["task"])]
        rate = {}
        for mode in MODES:
            mine = [r for r in rows if r["mode"] == mode]
            tokens = sum(r["tokens"] for r in mine)
            rate[mode] = tokens / (sum(r["ms"] for r in mine) / 1000)
            share = sum(r["from_prediction"] for r in mine) / max(1, tokens)
            same = sum(r["same"] for r in mine) / len(mine)
            print(
                f"{task:<11} {mode:<16} {len(mine):>4} {rate[mode]:>7.1f} "
                f"{rate[mode] / rate['plain']:>7.2f}× {share:>8.0%} {same:>4.0%}"
            )
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
