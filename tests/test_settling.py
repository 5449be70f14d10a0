"""The daemon's gate for after-load work (daemon/settling.py): after a pair's queued requests,
and one pair at a time."""

from __future__ import annotations

import asyncio

import pytest

from homespec.daemon import settling
from homespec.daemon.settling import Settling


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settling, "QUIET_S", 0.05)


def test_one_pair_at_a_time_the_next_once_the_first_says_it_is_done() -> None:
    async def main() -> list[str]:
        gate = Settling()
        said: list[str] = []

        def start(name: str) -> bool:
            said.append(f"{name} starts")
            return True

        first = asyncio.create_task(gate.run("a", lambda: False, lambda: start("a")))
        await asyncio.sleep(0.1)
        second = asyncio.create_task(gate.run("b", lambda: False, lambda: start("b")))
        await asyncio.sleep(0.2)
        said.append("a done")
        gate.finished("a")  # the engine's DraftAttached
        await first
        await asyncio.sleep(0.1)
        gate.finished("b")
        await second
        return said

    assert asyncio.run(main()) == ["a starts", "a done", "b starts"]


def test_the_work_waits_for_the_pairs_own_requests() -> None:
    async def main() -> float:
        gate = Settling()
        busy_until = asyncio.get_running_loop().time() + 0.3
        started: list[float] = []

        def start() -> bool:
            started.append(asyncio.get_running_loop().time())
            return False  # nothing to wait for (say, the engine is gone)

        t0 = asyncio.get_running_loop().time()
        await gate.run("a", lambda: asyncio.get_running_loop().time() < busy_until, start)
        return started[0] - t0

    assert asyncio.run(main()) >= 0.3


def test_an_engine_that_never_answers_or_dies_does_not_hold_the_gate() -> None:
    async def main() -> None:
        gate = Settling(timeout_s=0.2)
        await asyncio.wait_for(gate.run("a", lambda: False, lambda: True), 2)  # times out
        second = asyncio.create_task(gate.run("b", lambda: False, lambda: True))
        await asyncio.sleep(0.15)
        gate.finished("b")  # its engine exited: the worker says so
        await asyncio.wait_for(second, 1)
        gate.finished("c")  # a pair that is not at the gate: nothing happens

    asyncio.run(main())
