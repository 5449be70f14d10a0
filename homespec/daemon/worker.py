"""One pair inside the daemon: its engine process, a bounded queue, crash recovery.

The pair's models and generation loop run in an engine child (engine/child.py, through
daemon/engine.py); this side keeps the queue and what /health and status say. Everything here
runs on the event loop: the engine's replies arrive there too, so no state needs a lock.
Its states and their transitions are in daemon/states.py, what it says of itself (mode,
reason, degraded) in daemon/pair_health.py.

A request that finds `max_queue` requests waiting or running is refused at once (the HTTP
layer answers 503 with Retry-After) rather than queued without bound.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import replace
from pathlib import Path

from homespec.daemon import pair_health
from homespec.daemon.crashes import EngineDeath, recover
from homespec.daemon.engine import EngineProcess
from homespec.daemon.memory_watch import DraftWatch, decide, draft_site
from homespec.daemon.outcome import Outcome, raise_failure
from homespec.daemon.settling import Settling
from homespec.daemon.states import TRANSITIONS, WorkerState
from homespec.engine import learned
from homespec.engine.crashsite import Site
from homespec.engine.protocol import (
    AttachDraft,
    Cancel,
    Counted,
    CountPrompt,
    DetachDraft,
    DraftAttached,
    DraftDetached,
    DraftHandedOver,
    EngineInfo,
    Finished,
    Generate,
    Load,
    Loaded,
    LoadFailed,
    Remeasured,
    Steps,
)
from homespec.engine.types import Chunk, GenerationRequest, GenerationStats
from homespec.errors import EngineCrashed, QueueFull
from homespec.manifest import NGRAM, NO_DRAFT, Manifest
from homespec.resources import Machine
from homespec.vocab import PairMode

LOG = logging.getLogger("homespec.daemon")
ROLLING = 50  # requests in the rolling accept rate
STOP_TIMEOUT_S = 30.0


class PairWorker:
    def __init__(
        self,
        manifest: Manifest,
        name: str,
        *,
        max_queue: int,
        machine_for: Callable[[PairWorker], Machine | None],
        on_ready: Callable[[PairWorker], None] | None = None,
        state_dir: Path | None = None,
        settling: Settling | None = None,
    ) -> None:
        """`machine_for(worker)`: what to plan this pair on at each (re)start, i.e. the
        daemon's first probe less what its other pairs hold; None lets the engine probe.
        `settling`: the daemon's gate for after-load work (one pair at a time)."""
        self.settling = settling or Settling()
        self.manifest = manifest
        self.machine_for = machine_for
        # What the governor learned, kept across engine and daemon restarts, per pair and
        # model files (other models would have other acceptance).
        self.learned_file = state_dir / learned.file_name(manifest, name) if state_dir else None
        self.name = name
        self.max_queue = max_queue
        self.on_ready = on_ready
        server = manifest.spec.server
        self.crash_limit = server.engine_crash_limit
        self.crash_window_s = server.engine_crash_window_s
        draft = manifest.pair(name)[1].draft
        self.draft_model = None if draft in (NGRAM, NO_DRAFT) else draft
        self.state = WorkerState.STARTING
        self.error = ""
        self.info: EngineInfo | None = None
        self.incident = ""  # the last engine death and what was done about it
        self.without_draft = ""  # set once the draft crashed: restarts leave it out
        self.deaths: list[EngineDeath] = []
        self.pending = 0  # waiting + running
        self.served = 0
        self.recent: deque[tuple[int, int]] = deque(maxlen=ROLLING)  # (proposed, accepted)
        self.threads: tuple[int, str] = (0, "")  # (count, why fewer) after the last request
        self.started_at = time.perf_counter()
        self.ready_after_s: float | None = None
        self.speculative_after_s: float | None = None  # the draft model serves from then
        self.measured_after_s: float | None = None  # the governor's costs measured by then
        self.probed: Machine | None = None  # what the engine probed, when it was asked to
        self._engine: EngineProcess | None = None
        self._loaded: asyncio.Future[bool] | None = None
        self._turn = asyncio.Lock()  # one request at a time goes to the engine
        self._streams: dict[str, asyncio.Queue[object]] = {}
        self._counts: dict[int, asyncio.Future[Counted]] = {}
        self._qids = itertools.count()
        self._draft_task: asyncio.Task[None] | None = None
        self._spawned_at = self.started_at
        self.memory_watch = DraftWatch()  # the draft dropped for memory, and the way back
        self.memory_drops = 0

    def _set_state(self, new: WorkerState) -> None:
        if new != self.state and new not in TRANSITIONS[self.state]:
            raise AssertionError(f"pair {self.name}: no transition {self.state} → {new}")
        self.state = new

    # --- the engine --------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._engine.pid if self._engine else None

    async def start(self) -> bool:
        """Start the engine and wait until the target serves (True) or the pair failed."""
        self._loaded = asyncio.get_running_loop().create_future()
        self._spawn()
        return await self._loaded

    def _spawn(self) -> None:
        loop = asyncio.get_running_loop()
        self._engine = EngineProcess(self.name, loop, self._on_message, self._on_exit)
        self._spawned_at = time.perf_counter()
        machine = self.machine_for(self)
        learned = str(self.learned_file) if self.learned_file else ""
        self._engine.start(
            Load(self.manifest, self.name, machine, self.without_draft, learned_file=learned)
        )

    def _on_message(self, msg: object) -> None:
        if isinstance(msg, Steps | Finished):
            stream = self._streams.get(msg.rid)
            if stream is not None:
                stream.put_nowait(msg)
            if isinstance(msg, Finished) and msg.costs and self.info:  # status shows them
                c = msg.costs
                self.info = replace(
                    self.info,
                    verify_ms=c.verify_ms,
                    draft_ms=c.draft_ms,
                    step_ms=c.step_ms,
                    copy_ms=c.copy_ms,
                    read_ms=c.read_ms,
                    catch_up=c.catch_up,
                    copy_per_token=c.copy_per_token,
                )
        elif isinstance(msg, Counted):
            fut = self._counts.pop(msg.qid, None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
        elif isinstance(msg, Loaded):
            self._on_loaded(msg)
        elif isinstance(msg, DraftHandedOver):
            self._on_handover(msg)
        elif isinstance(msg, DraftAttached):
            self._on_draft(msg)
        elif isinstance(msg, DraftDetached | Remeasured):
            self.info = msg.info
        elif isinstance(msg, LoadFailed):
            self.error = str(msg.failure)
            LOG.error("pair %s failed to load: %s", self.name, self.error)
            self._set_state(WorkerState.FAILED)
            self._resolve_loaded(False)

    def _on_loaded(self, msg: Loaded) -> None:
        self.info = msg.info
        if msg.probed is not None:
            self.probed = msg.probed
        restarted = self.state == WorkerState.RESTARTING
        self._set_state(WorkerState.READY)
        if self.ready_after_s is None:
            self.ready_after_s = time.perf_counter() - self.started_at
        if restarted:
            LOG.info(
                "pair %s: engine %d serving again, %.1f s after the restart",
                self.name,
                msg.info.pid,
                time.perf_counter() - self._spawned_at,
            )
        else:
            LOG.info(
                "pair %s: target ready after %.1f s (engine %d), serving",
                self.name,
                self.ready_after_s,
                msg.info.pid,
            )
        for verdict in msg.info.repack.values():
            if verdict.note:
                LOG.warning("pair %s: %s", self.name, verdict.note)
        if self.on_ready:
            self.on_ready(self)
        self._resolve_loaded(True)
        # The draft (if the plan has room for it) and the governor's cost calibration come
        # next, once the queue is quiet.
        self._draft_task = asyncio.get_running_loop().create_task(self._attach_draft())

    def _resolve_loaded(self, ok: bool) -> None:
        if self._loaded is not None and not self._loaded.done():
            self._loaded.set_result(ok)

    async def _attach_draft(self) -> None:
        """The engine loads the draft while the target keeps serving, and measures the decode
        costs the governor starts from: once the requests that queued up during a (re)start
        are through (a two-model start must not answer later than a target-only one), and
        after the other pairs' own (daemon/settling.py)."""

        def start() -> bool:
            if self._engine is None or self.state != WorkerState.READY:
                return False
            self._engine.send(AttachDraft())
            return True

        await self.settling.run(self.name, lambda: self.pending > 0, start)

    def _on_handover(self, msg: DraftHandedOver) -> None:
        """The draft serves requests from now on; the engine measures the costs next."""
        self.info = msg.info
        if self.speculative_after_s is not None:  # back after the memory watch dropped it
            LOG.info("pair %s: draft attached again, speculative", self.name)
            return
        self.speculative_after_s = time.perf_counter() - self.started_at
        LOG.info(
            "pair %s: draft attached after %.1f s, speculative (its costs are measured next, "
            "between requests)",
            self.name,
            self.speculative_after_s,
        )
        draft_verdict = msg.info.repack.get("draft")  # the target's was said on Loaded
        if draft_verdict is not None and draft_verdict.note:
            LOG.warning("pair %s: %s", self.name, draft_verdict.note)

    def _on_draft(self, msg: DraftAttached) -> None:
        """The after-load work is over: the draft attached (or failed to) and the governor's
        costs are measured."""
        self.settling.finished(self.name)
        self.info = msg.info
        if msg.failure is not None:
            LOG.error("pair %s: %s; n-gram drafting only", self.name, msg.failure)
        if self.measured_after_s is None:
            self.measured_after_s = time.perf_counter() - self.started_at
            LOG.info("pair %s: costs measured after %.1f s", self.name, self.measured_after_s)

    def _on_exit(self, returncode: int, site: Site) -> None:
        self.settling.finished(self.name)
        if self.state in (WorkerState.STOPPED, WorkerState.FAILED):
            return  # asked to stop, or exiting after LoadFailed: nothing to recover
        death = EngineDeath(time.monotonic(), returncode, site)
        self.deaths.append(death)
        rec = recover(
            self.deaths,
            draft_file=self.draft_model,
            draft_dropped=bool(self.without_draft),
            limit=self.crash_limit,
            window_s=self.crash_window_s,
        )
        if self.info is not None and self.info.plan.arrangement.remote:
            rec = replace(
                rec,
                reason=rec.reason + " (it spreads over RPC workers: if one "
                "stopped, the restart plans without it)",
            )
        LOG.error("pair %s: %s", self.name, rec.reason)
        self.incident = rec.reason
        if rec.without_draft and not self.without_draft:
            self.without_draft = rec.reason
        crashed = EngineCrashed(
            f"pair {self.name!r}: {rec.reason.split(';')[0]}",
            "the pair is restarting: retry shortly" if rec.restart else "see `homespec status`",
        )
        for stream in self._streams.values():
            stream.put_nowait((crashed, death.signal))
        for fut in self._counts.values():
            if not fut.done():
                fut.set_exception(crashed)
        self._counts.clear()
        self.info = None
        self._engine = None
        if self._draft_task is not None:
            self._draft_task.cancel()
        if not rec.restart:
            self.error = rec.reason
            self._set_state(WorkerState.FAILED)
            self._resolve_loaded(False)
            return
        self._set_state(WorkerState.RESTARTING)
        self._spawn()

    # --- memory ----------------------------------------------------------------------------------

    def watch_memory(self, machine: Machine, min_free: int) -> None:
        """One sample of the memory watch (daemon/memory_watch.py): drop the draft when the
        memory free where it lives runs short, bring it back once there is room again."""
        info = self.info
        if self.state != WorkerState.READY or info is None or self._engine is None:
            return
        device, draft_bytes = draft_site(info)
        verdict = decide(
            self.memory_watch,
            device=device,
            free=machine.free(device),
            min_free=min_free,
            draft_bytes=draft_bytes,
            draft_loaded=info.draft_loaded,
        )
        self.memory_watch = verdict.watch
        if verdict.action == "drop":
            self.memory_drops += 1
            LOG.warning(
                "pair %s: %s; n-gram drafting until memory comes back",
                self.name,
                verdict.watch.reason,
            )
            self._engine.send(DetachDraft(verdict.watch.reason))
        elif verdict.action == "attach":
            LOG.warning("pair %s: memory back (%s): re-attaching the draft", self.name, verdict.why)
            self._draft_task = asyncio.get_running_loop().create_task(self._attach_draft())

    # --- what /health and status say ----------------------------------------------------------

    def view(self) -> pair_health.PairView:
        return pair_health.PairView(
            self.state, self.info, self.error, self.incident, self.memory_watch
        )

    @property
    def mode(self) -> PairMode:
        return pair_health.mode(self.view())

    @property
    def reason(self) -> str:
        return pair_health.reason(self.view())

    @property
    def degraded(self) -> bool:
        return pair_health.degraded(self.view())

    def notes(self) -> list[str]:
        return pair_health.notes(self.view())

    def rolling_accept_rate(self) -> float | None:
        proposed = sum(p for p, _ in self.recent)
        return sum(a for _, a in self.recent) / proposed if proposed else None

    def memory(self) -> dict[str, int]:
        """The engine process's measured memory per device ({} when none runs)."""
        return self._engine.memory() if self._engine else {}

    # --- requests ----------------------------------------------------------------------------

    async def check_prompt(self, req: GenerationRequest) -> None:
        """Refuse a prompt that cannot fit the context (or be rendered) before it queues: the
        engine's RequestError, counted on its reader thread beside any running request."""
        if self._engine is None:
            return
        qid = next(self._qids)
        fut: asyncio.Future[Counted] = asyncio.get_running_loop().create_future()
        self._counts[qid] = fut
        if not self._engine.send(CountPrompt(qid, req)):
            self._counts.pop(qid, None)
            return  # the engine is going away: the request will be told
        counted = await fut
        if counted.failure is not None:
            raise_failure(counted.failure)

    def admit(self) -> None:
        """Take a place in the queue, or raise QueueFull. Each admit() is followed by exactly
        one stream() (which gives the place back when the request ends) or release()."""
        if self.pending >= self.max_queue:
            raise QueueFull(self.name, self.max_queue)
        self.pending += 1

    def release(self) -> None:
        self.pending -= 1

    async def stream(
        self,
        rid: str,
        req: GenerationRequest,
        on_done: Callable[[Outcome], None],
        *,
        batch_s: float = 0.0,
        first_at_once: bool = True,
        arrived: float | None = None,
    ) -> AsyncGenerator[list[Chunk] | GenerationStats, None]:
        """Run an admitted `req` in the engine and yield its chunks (one per token) in the
        batches the engine sent them in (`batch_s`, `first_at_once`: protocol.Generate),
        then its stats. A consumer that stops early cancels it (the engine stops at its next
        step). The outcome is recorded once, before the consumer sees the end: a response is
        logged first. Its stats count from `arrived` (time.perf_counter(), default now): the
        wait for the engine (its turn here, then what the engine finished first there:
        Finished.waited_ms) is their `queue_ms`, and in their ttft and e2e."""
        arrived = time.perf_counter() if arrived is None else arrived
        outcome = Outcome(None, "cancelled", "client disconnected")
        finished = False
        sent = 0
        try:
            async with self._turn:
                engine = self._engine
                if engine is None or self.state != WorkerState.READY:
                    raise EngineCrashed(
                        f"pair {self.name!r} is {self.mode}: {self.reason}", "retry shortly"
                    )
                inbox: asyncio.Queue[object] = asyncio.Queue()
                self._streams[rid] = inbox
                try:
                    engine.send(Generate(rid, req, batch_s, first_at_once))
                    queue_ms = (time.perf_counter() - arrived) * 1000.0
                    while not finished:
                        msg = await inbox.get()
                        if isinstance(msg, Steps):
                            sent += len(msg.chunks)
                            yield msg.chunks
                            continue
                        finished = True
                        if isinstance(msg, tuple):  # the engine died under this request
                            crashed, sig = msg
                            outcome = Outcome(None, "engine_crashed", str(crashed), sig)
                            raise crashed
                        assert isinstance(msg, Finished)
                        if msg.failure is not None:
                            # The client's mistake, found as the engine started (a request
                            # not counted first): a refusal, as check_prompt's would be.
                            refused = msg.failure.kind == "RequestError" and not sent
                            status = "refused" if refused else "error"
                            outcome = Outcome(None, status, str(msg.failure))
                            raise_failure(msg.failure)
                        if msg.stats is not None:
                            if msg.chunks:
                                sent += len(msg.chunks)
                                yield msg.chunks
                            waited = queue_ms + msg.waited_ms
                            stats = replace(
                                msg.stats,
                                queue_ms=waited,
                                ttft_ms=waited + msg.stats.ttft_ms,
                                e2e_ms=waited + msg.stats.e2e_ms,
                            )
                            outcome = Outcome(stats, "ok")
                            self._finish(outcome, on_done)
                            yield stats
                finally:
                    self._streams.pop(rid, None)
                    if not finished and self._engine is engine and engine is not None:
                        engine.send(Cancel(rid))  # the consumer left: stop at the next step
                    if outcome.status == "cancelled":
                        why = f"client disconnected after {sent} tokens"
                        outcome = Outcome(None, "cancelled", why, sent=sent)
        except EngineCrashed as exc:
            if outcome.status != "engine_crashed":
                outcome = Outcome(None, "error", str(exc))
            raise
        finally:
            if outcome.status == "refused":
                self.release()  # a 400, counted (middleware.CountRefusals), never logged
            elif outcome.status != "ok":
                self._finish(outcome, on_done)

    def _finish(self, outcome: Outcome, on_done: Callable[[Outcome], None]) -> None:
        self.pending -= 1
        self.served += 1
        if outcome.stats is not None and outcome.stats.mode == "speculative":
            self.recent.append((outcome.stats.proposed_tokens, outcome.stats.accepted_tokens))
        if outcome.stats is not None and outcome.stats.threads:
            self.threads = (outcome.stats.threads, outcome.stats.threads_reason)
        on_done(outcome)

    async def drain(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) until the requests this worker holds have ended; new
        ones go elsewhere (a reload has already replaced or removed it)."""
        deadline = time.monotonic() + timeout_s
        while self.pending and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        """Stop the engine: it finishes the running request, then frees its models."""
        engine, self._engine = self._engine, None
        if self._draft_task is not None:
            self._draft_task.cancel()
        if self.state != WorkerState.STOPPED:
            self._set_state(WorkerState.STOPPED)
        self._resolve_loaded(False)
        if engine is not None:
            await engine.stop(STOP_TIMEOUT_S)
