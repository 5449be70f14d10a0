"""What a pair measures about itself at load (engine/calibration.py), on the scripted fake:
decode costs and the draft model's agreement with the target."""

from __future__ import annotations

import pytest

from homespec.engine.calibration import AGREEMENT_POSITIONS, agreement, calibrate
from homespec.engine.drafters import ModelDrafter, NgramDrafter
from homespec.engine.generate import PairRuntime
from homespec.manifest import PairSpec
from tests.fake_target import FakeTarget


def runtime(wrong_every: int | None) -> PairRuntime:
    spec = PairSpec(target="t", draft="d", draft_tokens=6)
    draft = (
        None
        if wrong_every is None
        else ModelDrafter(FakeTarget(decode_s=0, wrong_every=wrong_every))
    )
    return PairRuntime("p", spec, FakeTarget(decode_s=0), draft, NgramDrafter())


@pytest.mark.parametrize(("wrong_every", "share"), [(0, 1.0), (4, 0.75), (2, 0.5)])
def test_agreement_is_the_share_of_next_tokens_the_draft_predicts_as_the_target_does(
    wrong_every: int, share: float
) -> None:
    """The fake draft predicts a different byte at every `wrong_every`-th answer position."""
    assert AGREEMENT_POSITIONS % 4 == 0  # so the shares below are exact
    assert agreement(runtime(wrong_every)) == share


def test_calibration_sets_costs_and_the_draft_models_prior_and_leaves_the_caches_empty() -> None:
    rt = runtime(4)
    calibrate(rt)
    assert rt.ledger.agreement == 0.75
    assert rt.ledger.acceptance("new")["model"].prior == 0.75
    assert rt.ledger.verify.at(1) is not None and rt.ledger.draft_ms is not None
    assert rt.target.tokens == [] and rt.draft is not None and rt.draft.ctx.tokens == []
    # Every cost measured now is the quiet one the machine's slowdown is measured against.
    assert rt.ledger.quiet.points == rt.ledger.verify.points
    assert rt.ledger.slowdown == rt.ledger.draft_ref == 1.0
    assert rt.ledger.verify_ref == dict.fromkeys(rt.ledger.verify.points, 1.0)


def test_a_pair_without_a_draft_model_measures_no_agreement() -> None:
    rt = runtime(None)
    calibrate(rt)
    assert agreement(rt) is None and rt.ledger.agreement is None
    assert rt.ledger.verify.at(1) is not None
