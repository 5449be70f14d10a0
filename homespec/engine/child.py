"""`python -m homespec.engine.child --fd N --site-fd M --pair NAME`: one pair's engine process.

The daemon starts one per served pair and talks to it over a socket pair (engine/protocol.py).
All of llama.cpp lives here: a segfault, an abort or an out-of-memory kill ends this process,
and the daemon, which holds HTTP, the queue, the log and the metrics, restarts it (see
daemon/engine.py). Before it tells the daemon it serves, the child has run each model's first
decode (the warm-up, after the canary of engine/repack.py chose how to load it), so a model
that crashes on this machine does so before any request depends on it.

Threads: the main thread loads and generates, one request at a time; a reader thread takes
the daemon's messages, so a `Cancel` lands while a request runs (checked once per step) and
prompts are counted without waiting for the running request; the draft loads on a thread of
its own while the target serves, and is handed over between requests.
"""

from __future__ import annotations

# llama.cpp's library must load before numpy's (a CUDA build crashed at model load otherwise).
import homespec.engine.llama_backend  # noqa: F401

# isort: split
import argparse
import faulthandler
import logging
import os
import queue
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Protocol

from homespec import heap
from homespec.engine.calibration import Pieces, calibrating
from homespec.engine.crashsite import CrashSite
from homespec.engine.engine_info import costs_now, describe
from homespec.engine.generate import generate_steps
from homespec.engine.learned import restore as restore_learned
from homespec.engine.learned import save as save_learned
from homespec.engine.loader import (
    LoadedPair,
    attach_draft,
    detach_draft,
    load_pair,
    probe,
)
from homespec.engine.neighbours import wait_for_quiet
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
    Failure,
    Finished,
    Generate,
    Load,
    Loaded,
    LoadFailed,
    Remeasured,
    Steps,
    Stop,
)
from homespec.engine.runtime import PairRuntime
from homespec.engine.types import Chunk, GenerationStats
from homespec.errors import HomespecError
from homespec.resources import Machine

LOG = logging.getLogger("homespec.engine")
CALIBRATE = object()  # a work item: measure the governor's costs (after the draft attached)
HANDED_OVER = object()  # a work item: tell the daemon the draft serves (DraftHandedOver)
# A calibration found taken on a busy machine is taken again, at most this often.
RECALIBRATE_GAP_S = 10.0
# Before the first: wait (in the background, at most this long) until other processes take
# less than this many cores, as another engine loading or measuring would (daemon/settling.py
# orders a daemon's own engines; this is for the others: a second daemon, a llama-server).
CALIBRATE_QUIET = 0.5
CALIBRATE_WAIT_S = 10.0
# While the costs are measured, a piece runs whenever no request waits, and at least this often
# when requests keep coming back to back: three clients kept the engine's queue from ever being
# empty when it looked, and the measurement never went on (each request waits one piece at most
# either way).
PIECE_EVERY_S = 1.0
# What the governor learned is written (engine/learned.py) once the engine has had no request
# for SAVE_IDLE_S, or between two requests when it has gone unwritten for SAVE_EVERY_S, and at
# a stop. Written after every request, it held up the next one: 4 ms for six tasks' tables on
# the 2-core box, ten times that at MAX_TASKS, on a GPU's 20-ms short answers.
SAVE_IDLE_S = 0.5
SAVE_EVERY_S = 30.0


def failure(exc: BaseException) -> Failure:
    if isinstance(exc, HomespecError):
        return Failure(type(exc).__name__, exc.what, exc.hint)
    return Failure("EngineError", f"{type(exc).__name__}: {exc}", "a bug: see the daemon's log")


class Session(Protocol):
    """A loaded pair as the engine serves it: llama.cpp's (`LlamaSession`), or the tests'
    scripted fake (tests/fake_engine.py), which runs this same program and protocol."""

    @property
    def runtime(self) -> PairRuntime: ...

    def info(self) -> EngineInfo: ...

    def attach_draft(self, idle: AbstractContextManager[object]) -> None:
        """Load the draft if the pair has one (raising on failure) and hand it over inside
        `idle`."""
        ...

    def detach_draft(self, reason: str, idle: AbstractContextManager[object]) -> None:
        """Take the draft away inside `idle` and free its memory; requests then say why."""
        ...

    def settle_pages(self) -> None:
        """Back the loaded target's memory with huge pages where the plan says so (beside
        decoding, in the background)."""
        ...

    def close(self) -> None: ...


