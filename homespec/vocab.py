"""homespec's vocabularies, each defined once: the words that cross module boundaries.

Each is a `Literal` (what mypy checks and pydantic validates) with its tuple of values (what
click choices, loops and metrics labels use), plus the words users read for them.
"""

from __future__ import annotations

from typing import Literal, get_args

# Who proposes draft tokens. model: the draft model; ngram: prompt lookup (no model, no memory);
# hybrid: prompt lookup when it finds a match, else the draft model.
Drafter = Literal["model", "ngram", "hybrid"]
DRAFTERS: tuple[Drafter, ...] = get_args(Drafter)
# What a request ran with: a forced drafter, the governor's per-step choice ("auto"), or none.
DrafterOrNone = Literal["model", "ngram", "hybrid", "auto", "none"]
DRAFTER_LABELS: dict[str, str] = {
    "model": "draft model",
    "ngram": "n-gram prompt lookup",
    "hybrid": "n-gram lookup, else draft model",
    "auto": "governor",
    "none": "none",
}

# How one request ran.
RunMode = Literal["speculative", "plain"]

# What a pair in the daemon does now (status, /health, /metrics).
PairMode = Literal["speculative", "ngram", "plain", "loading", "restarting", "failed", "stopped"]
PAIR_MODES: tuple[PairMode, ...] = get_args(PairMode)

# What a memory plan runs a pair as.
PlanMode = Literal["speculative", "ngram", "plain", "refused"]

# The memory planner's fallback ladder, in order; "refuse" when nothing fits.
Rung = Literal[
    "split",  # 0: target spread over this box and its RPC workers, draft on this box
    "co-load",  # 1: target and draft together (on the GPU, or in RAM on a CPU-only box)
    "draft-on-cpu",  # 2: target on the GPU, draft in RAM
    "ngram",  # 3: draft dropped, model-free n-gram drafting
    "plain",  # 4: target only, no speculation (smaller logits buffer)
    "smaller-context",  # 5: n_ctx reduced, never below the pair's n_ctx_min
    "partial-offload",  # 6: only some target layers on the GPU
    "cpu-only",  # 7: everything in RAM
    "refuse",  # nothing fits: the plan says how much memory is missing, and where
]
RUNGS: tuple[Rung, ...] = get_args(Rung)

# What `homespec bench` compares: plain decoding, each drafter forced, and the policy's choice.
BenchMode = Literal["plain", "model", "ngram", "hybrid", "auto"]
BENCH_MODES: tuple[BenchMode, ...] = get_args(BenchMode)
