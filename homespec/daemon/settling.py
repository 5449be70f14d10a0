"""When a pair does its after-load work: huge pages, the draft's load, calibration.

Each engine does that work in the background once its target serves (engine/child.py,
`AttachDraft` → `DraftAttached`), after the requests that queued up during its (re)start:
doing it while they run would slow them down on a busy CPU. And one pair at a time: two
engines doing it at once on a small box measure each other. On two cores, two engines of two
llama.cpp threads each took 3 to 4 seconds a decode (their threads spin waiting for each
other), their calibrations ran 100 s instead of 1, and the costs they measured were 300 times
the real ones. So the daemon lets one engine at a time through this gate; the others serve
their targets meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

QUIET_S = 0.3  # the work starts once the pair has had no request for this long...
MAX_DELAY_S = 30.0  # ...or after this long anyway
# Never wait on an engine longer than this (a draft on a slow disk): the next pair goes on.
SETTLE_TIMEOUT_S = 300.0


class Settling:
    def __init__(self, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._lock = asyncio.Lock()
        self._done: dict[str, asyncio.Event] = {}

    async def run(self, name: str, busy: Callable[[], bool], start: Callable[[], bool]) -> None:
        """Wait until `busy()` (requests waiting or running) has been false for QUIET_S (at
        most MAX_DELAY_S), then for the gate, then `start()` pair `name`'s work (False:
        nothing was started) and hold the gate until `finished(name)` or the timeout."""
        deadline = time.monotonic() + MAX_DELAY_S
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            if busy():
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= QUIET_S:
                break
            await asyncio.sleep(0.02)
        async with self._lock:
            done = self._done[name] = asyncio.Event()
            try:
                if start():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(done.wait(), self.timeout_s)
            finally:
                self._done.pop(name, None)

    def finished(self, name: str) -> None:
        """Pair `name`'s work is over (DraftAttached), or its engine is gone."""
        event = self._done.get(name)
        if event is not None:
            event.set()
