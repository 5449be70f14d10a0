"""Flash attention on the CPU, measured per machine and model (engine/flash.py): the decision
on synthetic timings, the measurement's shape on a scripted target, and the verdict kept in
the cache so only the first load pays for it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from homespec.engine import flash
from homespec.engine.flash import (
    BATCH_CAP_MS,
    FULL_BATCH,
    PLAIN_STEPS,
    VERIFY_STEPS,
    Costs,
    FlashVerdict,
    decide,
    decide_batch,
)
from homespec.engine.loader import load_pair
from homespec.engine.repack import cache_key, remember
from homespec.footprint import KQ_FACTOR, estimate, kv_cells
from homespec.gguf_meta import read_gguf
from homespec.manifest import Manifest, PairSpec
from homespec.pairs import cpu_flash
from tests.conftest import write_tiny_gguf
from tests.fake_target import FakeTarget

OFF: Costs = {"prompt": 430.0, "decode": 13.5, "verify": 25.5}


def test_faster_everywhere_turns_it_on() -> None:
    yes, why = decide(OFF, {k: ms * 0.9 for k, ms in OFF.items()})
    assert yes and why.startswith(
        "flash attention on: with it a request took 0.90× its time without"
    )


def test_a_faster_prompt_outweighs_slower_verifies_as_a_request_is_made() -> None:
    # As measured on a 2-core AVX-512 EPYC, where the workload ran 3.5-8% faster with it.
    on = {"prompt": 371.0, "decode": 13.1, "verify": 27.8}
    yes, why = decide(OFF, on)
    assert yes and "verify 1.09×" in why


def test_one_token_decodes_that_slow_down_keep_it_off_whatever_the_prompt_saves() -> None:
    # As measured where it hurt: 50 against 28 ms a token at 800 tokens of context.
    on = {"prompt": 300.0, "decode": 13.5 * 50 / 28, "verify": 25.5}
    assert not decide(OFF, on)[0]


def test_a_gain_within_the_margin_is_not_worth_leaving_the_known_setting() -> None:
    assert not decide(OFF, {k: ms * 0.98 for k, ms in OFF.items()})[0]
    assert PLAIN_STEPS > VERIFY_STEPS > 0  # an answer is mostly steps, as a request's is


class Scratch(FakeTarget):
    def __init__(self, on: bool, made: list[tuple[bool, Scratch]], n_batch: int = 512) -> None:
        super().__init__(
            n_ctx=max(flash.PROMPT, flash.DEPTH, flash.LONG) + 8, n_outputs_max=8, decode_s=0.0
        )
        self.closed = False
        self.n_batch = n_batch
        made.append((on, self))

    def close(self) -> None:
        self.closed = True


def scratches(made: list[tuple[bool, Scratch]]) -> Callable[[bool, int], Scratch]:
    """What the loader hands flash.verdict: a scratch context per (flash, n_batch), kept."""
    return lambda on, n_batch: Scratch(on, made, n_batch)


def model_file(tmp_path: Path) -> Path:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    return model


class Meter:
    """What flash.verdict reads other processes' CPU with: `cores` (None: it read nothing)."""

    def __init__(self, cores: float | None) -> None:
        self.cores = cores
        self.resumed = False

    def resume(self) -> None:
        self.resumed = True

    def others(self) -> float | None:
        assert self.resumed, "read before the measurement started"
        return self.cores


QUIET_BOX: dict[str, Any] = {"quiet": lambda _: 0.0, "meter": lambda: Meter(0.0)}


def test_each_setting_is_measured_in_a_context_of_its_own() -> None:
    made: list[tuple[bool, Scratch]] = []
    times = flash.measure(scratches(made), [7])
    assert [on for on, _ in made] == [False, True]
    assert all(ctx.closed for _, ctx in made)
    assert set(times[False]) == set(times[True]) == {"prompt", "decode", "verify"}


def test_the_smaller_batch_that_was_clearly_faster_on_a_long_prompt_is_kept() -> None:
    # As timed on the 2-core Xeon: a long prompt without flash attention.
    n_batch, why = decide_batch({512: 1500.0, 128: 1250.0, 64: 1100.0})
    assert n_batch == 64
    assert why.startswith("64-token batches: a prompt of 800 tokens took 0.73×")
    assert "512: 1500 ms, 128: 1250 ms, 64: 1100 ms" in why


def test_the_full_batch_stays_unless_a_smaller_one_gains_more_than_the_margin() -> None:
    assert decide_batch({512: 1000.0, 128: 990.0, 64: 1010.0})[0] == FULL_BATCH
    assert decide_batch({512: 900.0, 128: 1000.0, 64: 1100.0})[0] == FULL_BATCH
    assert decide_batch({512: 1000.0, 128: 900.0, 64: 900.0})[0] == 128  # a tie: the bigger


