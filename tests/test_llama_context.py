"""LlamaContext.extend on the real demo target: the logits it hands out, and the work it runs
while a decode is in flight."""

from __future__ import annotations

import numpy as np
import pytest

from homespec.engine.loader import LoadedPair


def test_logits_are_a_read_only_view_of_the_latest_decode(demo_pair: LoadedPair) -> None:
    """extend() hands out llama.cpp's own buffer (a verify step reads a few of its rows, and
    copying all of them cost more than a GPU's verify): read-only, and what a fresh decode of
    the same positions computes."""
    ctx = demo_pair.runtime.target
    history = ctx.model.tokenize("The capital of France is Paris. The capital of", special=True)
    ctx.clear()
    rows = ctx.extend(history, 4)
    assert rows.shape == (4, demo_pair.runtime.target.model.n_vocab)  # type: ignore[attr-defined]
    assert not rows.flags.writeable
    with pytest.raises(ValueError):
        rows[0, 0] = 0.0
    kept = rows.copy()
    ctx.clear()
    for i in range(4):  # one position at a time: the same logits, up to batching's last bits
        one = ctx.extend(history[: len(history) - 3 + i], 1)
        assert int(np.argmax(one[0])) == int(np.argmax(kept[i]))
        # Batching moves logits by ~0.01; another position's row differs by whole units.
        np.testing.assert_allclose(one[0], kept[i], atol=0.1)
        assert np.abs(kept[i] - kept[(i + 1) % 4]).max() > 1.0


def test_work_given_to_run_while_a_decode_runs_runs_once_and_changes_no_logit(
    demo_pair: LoadedPair,
) -> None:
    """extend()'s `while_waiting` (a standing step's lookup, run while a GPU decodes) runs once
    per extend, after the decode is queued, and the logits are those of an extend without it;
    where it fails, the error comes through and the context decodes on as before."""
    ctx = demo_pair.runtime.target
    history = ctx.model.tokenize("The capital of France is Paris. The capital of", special=True)
    ctx.clear()
    kept = ctx.extend(history, 2).copy()
    ctx.clear()
    ran: list[int] = []
    rows = ctx.extend(history, 2, lambda: ran.append(len(ctx.tokens)))
    assert ran == [len(history)]  # once, with every position queued
    np.testing.assert_array_equal(rows, kept)

    def fails() -> None:
        raise RuntimeError("a bug in the lookup")

    ctx.clear()
    with pytest.raises(RuntimeError, match="a bug in the lookup"):
        ctx.extend(history, 2, fails)
    np.testing.assert_array_equal(ctx.extend(history, 2), kept)
