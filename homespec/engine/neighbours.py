"""The engine's side of thread adaptation: measure the neighbours, apply threads.py's choice.

After each half second of decoding (idle time does not count), `ThreadAdapter.tick()` reads
how much CPU the rest of the machine took meanwhile (all CPU time but idle and iowait,
hypervisor steal included, minus this process's own) and how slow recent decodes were against
the pair's quiet cost at full threads, asks `threads.next_threads()`, and sets the new count on
every llama.cpp context between two decodes. Each change is logged; the current count and its
reason reach the response's `reason`, status and /metrics through `GenerationStats`.
"""

from __future__ import annotations

import logging
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from homespec.engine.threads import Sample, ThreadState, next_threads

LOG = logging.getLogger("homespec.engine")
WINDOW_S = 0.5  # seconds of decoding per measurement


def physical_cores() -> int:
    return max(1, psutil.cpu_count(logical=False) or psutil.cpu_count() or 1)


def _busy_s() -> float:
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


@dataclass
class CpuMeter:
    """Cores' worth of CPU the other processes took while this engine was decoding.

    Only decoding time counts (`resume()` … `pause()` around each request): what a neighbour
    does while the engine is idle cannot stall it, and a benchmark that alternates with another
    server must not read that server's turn as contention."""

    proc: psutil.Process = field(default_factory=psutil.Process)
    _base: tuple[float, float, float] | None = None
    _acc: tuple[float, float, float] = (0.0, 0.0, 0.0)  # wall, busy, own seconds

    def _read(self) -> tuple[float, float, float]:
        own = self.proc.cpu_times()
        return time.monotonic(), _busy_s(), own.user + own.system

    def resume(self) -> None:
        if self._base is None:
            self._base = self._read()

    def pause(self) -> None:
        if self._base is not None:
            now, base = self._read(), self._base
            self._acc = tuple(a + n - b for a, n, b in zip(self._acc, now, base, strict=True))  # type: ignore[assignment]
            self._base = None

    def active_s(self) -> float:
        base = self._base
        return self._acc[0] + (time.monotonic() - base[0] if base is not None else 0.0)

    def others(self) -> float | None:
        """Over the decoding time since the last call; None when there was none."""
        running = self._base is not None
        self.pause()
        wall, busy, own = self._acc
        self._acc = (0.0, 0.0, 0.0)
        if running:
            self.resume()
        return max(0.0, (busy - own) / wall) if wall > 0 else None


def wait_for_quiet(
    limit: float,
    max_s: float,
    *,
    sample_s: float = 0.25,
    meter: CpuMeter | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> float | None:
    """Until the other processes take less than `limit` cores over a `sample_s` window, at
    most `max_s`, pausing a random 0.3-1 s between windows (two engines waiting for each other
    do not look again in step). Returns the last reading: at most `limit`, or more when it gave
    up (None: the meter read nothing)."""
    meter = meter or CpuMeter()
    deadline = clock() + max_s
    while True:
        meter.resume()
        sleep(sample_s)
        others = meter.others()
        meter.pause()
        if others is None or others < limit or clock() >= deadline:
            return others
        sleep(0.3 + 0.7 * random.random())


@dataclass
class ThreadAdapter:
    """Holds the thread state of one pair's contexts; the generation loop calls observe() after
    each target decode and tick() before each step."""

    max_threads: int
    apply: Callable[[int], None]  # sets the count on every context of the pair
    quiet_ms: Callable[[int], float | None]  # quiet cost of a decode of n tokens, full threads
    cores: int = field(default_factory=physical_cores)
    meter: CpuMeter = field(default_factory=CpuMeter)
    window_s: float = WINDOW_S
    state: ThreadState = field(init=False)
    _ratios: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.state = ThreadState(self.max_threads)

    def observe(self, n_tokens: int, ms: float) -> None:
        if self.state.threads == self.max_threads:
            quiet = self.quiet_ms(n_tokens)
            if quiet:
                self._ratios.append(ms / quiet)

    def begin(self) -> None:
        """A request starts decoding: the meter runs."""
        self.meter.resume()

    def end(self) -> None:
        """The request is over (or was cancelled): idle time is not measured."""
        self.meter.pause()

    def tick(self) -> None:
        """Before a step: after each window of decoding, measure and maybe change the count."""
        if self.meter.active_s() < self.window_s:
            return
        now = time.monotonic()
        others = self.meter.others()
        if others is None:
            return
        slow = statistics.median(self._ratios) if len(self._ratios) >= 3 else None
        self._ratios = []
        new = next_threads(self.max_threads, self.state, Sample(now, self.cores, others, slow))
        if new.threads != self.state.threads:
            LOG.warning(
                "threads %d → %d: %s",
                self.state.threads,
                new.threads,
                new.reason or "the neighbours left room again",
            )
            self.apply(new.threads)
        self.state = new

    @property
    def note(self) -> str:
        """For a response's reason: empty at full threads."""
        s = self.state
        return f"threads {s.threads} of {self.max_threads} ({s.reason})" if s.reason else ""