def test_each_batch_size_is_timed_in_a_context_of_its_own_and_the_fastest_again() -> None:
    made: list[tuple[bool, Scratch]] = []
    ms = flash.measure_batches(scratches(made), [7])
    assert set(ms) == set(flash.BATCHES)
    assert [ctx.n_batch for _, ctx in made][: len(flash.BATCHES)] == list(flash.BATCHES)
    assert len(made) == len(flash.BATCHES) + 2  # the two fastest, once more
    assert all(not on and ctx.closed for on, ctx in made)


def test_a_model_too_slow_for_the_timing_keeps_the_full_batch_untimed() -> None:
    made: list[tuple[bool, Scratch]] = []
    slow = {**OFF, "prompt": BATCH_CAP_MS + 1}
    n_batch, why = flash.batch_verdict(scratches(made), [7], slow)
    assert n_batch == FULL_BATCH and "not timed" in why and not made
    flash.batch_verdict(scratches(made), [7], OFF)
    assert made


def test_the_verdict_is_measured_once_then_remembered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = model_file(tmp_path)
    cache = tmp_path / "canary.json"
    runs: list[int] = []

    def measure(*_: object) -> dict[bool, Costs]:
        runs.append(1)
        return {False: OFF, True: {k: ms * 0.8 for k, ms in OFF.items()}}

    monkeypatch.setattr(flash, "measure", measure)
    first = flash.verdict("m", model, scratches([]), [7], cache_file=cache, **QUIET_BOX)
    assert (first.on, first.source) == (True, "measured")
    again = flash.verdict("m", model, scratches([]), [7], cache_file=cache, **QUIET_BOX)
    assert (again.on, again.source, again.why) == (True, "remembered", first.why)
    assert runs == [1]
    (entry,) = json.loads(cache.read_text()).values()
    assert entry["on"] is True and entry["model"] == "m"
    assert entry["n_batch"] == FULL_BATCH  # flash attention writes no scores out
    # Another file (or the same one rewritten) is another model: measured afresh.
    model.write_bytes(b"GGUF again")
    again = flash.verdict("m", model, scratches([]), [7], cache_file=cache, **QUIET_BOX)
    assert again.source == "measured"
    assert runs == [1, 1]


