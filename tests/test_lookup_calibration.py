"""The tally behind `scripts/governor_replay.py --calibration` (a script's pure module)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "lookup_calibration.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lookup_calibration", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bets_are_binned_by_their_estimated_speedup_and_priced_against_plain_steps() -> None:
    tally = _module().LookupCalibration()
    # a marginal bet that kept both drafts: 3 tokens for a 39-ms step, plain 26 ms a token
    tally.record("request", 2, [0.6, 0.7], 2, 2, 39.0, 26.0, 1.04)
    # a marginal bet that kept none: 1 token for a 39-ms step
    tally.record("request", 2, [0.6, 0.7], 2, 0, 39.0, 26.0, 1.07)
    # a long copy, estimated at 4x
    tally.record("request", 32, [0.95] * 4, 4, 4, 50.0, 26.0, 4.0)
    out = tally.render()
    assert "est >= 1.00:     1 drafts, est 1.04x, realized 2.00x, gained    +0.04 s" in out
    assert "est >= 1.05:     1 drafts, est 1.07x, realized 0.67x, gained    -0.01 s" in out
    assert "est >= 3.00:     1 drafts, est 4.00x, realized 2.60x, gained    +0.08 s" in out
    assert "all drafts gained +0.11 s over plain steps" in out


def test_positions_after_the_first_rejected_one_are_not_counted_as_tried() -> None:
    tally = _module().LookupCalibration()
    tally.record("request", 4, [0.8, 0.8, 0.8], 3, 1, 44.0, 26.0, 1.5)
    assert sorted(tally.by_estimate) == [(1, 8), (2, 8)]  # position 3 was never verified
    assert tally.by_estimate[(1, 8)][2] == 1 and tally.by_estimate[(2, 8)][2] == 0


def test_conditional_rates_undo_the_expected_tokens_ladder() -> None:
    rates = _module().conditional_rates([1.5, 1.75, 1.875])  # 1 + 0.5 + 0.25 + 0.125
    assert rates == pytest.approx([0.5, 0.5, 0.5])
