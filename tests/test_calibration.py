"""What a pair measures about itself at load (engine/calibration.py), on the scripted fake:
decode costs and the draft model's agreement with the target."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from homespec.engine import calibration
from homespec.engine.calibration import (
    AGREEMENT_POSITIONS,
    agreement,
    calibrate,
    decode_costs,
    finish,
    lock_file,
    measure_steps,
    one_at_a_time,
    release,
    uneven,
)
from homespec.engine.drafters import ModelDrafter, NgramDrafter
from homespec.engine.estimates import VERIFY_SIZES
from homespec.engine.protocol import (
    AttachDraft,
    DraftAttached,
    DraftHandedOver,
    Finished,
    Generate,
    Remeasured,
    Steps,
)
from homespec.engine.runtime import PairRuntime
from homespec.engine.types import GenerationRequest, Message
from homespec.manifest import PairSpec
from tests.daemon_process import fake_engine
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


def test_measure_steps_finds_each_options_own_work_and_teaches_nothing() -> None:
    """doctor --measure's two short answers: a question (plain steps on the fake) and a text
    to repeat (n-gram lookup drafts it from the prompt) leave what a step costs beyond its
    decodes in the ledger, by option, and no acceptance, answer length or memory behind. (An
    n-gram pair, whose 2-ms decodes cost the same at any size: with a draft model and no
    decode time, noise in the timings decided which drafter ran.)"""
    spec = PairSpec(target="t", draft="ngram")
    rt = PairRuntime("p", spec, FakeTarget(decode_s=0.002), None, NgramDrafter())
    calibrate(rt)
    measure_steps(rt)
    assert {"none", "ngram"} <= set(rt.ledger.overhead)
    assert all(ms >= 0 for ms in rt.ledger.overhead.values())
    tables = rt.ledger.by_task.values()
    assert not any(acc.tries[0] for table in tables for acc in table.values())
    assert rt.ledger.lengths.answers == {} and rt.ledger.shares == {}
    assert rt.target.tokens == []


def test_measure_steps_skips_an_answer_its_context_cannot_hold() -> None:
    """The repeat prompt (the agreement chat's answer, in the fake's bytes) does not fit a
    300-token context; the question does: one answer measured, no error."""
    spec = PairSpec(target="t", draft="ngram")
    rt = PairRuntime("p", spec, FakeTarget(decode_s=0.002, n_ctx=300), None, NgramDrafter())
    calibrate(rt)
    measure_steps(rt)
    assert rt.ledger.overhead and rt.target.tokens == []


def test_a_pair_without_a_draft_model_measures_no_agreement() -> None:
    rt = runtime(None)
    calibrate(rt)
    assert agreement(rt) is None and rt.ledger.agreement is None
    assert rt.ledger.verify.at(1) is not None


def test_uneven_sizes_are_the_ones_a_quiet_machine_could_not_have_measured() -> None:
    quiet = {1: 10.0, 2: 16.0, 4: 19.0, 8: 25.0, 16: 38.0, 32: 65.0}
    assert uneven(quiet) == set()
    # Measured beside another engine starting up (both seen in one daemon's log):
    # (each measured again; a size it leaves alone, like 8 here, is looked at again after)
    assert uneven({1: 28.5, 2: 25.7, 4: 134.0, 8: 88.8, 16: 102.8, 32: 69.5}) == {1, 4, 16}
    # Busy evenly (one token at 15 ms that takes 10) looks even: Ledger.calibrated_busy
    # finds that from the requests' steps.
    assert uneven({1: 15.3, 2: 29.1, 4: 37.7, 8: 55.2, 16: 82.3, 32: 365.3}) == {32}
    # A flat curve (a GPU) is even; a little noise is allowed.
    assert uneven({1: 2.1, 8: 2.0, 64: 3.7}) == set()


class ScriptedTarget:
    """A target whose decode of n new tokens takes the next of `ms[n]`, on a fake clock."""

    n_outputs_max = 64
    n_ctx = 1024

    def __init__(self, ms: dict[int, list[float]], clock: list[float]) -> None:
        self.ms, self.clock = ms, clock
        self.tokens: list[int] = []

    def clear(self) -> None:
        self.tokens = []

    def extend(self, history: list[int], n_logits: int = 1) -> None:
        common = 0
        while (
            common < min(len(self.tokens), len(history) - 1)
            and self.tokens[common] == history[common]
        ):
            common += 1
        n = len(history) - common
        script = self.ms.get(n, [1.0])
        self.clock[0] += (script.pop(0) if len(script) > 1 else script[0]) / 1000.0
        self.tokens = list(history)


def test_a_size_measured_unevenly_is_measured_again(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(calibration.time, "perf_counter", lambda: clock[0])
    # Size 4's first two tries ran beside a neighbour's burst; later ones are quiet.
    script = {1: [10.0], 2: [16.0], 4: [130.0, 120.0, 19.0], 8: [25.0]}
    costs = decode_costs(ScriptedTarget(script, clock), [7] * 32, [7], (1, 2, 4, 8), True)  # type: ignore[arg-type]
    assert costs == pytest.approx({1: 10.0, 2: 16.0, 4: 19.0, 8: 25.0})
    # A machine busy throughout stays as measured, after RETRIES more tries.
    busy = {1: [10.0], 2: [16.0], 4: [130.0], 8: [25.0]}
    costs = decode_costs(ScriptedTarget(busy, clock), [7] * 32, [7], (1, 2, 4, 8), True)  # type: ignore[arg-type]
    assert costs[4] == pytest.approx(130.0)


def test_costs_measured_on_a_busy_machine_are_measured_again_between_requests(
    tmp_path: Path,
) -> None:
    """The engine program over the fake target: its first calibration ran at 4× the decode
    time (a busy machine); the first request's steps run at 1×, so the engine measures again
    after it, tells the daemon (Remeasured, with the new costs), and not after the next."""
    env = {"HOMESPEC_FAKE_DECODE_S": "0.004", "HOMESPEC_FAKE_BUSY_CALIBRATION": "1"}

    def recv() -> object:
        assert conn.poll(30), "the engine said nothing for 30 s"
        return conn.recv()

    def answer(rid: str) -> None:
        conn.send(Generate(rid, req, 10.0, True))
        while not isinstance(msg := recv(), Finished):
            assert isinstance(msg, Steps) and msg.rid == rid, msg
        assert msg.rid == rid and msg.stats is not None

    req = GenerationRequest(
        messages=[Message("user", "hello there")], max_tokens=24, speculative=False
    )
    with fake_engine(tmp_path, env) as conn:
        conn.send(AttachDraft())
        handed = recv()  # the draft serves; its costs are measured next
        assert isinstance(handed, DraftHandedOver) and handed.info.draft_loaded
        attached = recv()
        assert isinstance(attached, DraftAttached)
        busy = attached.info.verify_ms[1]
        answer("a")
        again = recv()
        assert isinstance(again, Remeasured), again
        assert again.info.verify_ms[1] < busy / 2
        answer("b")  # its steps run as measured now: nothing more
        answer("c")


def test_each_finished_request_carries_the_costs_the_governor_prices_now(
    tmp_path: Path,
) -> None:
    """The engine program over the fake target: a governed request's Finished holds the
    decode costs at calibration's sizes as they are now, and what each option's steps cost
    beyond their decodes (the daemon's status shows the latest)."""
    with fake_engine(tmp_path, {"HOMESPEC_FAKE_DECODE_S": "0.002"}) as conn:
        req = GenerationRequest(messages=[Message("user", "hello there")], max_tokens=24)
        conn.send(Generate("a", req, 10.0, True))
        for _ in range(100):
            assert conn.poll(30), "the engine said nothing for 30 s"
            if isinstance(msg := conn.recv(), Finished):
                break
        assert isinstance(msg, Finished) and msg.stats is not None, msg
        assert msg.costs is not None
        assert set(msg.costs.verify_ms) <= set(VERIFY_SIZES) and msg.costs.verify_ms[1] > 0
        assert "plain" in msg.costs.step_ms and msg.costs.step_ms["plain"] >= 0
        assert set(msg.costs.step_ms) <= {"plain", "n-gram", "draft model"}


def test_engines_of_one_machine_measure_one_after_another(tmp_path: Path) -> None:
    """The lock `calibrating` takes (flock on a file in the cache directory): a second engine
    waits for the first to finish, yielding while it waits (its requests run meanwhile), or
    measures beside it after the timeout."""
    lock = tmp_path / "calibrating.lock"
    first_done = threading.Event()
    taken = threading.Event()

    def first() -> None:
        with lock_file(lock) as handle:
            assert finish(one_at_a_time(handle))
            taken.set()
            time.sleep(0.3)
            release(handle)
        first_done.set()

    t = threading.Thread(target=first)
    t.start()
    taken.wait(5)
    with lock_file(lock) as handle:
        assert finish(one_at_a_time(handle, timeout_s=0.05)) is False  # gave up: still held
        t0 = time.monotonic()
        waiting = one_at_a_time(handle, timeout_s=5)
        pauses = 0
        with pytest.raises(StopIteration) as done:
            while True:
                next(waiting)
                pauses += 1
        assert done.value.value is True and first_done.is_set()  # waited for the first
        assert time.monotonic() - t0 > 0.1 and pauses >= 2
        release(handle)
    t.join()
    with lock_file(None) as handle:  # no cache directory: nothing to wait for
        assert handle is None and finish(one_at_a_time(handle)) is None


def test_requests_run_between_the_pieces_of_a_measurement_and_count_their_wait(
    tmp_path: Path,
) -> None:
    """The engine program over the fake target (20-ms decodes: its measurement takes about
    1.5 s, in pieces of a few decodes): requests sent back to back from the moment the draft
    attaches all finish while the costs are still being measured (DraftAttached comes after
    them; DraftHandedOver, before it, as the draft starts to serve), each having waited at
    most a piece or two, and that wait is in its Finished, the daemon's queue_ms."""
    req = GenerationRequest(
        messages=[Message("user", "hello there")], max_tokens=4, speculative=False
    )
    waits: list[float] = []
    t0 = time.monotonic()
    with fake_engine(tmp_path, {"HOMESPEC_FAKE_DECODE_S": "0.02"}) as conn:
        conn.send(AttachDraft())
        handed = attached = None
        for i in range(200):
            conn.send(Generate(str(i), req, 10.0, True))
            while True:
                assert conn.poll(30), "the engine said nothing for 30 s"
                msg = conn.recv()
                if isinstance(msg, DraftHandedOver):
                    handed = msg
                elif isinstance(msg, DraftAttached):
                    assert handed is not None  # the daemon heard the draft serves first
                    attached = msg
                elif isinstance(msg, Finished):
                    break
            assert msg.stats is not None, msg
            if attached is not None:
                break
            waits.append(msg.waited_ms)
        measured_s = time.monotonic() - t0
    assert attached is not None and attached.info.verify_ms  # the costs were measured
    assert len(waits) >= 5, waits  # requests ran while it measured
    assert max(waits) < 400, waits  # a piece, not the whole (over a second)
    assert measured_s > 1.0 and any(w > 5 for w in waits), (measured_s, waits)


def test_a_measurement_replaces_the_costs_measured_before_it_keeping_those_since() -> None:
    """Sizes that requests measured before the calibration (a daemon's first requests, served
    while the draft loaded beside them, left 17 tokens at 268 ms beside 16 at 64) go; the
    calibrated sizes are as measured; a size a request measured between its pieces stays."""
    rt = runtime(4)
    rt.ledger.verify.observe(17, 268.0)
    rt.ledger.verify.observe(1, 500.0)
    assert rt.draft is not None
    rt.ledger.draft.observe(300, 9000.0)
    pieces = calibration.calibrating(rt)
    next(pieces)
    rt.ledger.verify.observe(11, 40.0)  # a request between two pieces
    finish(pieces)
    assert 17 not in rt.ledger.verify.points and 300 not in rt.ledger.draft.points
    assert rt.ledger.verify.points[11] == 40.0 and rt.ledger.verify.points[1] < 500.0
    assert set(rt.ledger.verify.points) == {*VERIFY_SIZES, 11}
    assert rt.ledger.quiet.points == rt.ledger.verify.points


def _requests_until_measured(tmp_path: Path, piece_every_s: str, cap: int) -> int | None:
    """Requests the fake engine answers, two always waiting in its queue, until the costs are
    measured (DraftAttached), None if not within `cap`."""
    req = GenerationRequest(
        messages=[Message("user", "hello there")], max_tokens=4, speculative=False
    )
    env = {"HOMESPEC_FAKE_DECODE_S": "0.005", "HOMESPEC_FAKE_PIECE_EVERY_S": piece_every_s}
    tmp_path.mkdir()
    with fake_engine(tmp_path, env) as conn:
        conn.send(AttachDraft())
        conn.send(Generate("0", req, 10.0, True))
        conn.send(Generate("1", req, 10.0, True))
        sent, answered = 2, 0
        while answered < cap:
            assert conn.poll(30), "the engine said nothing for 30 s"
            msg = conn.recv()
            if isinstance(msg, DraftAttached):
                return answered
            if isinstance(msg, Finished):
                answered += 1
                conn.send(Generate(str(sent), req, 10.0, True))  # the queue never empties
                sent += 1
        return None


def test_a_measurement_goes_on_while_requests_keep_coming(tmp_path: Path) -> None:
    """Under requests back to back (two always waiting, as three clients of one daemon kept
    it), the engine's queue is never empty when it looks: a piece of the measurement still
    runs every PIECE_EVERY_S, so the costs get measured; without that it never did."""
    answered = _requests_until_measured(tmp_path / "a", "0.02", cap=400)
    assert answered is not None and answered > 5  # requests ran between its pieces
    assert _requests_until_measured(tmp_path / "b", "1000", cap=2 * answered + 20) is None