def test_a_verdict_timed_on_a_busy_machine_is_provisional_until_a_quiet_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Other processes' CPU while timing (four servers starting beside it put a 256-token
    prompt over BATCH_CAP_MS): the verdict is kept, marked, and timed again at the first
    load that finds the machine quiet; a load that finds it busy keeps it without waiting."""
    monkeypatch.setattr(flash, "cache_dir", lambda: tmp_path)
    model = model_file(tmp_path)
    cache = tmp_path / flash.CACHE_NAME
    runs: list[int] = []

    def batches(*_: object) -> dict[int, float]:
        runs.append(1)
        return {512: 1900.0, 128: 1500.0, 64: 1600.0}

    monkeypatch.setattr(flash, "measure", lambda *_: {False: OFF, True: OFF})
    monkeypatch.setattr(flash, "measure_batches", batches)
    waits: list[float] = []

    def box(before: float | None, during: float | None) -> dict[str, Any]:
        def quiet(max_s: float) -> float | None:
            waits.append(max_s)
            return before

        return {"quiet": quiet, "meter": lambda: Meter(during)}

    def timed(before: float | None, during: float | None) -> FlashVerdict:
        make = scratches([])
        return flash.verdict("m", model, make, [7], cache_file=cache, **box(before, during))

    first = timed(1.5, 1.2)  # waited QUIET_WAIT_S in vain, then timed busy
    assert (first.on, first.n_batch, first.busy, first.source) == (False, 128, 1.2, "measured")
    assert waits == [flash.QUIET_WAIT_S] and runs == [1]
    assert "took 1.2 cores" in caplog.text and "timed again" in caplog.text
    assert flash.remembered_batch(model, cache_file=cache) == 128  # used meanwhile
    assert "(provisional: timed while other processes took 1.2 cores;" in flash.describe(
        "auto", model
    )
    # Still busy at the next load: one look, no timing, the provisional verdict stands.
    assert timed(0.9, None) == replace(first, source="remembered")
    assert waits[1:] == [0.0] and runs == [1]
    # Quiet: timed again, and this one is final (no look at later loads).
    again = timed(0.1, flash.QUIET - 0.1)
    assert again == replace(first, busy=None) and runs == [1, 1]
    assert timed(None, None) == replace(again, source="remembered")
    assert waits[2:] == [0.0] and runs == [1, 1]


def test_without_flash_attention_the_batch_size_is_timed_and_remembered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = model_file(tmp_path)
    cache = tmp_path / "flash.json"
    timed: list[int] = []

    def batches(*_: object) -> dict[int, float]:
        timed.append(1)
        return {512: 1900.0, 128: 1550.0, 64: 1400.0}

    monkeypatch.setattr(flash, "measure", lambda *_: {False: OFF, True: OFF})
    monkeypatch.setattr(flash, "measure_batches", batches)
    made: list[tuple[bool, Scratch]] = []
    first = flash.verdict("m", model, scratches(made), [7], cache_file=cache, **QUIET_BOX)
    assert (first.on, first.n_batch) == (False, 64) and "0.74×" in first.batch_why
    again = flash.verdict("m", model, scratches(made), [7], cache_file=cache, **QUIET_BOX)
    assert again == replace(first, source="remembered") and timed == [1]
    assert flash.remembered_batch(model, cache_file=cache) == 64
    # A verdict remembered before batch sizes were timed is measured again, batch and all.
    data = json.loads(cache.read_text())
    for entry in data.values():
        del entry["n_batch"]
    cache.write_text(json.dumps(data))
    assert flash.remembered_batch(model, cache_file=cache) == FULL_BATCH
    assert flash.verdict("m", model, scratches(made), [7], cache_file=cache, **QUIET_BOX) == (first)
    assert timed == [1, 1]
    # A damaged entry (no object) is none either: measured again, where it was a traceback.
    cache.write_text(json.dumps(dict.fromkeys(data, "on")))
    assert flash.remembered(model, cache_file=cache) is None
    assert flash.remembered_batch(model, cache_file=cache) == FULL_BATCH
    assert flash.verdict("m", model, scratches(made), [7], cache_file=cache, **QUIET_BOX) == (first)
    assert timed == [1, 1, 1]


def test_a_cpu_pair_measures_once_and_both_models_load_as_measured(
    demo_manifest: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(flash, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(flash, "QUIET", float("inf"))  # remembered however busy the box
    with load_pair(demo_manifest, "smollm2") as first:
        verdict = first.held.flash
        assert verdict is not None and verdict.source == "measured"
        assert [c.flash_attn for c in first.held.contexts] == [verdict.on, verdict.on]
        n_batch = FULL_BATCH if verdict.on else verdict.n_batch
        assert [c.n_batch for c in first.held.contexts] == [n_batch, n_batch]
    with load_pair(demo_manifest, "smollm2", load_draft=False) as again:
        assert again.held.flash == replace(verdict, source="remembered")
        assert again.held.contexts[0].flash_attn is verdict.on
    forced = demo_manifest.spec.pairs["smollm2"].model_copy(update={"flash_attn": "off"})
    monkeypatch.setitem(demo_manifest.spec.pairs, "smollm2", forced)
    with load_pair(demo_manifest, "smollm2", load_draft=False) as off:
        assert off.held.flash is None  # models.toml decides: nothing measured or read
        assert off.held.contexts[0].flash_attn is False
        assert off.held.contexts[0].n_batch == FULL_BATCH


def test_a_pair_decodes_in_the_batches_this_machine_measured(
    demo_manifest: Manifest, target_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A remembered 64-token batch: both contexts decode at most 64 tokens at once, so a
    verify holds 63 drafts at most, and a prompt ten batches long reads as it does in one."""
    from homespec.engine.generate import complete
    from homespec.engine.types import GenerationRequest, Message

    monkeypatch.setattr(flash, "cache_dir", lambda: tmp_path)
    target = target_path
    entry = {"on": False, "why": "timed", "n_batch": 64, "batch_why": "64-token batches"}
    remember(tmp_path / flash.CACHE_NAME, flash.CACHE_PREFIX + cache_key(target, 0), entry, target)
    prompt = "The quick brown fox jumps over the lazy dog. " * 70  # ~700 tokens
    ask = GenerationRequest(
        messages=[Message("user", prompt)], max_tokens=40, drafter="ngram", draft_tokens=64
    )
    with load_pair(demo_manifest, "smollm2") as loaded:
        assert [c.n_batch for c in loaded.held.contexts] == [64, 64]
        assert loaded.runtime.target.n_outputs_max == 64
        text, stats = complete(loaded.runtime, ask)
    assert stats.prompt_tokens > 10 * 64 and stats.completion_tokens == 40
    assert "lazy dog" in text
    assert stats.draft_steps and stats.proposed_tokens <= 63 * stats.draft_steps


def test_the_plan_counts_no_attention_scores_where_flash_attention_is_on(tmp_path: Path) -> None:
    info = read_gguf(write_tiny_gguf(tmp_path / "tiny.gguf"))
    without = estimate(info, n_ctx=256, n_outputs=1)
    with_it = estimate(info, n_ctx=256, n_outputs=1, flash=True)
    assert with_it.weights == without.weights and with_it.kv == without.kv
    scores = 256 * kv_cells(256) * info.n_head * 4 * KQ_FACTOR
    assert sum(without.compute.values()) - sum(with_it.compute.values()) == pytest.approx(scores)


def test_the_plan_expects_flash_attention_as_models_toml_or_this_machine_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(flash, "cache_dir", lambda: tmp_path)
    model = model_file(tmp_path)
    auto = PairSpec(target="t", draft="d")
    on, off = (auto.model_copy(update={"flash_attn": v}) for v in ("on", "off"))
    assert (cpu_flash(on, model), cpu_flash(off, model)) == (True, False)
    assert cpu_flash(auto, model) is False  # not measured yet: planned without it (more memory)
    key = flash.CACHE_PREFIX + cache_key(model, 0)
    remember(tmp_path / flash.CACHE_NAME, key, {"on": True}, model)
    assert cpu_flash(auto, model) is True
