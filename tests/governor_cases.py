"""Synthetic and measured figures the governor's tests share (tests/test_governor.py,
tests/test_catch_up.py)."""

from __future__ import annotations

from homespec.engine.estimates import MAX_K, Acceptance, CostCurve
from homespec.engine.governor_types import Inputs, Option

# The demo pair's curves as measured on a 2-core CPU (ms by tokens in one decode).
DEMO_TARGET = CostCurve({1: 17.1, 2: 23.1, 4: 28.9, 5: 29.8, 8: 37.9, 16: 53.5, 32: 89.4})
DEMO_DRAFT = CostCurve({1: 7.1, 8: 29.0, 16: 51.9, 32: 99.2})


def curve(one: float, per_extra: float) -> CostCurve:
    """verify(n) = one + per_extra × (n - 1), measured at a few n."""
    return CostCurve({n: one + per_extra * (n - 1) for n in (1, 2, 4, 8, 16, 32, 64)})


def seen(rate: float, steps: int = 400, k: int = 64) -> Acceptance:
    """Acceptance measured over `steps` steps of k drafts, each kept with `rate`."""
    tries = [float(int(steps * rate**i)) if i < k else 0.0 for i in range(MAX_K)]
    kept = [float(int(steps * rate ** (i + 1))) if i < k else 0.0 for i in range(MAX_K)]
    return Acceptance(tries, kept)


def inputs(
    verify: CostCurve,
    *,
    ngram: float | None = None,
    model: float | None = None,
    draft_ms: float | None = None,
    match: int = 64,
    step: int = 0,
    current: Option = "none",
) -> Inputs:
    acc = {
        "ngram": seen(ngram) if ngram is not None else Acceptance(),
        "model": seen(model) if model is not None else Acceptance(),
    }
    return Inputs(verify, draft_ms, 0.01, acc, match if ngram is not None else 0, 64, step, current)
