"""One pair inside the daemon: progressive loading, a bounded queue, generation off the event loop.

States: `starting` (target loading) → `ready` (the target serves; speculation once the draft is
attached) or `failed`. Requests run one at a time on the pair's own thread; the event loop only
moves chunks. A request that finds `max_queue` requests waiting or running is refused at once
(the HTTP layer answers 503 with Retry-After) rather than queued without bound.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from homespec.engine.generate import generate, prompt_tokens
from homespec.engine.loader import LoadedPair, attach_draft, load_pair
from homespec.engine.types import Chunk, GenerationRequest, GenerationStats
from homespec.errors import HomespecError, RequestError
from homespec.manifest import Manifest
from homespec.resources import Machine

LOG = logging.getLogger("homespec.daemon")
ROLLING = 50  # requests in the rolling accept rate
QUIET_S = 0.3  # the draft loads once the pair has had no request for this long...
MAX_DRAFT_DELAY_S = 30.0  # ...or after this long anyway


class QueueFull(Exception):
    def __init__(self, pair: str, limit: int) -> None:
        super().__init__(f"pair {pair!r} already has {limit} requests waiting or running")
        self.pair = pair


@dataclass
class Outcome:
    """How a request ended, for the log and the metrics."""

    stats: GenerationStats | None
    status: str  # ok | cancelled | error
    error: str = ""


class PairWorker:
    def __init__(
        self,
        manifest: Manifest,
        name: str,
        *,
        max_queue: int,
        on_ready: Callable[[PairWorker], None] | None = None,
    ) -> None:
        self.manifest = manifest
        self.name = name
        self.max_queue = max_queue
        self.on_ready = on_ready
        self.state = "starting"
        self.error = ""
        self.loaded: LoadedPair | None = None
        self.pending = 0  # waiting + running; touched only on the event loop
        self.served = 0
        self.recent: deque[tuple[int, int]] = deque(maxlen=ROLLING)  # (proposed, accepted)
        self.started_at = time.perf_counter()
        self.ready_after_s: float | None = None
        self.speculative_after_s: float | None = None
        self._lock = threading.Lock()  # held while generating or attaching the draft
        self._closing = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"pair-{name}")
        self._drafter = threading.Thread(
            target=self._attach_draft, name=f"draft-{name}", daemon=True
        )

    # --- loading ---------------------------------------------------------------------------

    def load_target(self, machine: Machine) -> bool:
        """Plan against `machine` and load the target (blocking; the daemon loads pairs one
        after another so each plan sees what the earlier ones took). On success the pair
        serves, and the draft loads on the pair's own thread once requests let it."""
        t0 = time.perf_counter()
        try:
            self.loaded = load_pair(self.manifest, self.name, load_draft=False, machine=machine)
        except HomespecError as err:
            self.state, self.error = "failed", str(err)
            LOG.error("pair %s failed to load: %s", self.name, err)
            return False
        except Exception as exc:  # never take the daemon down: report it on /health
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            LOG.exception("pair %s failed to load", self.name)
            return False
        self.ready_after_s = time.perf_counter() - self.started_at
        self.state = "ready"
        LOG.info(
            "pair %s: target ready after %.1f s (loaded in %.1f s), serving", self.name,
            self.ready_after_s, time.perf_counter() - t0,
        )  # fmt: skip
        if self.on_ready:
            self.on_ready(self)
        self._drafter.start()
        return True

    def _attach_draft(self) -> None:
        self._wait_for_quiet()
        if self._closing.is_set() or self.loaded is None:
            return
        try:  # loads while the target serves; hands over between requests
            attached = attach_draft(self.loaded, idle=self._lock)
        except Exception as exc:
            LOG.error("pair %s: draft failed to load, n-gram drafting only: %s", self.name, exc)
            return
        if attached:
            self.speculative_after_s = time.perf_counter() - self.started_at
            LOG.info(
                "pair %s: draft attached after %.1f s, speculative", self.name,
                self.speculative_after_s,
            )  # fmt: skip

    def _wait_for_quiet(self) -> None:
        """Let the requests that queued up during a restart go first: loading the draft while
        they run would slow them down on a busy CPU (a two-model start must not answer later
        than a target-only one). Wait until the queue has been empty for QUIET_S, at most
        MAX_DRAFT_DELAY_S."""
        deadline = time.monotonic() + MAX_DRAFT_DELAY_S
        quiet_since = time.monotonic()
        while time.monotonic() < deadline and not self._closing.is_set():
            if self.pending:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= QUIET_S:
                return
            time.sleep(0.02)

    @property
    def mode(self) -> str:
        """What the pair does now: speculative, ngram, plain, loading or failed."""
        if self.state != "ready" or self.loaded is None:
            return "loading" if self.state == "starting" else "failed"
        rt = self.loaded.runtime
        if rt.plain_only_reason:
            return "plain"
        if rt.draft is not None:
            return "speculative"
        return "ngram" if self.loaded.plan.mode != "plain" else "plain"

    @property
    def reason(self) -> str:
        if self.state == "failed":
            return self.error
        if self.loaded is None:
            return "target model loading"
        rt = self.loaded.runtime
        return rt.plain_only_reason or rt.draft_unavailable_reason or self.loaded.plan.reason

    @property
    def degraded(self) -> bool:
        if self.loaded is None:
            return self.state == "failed"
        rt = self.loaded.runtime
        return self.loaded.plan.degraded or rt.draft_unavailable_reason.startswith("draft failed")

    def rolling_accept_rate(self) -> float | None:
        proposed = sum(p for p, _ in self.recent)
        return sum(a for _, a in self.recent) / proposed if proposed else None

    # --- requests --------------------------------------------------------------------------

    def check_prompt(self, req: GenerationRequest) -> None:
        """Refuse a prompt that cannot fit the context before queueing it (400, both sizes)."""
        if self.loaded is None:
            return
        rt = self.loaded.runtime
        n = len(prompt_tokens(rt, req)[0])
        if n >= rt.target.n_ctx:
            raise RequestError(
                f"the prompt is {n} tokens and pair {self.name!r} has a {rt.target.n_ctx}-token "
                "context",
                "shorten the prompt (the context holds the prompt and the answer)",
            )

    def admit(self) -> None:
        """Take a place in the queue, or raise QueueFull. Each admit() is followed by exactly
        one stream() (which gives the place back when the request ends) or release()."""
        if self.pending >= self.max_queue:
            raise QueueFull(self.name, self.max_queue)
        self.pending += 1

    def release(self) -> None:
        self.pending -= 1

    async def stream(
        self, req: GenerationRequest, on_done: Callable[[Outcome], None]
    ) -> AsyncIterator[Chunk | GenerationStats]:
        """Run an admitted `req` on the pair's thread and yield its chunks, then its stats. If
        the consumer stops early, generation stops at the next step."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        cancel = threading.Event()
        done = object()

        def put(item: object) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def run() -> None:
            outcome = Outcome(None, "error", "")
            try:
                with self._lock:
                    assert self.loaded is not None
                    gen = generate(self.loaded.runtime, req)
                    try:
                        for item in gen:
                            if cancel.is_set():
                                outcome = Outcome(None, "cancelled", "client disconnected")
                                return
                            if isinstance(item, GenerationStats):
                                outcome = Outcome(item, "ok")
                            put(item)
                    finally:
                        gen.close()
            except Exception as exc:  # reported to the client as an error event / status
                outcome = Outcome(None, "error", str(exc))
                put(exc)
            finally:  # recorded before the consumer sees the end: a response is logged first
                loop.call_soon_threadsafe(self._finish, outcome, on_done)
                put(done)

        loop.run_in_executor(self._pool, run)  # run() never raises: it reports its outcome
        try:
            while True:
                item = await queue.get()
                if item is done:
                    break
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            # A consumer that left early (client disconnect) stops generation at the next step.
            cancel.set()

    def _finish(self, outcome: Outcome, on_done: Callable[[Outcome], None]) -> None:
        self.pending -= 1
        self.served += 1
        if outcome.stats is not None and outcome.stats.mode == "speculative":
            self.recent.append((outcome.stats.proposed_tokens, outcome.stats.accepted_tokens))
        on_done(outcome)

    def close(self) -> None:
        """Wait for the running request, then unload (target and draft)."""
        self._closing.set()
        self._pool.shutdown(wait=True)
        if self._drafter.is_alive():
            self._drafter.join(timeout=60)
        with self._lock:
            if self.loaded is not None:
                self.loaded.close()
                self.loaded = None
        self.state = "stopped"
