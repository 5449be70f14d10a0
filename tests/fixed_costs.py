"""Costs the governor prices in tests, fixed rather than measured on the fakes' decodes.

A FakeTarget(decode_s=0) decodes in microseconds of Python: what the ledger measures there is
noise, and noise would choose the options (a busy machine made the governor pick plain steps
where a test needed it to draft). A test whose assertions hang on what the governor chooses
fixes the costs it prices with these.
"""

from __future__ import annotations

import pytest

from homespec.engine.estimates import CostCurve
from homespec.engine.runtime import PairRuntime


def asking_costs(monkeypatch: pytest.MonkeyPatch, rt: PairRuntime, own_share: float) -> None:
    """A step's own work priced at `own_share` of a one-token decode (a GPU's is about a
    quarter, a CPU's 1.5%), and never measured: the decisions do not hang on how busy the
    machine running the test is (a step's measured work moves every estimate a little)."""
    monkeypatch.setattr(rt.ledger, "own_share", lambda: own_share)
    monkeypatch.setattr(rt.ledger, "observe_step", lambda option, ms: None)


def fixed_costs(
    monkeypatch: pytest.MonkeyPatch,
    rt: PairRuntime,
    own_share: float,
    *,
    per_token: float = 10.0,
    draft_one: float = 20.0,
    draft_per_token: float = 10.0,
) -> None:
    """A target decode of n tokens costs 20 + per_token × n ms and a draft-model decode
    draft_one + draft_per_token × n, never measured, and asking_costs. The defaults are a
    CPU-like curve with the draft model as dear as the target (never worth drafting with);
    `cheap_drafts` is a GPU-like one where drafting pays."""
    rt.ledger.verify = CostCurve({n: 20.0 + per_token * n for n in (1, 2, 4, 8, 16, 32)})
    monkeypatch.setattr(rt.ledger.verify, "observe", lambda n, ms: None)  # costs stay put
    if rt.draft is not None:
        rt.ledger.draft = CostCurve({n: draft_one + draft_per_token * n for n in (1, 8, 32)})
        monkeypatch.setattr(rt.ledger.draft, "observe", lambda n, ms: None)
    asking_costs(monkeypatch, rt, own_share)


def cheap_drafts(monkeypatch: pytest.MonkeyPatch, rt: PairRuntime) -> None:
    """Fixed costs where drafting pays: verifying 32 tokens costs 1.8 times one (a GPU's flat
    curve) and a draft-model token a twentieth of a target decode."""
    fixed_costs(monkeypatch, rt, 0.05, per_token=0.5, draft_one=0.5, draft_per_token=0.5)
