"""The engine's side of thread adaptation: measure the neighbours, apply threads.py's choice.

Once a second of decoding (never while idle), `ThreadAdapter.tick()` reads how much CPU the rest
of the machine took (all CPU time but idle and iowait, hypervisor steal included, minus this
process's own) and how slow recent decodes were against the pair's quiet cost at full threads,
asks `threads.next_threads()`, and sets the new count on every llama.cpp context between two
decodes. Each change is logged; the current count and its reason reach the response's
`reason`, status and /metrics through `GenerationStats`.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from homespec.engine.threads import Sample, ThreadState, next_threads

LOG = logging.getLogger("homespec.engine")
WINDOW_S = 1.0


def physical_cores() -> int:
    return max(1, psutil.cpu_count(logical=False) or psutil.cpu_count() or 1)


def _busy_s() -> float:
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


@dataclass
class CpuMeter:
    """Cores' worth of CPU the other processes took since the last read."""

    proc: psutil.Process = field(default_factory=psutil.Process)
    _last: tuple[float, float, float] | None = None

    def _read(self) -> tuple[float, float, float]:
        own = self.proc.cpu_times()
        return time.monotonic(), _busy_s(), own.user + own.system

    def start(self) -> None:
        self._last = self._read()

    def others(self) -> float | None:
        now = self._read()
        last, self._last = self._last, now
        if last is None or now[0] - last[0] <= 0:
            return None
        return max(0.0, ((now[1] - last[1]) - (now[2] - last[2])) / (now[0] - last[0]))


@dataclass
class ThreadAdapter:
    """Holds the thread state of one pair's contexts; the generation loop calls observe() after
    each target decode and tick() before each step."""

    max_threads: int
    apply: Callable[[int], None]  # sets the count on every context of the pair
    quiet_ms: Callable[[int], float | None]  # quiet cost of a decode of n tokens, full threads
    cores: int = field(default_factory=physical_cores)
    meter: CpuMeter = field(default_factory=CpuMeter)
    state: ThreadState = field(init=False)
    _ratios: list[float] = field(default_factory=list)
    _next: float = 0.0

    def __post_init__(self) -> None:
        self.state = ThreadState(self.max_threads)

    def observe(self, n_tokens: int, ms: float) -> None:
        if self.state.threads == self.max_threads:
            quiet = self.quiet_ms(n_tokens)
            if quiet:
                self._ratios.append(ms / quiet)

    def tick(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        if self._next == 0.0:
            self.meter.start()
            self._next = now + WINDOW_S
            return
        # Back from idle, the window is the idle time: what the neighbours did meanwhile.
        others = self.meter.others()
        self._next = now + WINDOW_S
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