class LlamaSession:
    def __init__(self, loaded: LoadedPair) -> None:
        self.loaded = loaded

    @property
    def runtime(self) -> PairRuntime:
        return self.loaded.runtime

    def info(self) -> EngineInfo:
        files = self.loaded.files
        return describe(
            self.loaded.runtime,
            self.loaded.plan,
            target_file=files.target.path.name,
            draft_file=files.draft.path.name if files.draft else None,
            degraded=self.loaded.plan.degraded,
            held=self.loaded.held,
        )

    def attach_draft(self, idle: AbstractContextManager[object]) -> None:
        attach_draft(self.loaded, idle=idle, warm_up=True)

    def detach_draft(self, reason: str, idle: AbstractContextManager[object]) -> None:
        detach_draft(self.loaded, reason, idle=idle)

    def settle_pages(self) -> None:
        self.loaded.held.settle_pages()

    def close(self) -> None:
        self.loaded.close()


def open_llama(load: Load, site: CrashSite) -> tuple[Session, Machine | None]:
    """Plan and load the pair (the target only; the draft comes with AttachDraft), running
    each model's first decode before returning. Returns the session and, when the daemon left
    the probing to this engine, the machine it probed."""
    machine = load.machine or probe()
    loaded = load_pair(
        load.manifest,
        load.pair,
        load_draft=False,
        machine=machine,
        without_draft=load.without_draft,
        crash_site=site,
        warm_up=True,
        huge_pages="later",  # settled in the background (Engine._attach_draft): serve first
    )
    return LlamaSession(loaded), None if load.machine else machine


Opener = Callable[[Load, CrashSite], tuple[Session, "Machine | None"]]


@dataclass
class Measuring:
    """A measurement of the governor's costs under way (calibration.calibrating): its pieces
    run on the main thread whenever no work waits, requests between them; `then` tells the
    daemon once the last has run."""

    pieces: Pieces[None]
    then: Callable[[], None]
    last: float = field(default_factory=time.monotonic)  # when a piece last ran (or it began)


