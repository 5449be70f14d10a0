"""How many CPU threads llama.cpp should use right now, on a box it shares. Pure: no psutil, no
clock; the engine's `ThreadAdapter` (engine/neighbours.py) feeds it measurements.

llama.cpp's CPU threads meet at a barrier after every operation of a decode, so one thread that
the kernel descheduled for a neighbour stalls all the others: with one CPU-bound process beside
a 2-thread decode on 2 cores, answers ran 100× slower; with 1 thread, at full speed. So the
engine runs as many threads as there are cores its neighbours leave free, and no more:

    free cores = cores - CPU the other processes (and the hypervisor's steal) took lately
    threads    = one per core at least half free, within 1 … the pair's threads

It drops at once (a stall costs far more than a thread) and goes back up only after RAISE_AFTER
calm samples in a row (hysteresis, so a neighbour's short burst does not make it flap).

The neighbours' share alone is ambiguous: beside a 2-thread decode, a CPU-bound process gets
only ~0.4 of a core (the decode's threads take the rest, and stall), while idle servers whose
threads spin briefly show ~0.3 and cost nothing. So the second signal decides: decodes at full
threads SLOW times their quiet cost (or CONTENDED times, with a neighbour measurably there)
drop one thread, which comes back only after a hold that doubles each time it proved wrong.
That also catches what the neighbour count cannot see (a cgroup quota, a noisy host).
"""

from __future__ import annotations

from dataclasses import dataclass

FREE_SHARE = 0.5  # a core at least this free counts for a thread
RAISE_AFTER = 3  # calm samples in a row before one more thread
SLOW = 4.0  # decodes this many times their quiet cost at full threads: something is stalling
CONTENDED = 2.0  # … or this many times, while the neighbours take at least NOTICEABLE cores
NOTICEABLE = 0.2
HOLD_S = 10.0  # after a slowdown drop, how long before the thread may come back (doubles)
HOLD_MAX_S = 300.0


@dataclass(frozen=True)
class Sample:
    """What the engine measured over its last window (about a second of decoding)."""

    now: float  # seconds, any monotonic clock
    cores: int  # the machine's cores (physical)
    others: float  # cores' worth of CPU that other processes and steal took over the window
    slowdown: float | None  # median decode time ÷ its quiet cost at full threads; None: unknown


@dataclass(frozen=True)
class ThreadState:
    threads: int  # what llama.cpp uses now
    reason: str = ""  # why, when below the pair's threads
    calm: int = 0  # calm samples in a row
    hold_until: float = 0.0  # no raise before this (after a slowdown drop)
    hold_s: float = HOLD_S  # the next hold's length


def fit(max_threads: int, cores: int, others: float) -> int:
    """One thread per core the neighbours leave free; a core counts when at least FREE_SHARE of
    it is free."""
    free = cores - others
    return max(1, min(max_threads, int(free + 1 - FREE_SHARE + 1e-9)))


def next_threads(max_threads: int, state: ThreadState, s: Sample) -> ThreadState:
    """The thread count for the next decodes, from the last window's measurements."""
    want = fit(max_threads, s.cores, s.others)
    busy = f"other processes use {s.others:.1f} of {s.cores} cores"
    cur = state.threads
    hold = (state.hold_until, state.hold_s)
    slow = s.slowdown is not None and (
        s.slowdown >= SLOW or (s.slowdown >= CONTENDED and s.others >= NOTICEABLE)
    )
    if slow and cur == max_threads and cur > 1:
        why = f"decodes {s.slowdown:.1f}× slower than quiet at {cur} threads"
        if s.others >= NOTICEABLE:
            why += f", other processes use {s.others:.1f} of {s.cores} cores"
        return ThreadState(cur - 1, why, 0, s.now + state.hold_s, min(HOLD_MAX_S, 2 * state.hold_s))
    if want < cur:
        return ThreadState(want, busy, 0, *hold)
    if want == cur:
        if cur == max_threads:
            if s.now > state.hold_until + HOLD_MAX_S:
                hold = (0.0, HOLD_S)  # quiet for long at full threads: forget past holds
            return ThreadState(cur, "", 0, *hold)
        # Still held down by the neighbours: say how busy they are now.
        reason = busy if state.reason.startswith("other processes") else state.reason
        return ThreadState(cur, reason, 0, *hold)
    calm = state.calm + 1
    if calm < RAISE_AFTER or s.now < state.hold_until:
        return ThreadState(cur, state.reason, calm, *hold)
    up = cur + 1
    return ThreadState(up, "" if up == max_threads else busy, 0, *hold)
