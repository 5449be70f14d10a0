"""Thread adaptation on a shared box: the pure decision (engine/threads.py) and the adapter's
wiring into the generation loop (engine/neighbours.py), with synthetic measurements."""

from __future__ import annotations

from homespec.engine.neighbours import CpuMeter, ThreadAdapter, wait_for_quiet
from homespec.engine.threads import (
    HOLD_S,
    RAISE_AFTER,
    Sample,
    ThreadState,
    fit,
    next_threads,
)


def run(max_threads: int, samples: list[Sample], start: int | None = None) -> list[int]:
    state = ThreadState(start or max_threads)
    out = []
    for s in samples:
        state = next_threads(max_threads, state, s)
        out.append(state.threads)
    return out


def quiet(t: float, cores: int = 2, others: float = 0.05) -> Sample:
    return Sample(t, cores, others, 1.0)


def test_fit_gives_each_thread_a_mostly_free_core() -> None:
    assert fit(2, 2, 0.05) == 2  # quiet
    assert fit(2, 2, 0.7) == 1  # one busy neighbour, sharing with our second thread
    assert fit(2, 2, 1.0) == 1
    assert fit(2, 2, 2.0) == 1  # never zero
    assert fit(8, 8, 1.0) == 7
    assert fit(4, 8, 0.0) == 4  # never more than the pair's threads


def test_a_busy_neighbour_drops_a_thread_at_once_and_says_so() -> None:
    state = next_threads(2, ThreadState(2), Sample(1.0, 2, 0.9, None))
    assert state.threads == 1
    assert "other processes use 0.9 of 2 cores" in state.reason


def test_it_comes_back_only_after_calm_samples() -> None:
    busy = [Sample(t, 2, 1.0, None) for t in range(3)]
    calm = [quiet(3.0 + t) for t in range(RAISE_AFTER)]
    threads = run(2, busy + calm)
    assert threads[:3] == [1, 1, 1]
    assert threads[3 : 3 + RAISE_AFTER - 1] == [1] * (RAISE_AFTER - 1)
    assert threads[-1] == 2


def test_a_short_burst_does_not_flap() -> None:
    # Busy, then calm samples interrupted by a burst before RAISE_AFTER: stays down.
    samples = [Sample(0, 2, 1.0, None), quiet(1), quiet(2), Sample(3, 2, 0.9, None), quiet(4)]
    assert run(2, samples) == [1, 1, 1, 1, 1]


def test_slow_decodes_drop_a_thread_and_hold_it_down() -> None:
    # The neighbours look idle (a cgroup quota, say) but decodes are 6× their quiet cost.
    state = next_threads(2, ThreadState(2), Sample(0.0, 2, 0.0, 6.0))
    assert state.threads == 1 and "6.0× slower than quiet" in state.reason
    assert state.hold_until == HOLD_S
    for t in range(1, int(HOLD_S)):  # calm, but within the hold: no raise
        state = next_threads(2, state, quiet(float(t)))
        assert state.threads == 1
    state = next_threads(2, state, quiet(HOLD_S + 1))
    assert state.threads == 2
    # Wrong again: the next hold is twice as long.
    state = next_threads(2, state, Sample(HOLD_S + 2, 2, 0.0, 6.0))
    assert state.threads == 1 and state.hold_until == HOLD_S + 2 + 2 * HOLD_S


def test_quiet_full_threads_never_change() -> None:
    assert run(4, [Sample(float(t), 4, 0.2, 1.1) for t in range(50)]) == [4] * 50


def test_one_thread_pairs_have_nothing_to_drop() -> None:
    assert run(1, [Sample(0, 2, 1.5, 9.0)]) == [1]


def test_the_adapter_applies_changes_and_reports_them() -> None:
    applied: list[int] = []
    readings = iter([1.0, 1.0, 0.0, 0.0, 0.0, 0.0])

    class Meter:
        def resume(self) -> None: ...

        def pause(self) -> None: ...

        def active_s(self) -> float:
            return 1.0

        def others(self) -> float | None:
            return next(readings)

    adapter = ThreadAdapter(2, applied.append, lambda n: 10.0, cores=2, meter=Meter())  # type: ignore[arg-type]
    for _ in range(6):
        adapter.tick()
        if adapter.state.threads == 1:
            assert adapter.note == "threads 1 of 2 (other processes use 1.0 of 2 cores)"
    assert applied == [1, 2]
    assert adapter.note == ""


def test_the_meter_counts_only_decoding_time() -> None:
    """Busy CPU while the engine is idle (another server's turn in a benchmark) is not
    contention: only the time between resume() and pause() is measured."""
    clock = iter([0.0, 1.0, 2.0, 3.0, 3.0])  # resume 0, pause 1, resume 2, read 3 (and resume)
    busy = iter([0.0, 0.2, 1.8, 2.0, 2.0])  # the machine's busy seconds
    own = iter([0.0, 0.1, 0.1, 0.2, 0.2])  # ours

    class Proc:
        def cpu_times(self) -> object:
            class T:
                user, system = next(own), 0.0

            return T()

    meter = CpuMeter(proc=Proc())  # type: ignore[arg-type]
    meter._read = lambda: (next(clock), next(busy), meter.proc.cpu_times().user)  # type: ignore[method-assign]
    meter.resume()
    meter.pause()
    meter.resume()  # between pause and here the rest of the machine took 1.6 s: not counted
    others = meter.others()
    assert others is not None and abs(others - 0.1) < 1e-9  # (0.2 + 0.2 - 0.1 - 0.1) / 2 s


def test_a_neighbours_share_alone_does_not_decide_the_decodes_do() -> None:
    # Idle servers whose threads spin now and then: a third of a core, decodes at quiet speed.
    assert run(2, [Sample(float(t), 2, 0.35, 1.1) for t in range(10)]) == [2] * 10
    # A CPU-bound process squeezed to 0.4 of a core by our own threads, decodes 2.5× slower.
    state = next_threads(2, ThreadState(2), Sample(0.0, 2, 0.4, 2.5))
    assert state.threads == 1
    assert state.reason == (
        "decodes 2.5× slower than quiet at 2 threads, other processes use 0.4 of 2 cores"
    )
    # Slow decodes without a neighbour in sight (a long context, say): not below SLOW.
    assert run(2, [Sample(float(t), 2, 0.0, 2.5) for t in range(10)]) == [2] * 10


class ScriptedMeter:
    """Cores the other processes took in each window, in turn (CpuMeter's interface)."""

    def __init__(self, readings: list[float | None]) -> None:
        self.readings = readings
        self.windows = 0

    def resume(self) -> None: ...

    def pause(self) -> None: ...

    def others(self) -> float | None:
        self.windows += 1
        return self.readings.pop(0)


def test_the_costs_wait_for_the_neighbours_quiet_window_but_not_forever() -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    def wait(readings: list[float | None], max_s: float = 10.0) -> tuple[float | None, int]:
        meter = ScriptedMeter(readings)
        got = wait_for_quiet(0.5, max_s, meter=meter, sleep=sleep, clock=lambda: now[0])  # type: ignore[arg-type]
        return got, meter.windows

    assert wait([0.1]) == (0.1, 1)  # quiet at once: one window
    assert wait([1.8, 1.9, 0.2]) == (0.2, 3)  # another engine measuring, then done
    assert wait([None]) == (None, 1)  # nothing read: go on
    # Busy throughout: it gives up after max_s and says how busy (the engine logs it).
    got, windows = wait([1.9] * 100, max_s=3.0)
    assert got == 1.9 and 2 <= windows <= 6