class Engine:
    def __init__(self, conn: Connection, site: CrashSite, opener: Opener) -> None:
        self.conn = conn
        self.site = site
        self.opener = opener
        self.session: Session | None = None
        self.work: queue.Queue[object] = queue.Queue()
        self.busy = threading.Lock()  # held while a request runs (the draft hands over outside)
        self._send_lock = threading.Lock()
        self._cancel_lock = threading.Lock()
        self._cancelled: set[str] = set()
        self._draft_failure: Failure | None = None
        self._calibrated_at: float | None = None
        self._measuring: Measuring | None = None
        self._arrived: dict[str, float] = {}  # rid -> when the reader took its Generate
        self._unsaved_since: float | None = None  # the first request not in the learned file

    def send(self, msg: object) -> None:
        with self._send_lock:
            self.conn.send(msg)

    # --- main thread -------------------------------------------------------------------------

    def run(self) -> int:
        load = self.conn.recv()
        assert isinstance(load, Load), load
        try:
            self.session, probed = self.opener(load, self.site)
        except Exception as exc:  # reported to the daemon, which shows it on /health
            if not isinstance(exc, HomespecError):
                LOG.exception("pair %s failed to load", load.pair)
            self.send(LoadFailed(failure(exc)))
            return 1
        learned = Path(load.learned_file) if load.learned_file else None
        if learned is not None:
            restore_learned(self.session.runtime.ledger, learned)
        heap.settle()  # loading's garbage collected, off the request path (homespec/heap.py)
        self.send(Loaded(self.session.info(), probed))
        threading.Thread(target=self._read, name="engine-reader", daemon=True).start()
        while True:
            idle = SAVE_IDLE_S if self._unsaved_since is not None else None
            msg = self._next(idle)
            if msg is None:  # idle: nothing waits on the write
                self._save(learned)
                self._unsaved_since = None
                continue
            if isinstance(msg, Generate):
                self._serve(msg, learned)
                self._remeasure_if_busy_then()
                continue
            if msg is HANDED_OVER:  # (info read here: requests change what it reads)
                self.send(DraftHandedOver(self.session.info()))
                continue
            # Anything else changes the models or ends them: a measurement under way stops
            # first (its pieces hold the contexts they measure), and starts again after a
            # detach, whose target still needs its costs.
            measuring = self._stop_measuring()
            if isinstance(msg, AttachDraft):
                loader = threading.Thread(target=self._attach_draft, name="draft", daemon=True)
                loader.start()
            elif isinstance(msg, DetachDraft):  # between requests: this thread runs them
                self.session.detach_draft(msg.reason, self.busy)
                self.send(DraftDetached(self.session.info()))
                if measuring is not None:
                    self._measure(measuring.then)
            elif msg is CALIBRATE:
                self._measure(self._attached)
            elif isinstance(msg, Stop):
                break
        if self._unsaved_since is not None:
            self._save(learned)
        with self.busy:
            self.session.close()
        return 0

    def _next(self, timeout: float | None) -> object | None:
        """The next work item, None after `timeout` with none. While a measurement is under
        way, its next piece runs whenever no work waits, or PIECE_EVERY_S after the last
        (calibration.Pieces)."""
        while self._measuring is not None:
            if time.monotonic() - self._measuring.last < PIECE_EVERY_S:
                try:
                    return self.work.get_nowait()
                except queue.Empty:
                    pass
            self._measure_a_piece()
        try:
            return self.work.get(timeout=timeout)
        except queue.Empty:
            return None

    def _serve(self, msg: Generate, learned: Path | None) -> None:
        """Run one request; keep the learned file's writes off the request path."""
        self._generate(msg)
        if learned is None:
            return
        if self._unsaved_since is None:
            self._unsaved_since = time.monotonic()
        if time.monotonic() - self._unsaved_since >= SAVE_EVERY_S:
            self._save(learned)  # busy throughout: between two requests
            self._unsaved_since = None

    # --- measuring the governor's costs, in pieces between requests ---------------------------

    def _measure(self, then: Callable[[], None]) -> None:
        assert self.session is not None
        self._measuring = Measuring(calibrating(self.session.runtime), then)

    def _measure_a_piece(self) -> None:
        """On this thread, the one that decodes requests: llama.cpp's CPU threads belong to
        the calling thread, and a second team measured twice the real cost here."""
        assert self._measuring is not None
        with self.busy:  # a draft re-attached after a memory drop hands over outside it
            try:
                next(self._measuring.pieces)
                self._measuring.last = time.monotonic()
                return
            except StopIteration:
                pass
        then = self._measuring.then
        self._measuring = None
        self._calibrated_at = time.monotonic()
        heap.settle()  # the draft's objects too
        then()

    def _stop_measuring(self) -> Measuring | None:
        """Abandon the measurement under way (its pieces let go of the caches and the lock):
        which it was, if any."""
        measuring, self._measuring = self._measuring, None
        if measuring is not None:
            with self.busy:
                measuring.pieces.close()
        return measuring

    def _attached(self) -> None:
        assert self.session is not None
        self.send(DraftAttached(self.session.info(), self._draft_failure))

    def _remeasured(self) -> None:
        assert self.session is not None
        self.send(Remeasured(self.session.info()))

    def _save(self, learned: Path | None) -> None:
        """Write what the governor learned (atomic: a kill leaves the last whole file)."""
        assert self.session is not None
        if learned is not None:
            save_learned(self.session.runtime.ledger, learned)

    def _generate(self, msg: Generate) -> None:
        assert self.session is not None
        rid = msg.rid
        with self.busy:
            # What it waited for here (a piece of a measurement, the draft handed over) is
            # its wait as much as the daemon's queue is: its stats say so.
            with self._cancel_lock:
                arrived = self._arrived.pop(rid, None)
            waited_ms = 0.0 if arrived is None else (time.monotonic() - arrived) * 1000.0
            if self._measuring is not None:  # scratch text, not a conversation to keep
                self.session.runtime.clear_contexts()
            gen = generate_steps(self.session.runtime, msg.req)
            held: list[Chunk] = []  # chunks not yet sent (see Generate.batch_s)
            sent_at = None if msg.first_at_once else time.monotonic()
            try:
                for item in gen:
                    if self._is_cancelled(rid):
                        self.send(Finished(rid, None, cancelled=True))
                        return
                    if isinstance(item, GenerationStats):
                        costs = costs_now(self.session.runtime)
                        self.send(
                            Finished(rid, item, chunks=held, costs=costs, waited_ms=waited_ms)
                        )
                        continue
                    held += item
                    now = time.monotonic()
                    if sent_at is None or now - sent_at >= msg.batch_s:
                        self.send(Steps(rid, held))
                        held, sent_at = [], now
            except Exception as exc:
                if not isinstance(exc, HomespecError):
                    LOG.exception("request %s failed", rid)
                self.send(Finished(rid, None, failure(exc)))
            finally:
                gen.close()
                with self._cancel_lock:
                    self._cancelled.discard(rid)

    def _remeasure_if_busy_then(self) -> None:
        """Between requests: calibrate again when the costs were measured on a busy machine
        (Ledger.calibrated_busy), at most every RECALIBRATE_GAP_S, and tell the daemon."""
        assert self.session is not None
        rt = self.session.runtime
        if self._measuring is not None or self._calibrated_at is None:
            return
        if not rt.ledger.calibrated_busy:
            return
        if time.monotonic() - self._calibrated_at < RECALIBRATE_GAP_S:
            return
        LOG.warning(
            "pair %s: decodes run %.1f× as fast as when their costs were measured (something "
            "else held the CPU then): measuring them again",
            rt.name,
            1 / rt.ledger.slowdown,
        )
        self._calibrated_at = time.monotonic()  # (not again before this one is done)
        self._measure(self._remeasured)

    def _is_cancelled(self, rid: str) -> bool:
        with self._cancel_lock:
            return rid in self._cancelled

    def _attach_draft(self) -> None:
        assert self.session is not None
        self.session.settle_pages()  # the target's huge pages, while it serves (engine/pages.py)
        try:  # loads while the target serves; hands over between requests
            self.session.attach_draft(self.busy)
            if self.session.runtime.draft is not None:
                self.work.put(HANDED_OVER)
        except Exception as exc:
            LOG.error(
                "pair %s: draft failed to load, n-gram drafting only: %s",
                self.session.runtime.name,
                exc,
            )
            self._draft_failure = failure(exc)
        others = wait_for_quiet(CALIBRATE_QUIET, CALIBRATE_WAIT_S)
        if others is not None and others >= CALIBRATE_QUIET:
            LOG.warning(
                "pair %s: other processes still take %.1f cores after %.0f s: measuring the "
                "costs anyway (measured again if the requests show them too high)",
                self.session.runtime.name,
                others,
                CALIBRATE_WAIT_S,
            )
        self.work.put(CALIBRATE)  # then the costs, between requests, on the main thread

    # --- reader thread -----------------------------------------------------------------------

    def _read(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                os._exit(0)  # the daemon is gone: nobody to answer, nothing to save
            if isinstance(msg, Cancel):
                with self._cancel_lock:
                    self._cancelled.add(msg.rid)
            elif isinstance(msg, CountPrompt):
                self._count(msg)
            else:
                if isinstance(msg, Generate):
                    with self._cancel_lock:
                        self._arrived[msg.rid] = time.monotonic()
                self.work.put(msg)

    def _count(self, msg: CountPrompt) -> None:
        assert self.session is not None
        try:
            self.session.runtime.prompt(msg.req)  # raises where generating would
        except Exception as exc:
            self.send(Counted(msg.qid, failure(exc)))
            return
        self.send(Counted(msg.qid))


def main(argv: list[str], opener: Opener = open_llama) -> int:
    ap = argparse.ArgumentParser(prog="python -m homespec.engine.child")
    ap.add_argument("--fd", type=int, required=True, help="the socket to the daemon")
    ap.add_argument("--site-fd", type=int, required=True, help="the shared crash-site byte")
    ap.add_argument("--pair", required=True, help="for the log lines")
    ap.add_argument("--log-level", default="INFO")
    args = ap.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING,
        format=f"homespec engine[{args.pair}]: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("homespec").setLevel(args.log_level)
    # Ctrl-C on `homespec serve` reaches the whole process group: the daemon drains its
    # requests and then stops this engine; the engine must not die under them first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no multi-GiB core files of the weights
    faulthandler.enable()  # a crash prints the Python stack (which step, which drafter)
    return Engine(Connection(args.fd), CrashSite.from_fd(args.site_fd), opener).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
