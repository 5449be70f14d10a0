"""The daemon's state: its pair workers, request log, metrics, and what /health and /status say.

Created once per app by `create_app` (no module globals); routes reach it as `app.state.daemon`.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from homespec import __version__
from homespec.daemon import rpc_watch
from homespec.daemon.engine_report import engine_report
from homespec.daemon.metrics import Metrics
from homespec.daemon.outcome import Outcome
from homespec.daemon.settling import Settling
from homespec.daemon.systemd import notify
from homespec.daemon.worker import PairWorker
from homespec.engine.types import GenerationRequest
from homespec.errors import HomespecError, UnknownModel
from homespec.manifest import Manifest, load_manifest
from homespec.pairs import inspect_pair, machine_budgets
from homespec.reqlog import LOG_NAME, RequestLog
from homespec.resources import Machine, held, probe_machine

LOG = logging.getLogger("homespec.daemon")


def _pair_config(manifest: Manifest, name: str) -> tuple[Any, ...]:
    """Everything a pair's engine is built from: its settings and its models' (a pair whose
    tuple is unchanged keeps running across a reload)."""
    _, spec = manifest.pair(name)
    models = manifest.spec.models
    return (spec, models.get(spec.target), models.get(spec.draft))


_DIRS = re.compile(r"(?<![\w.~:/-])(?:~|[A-Za-z]:)?[/\\](?:[^\s'\"/\\]+[/\\])+")


def without_paths(text: str) -> str:
    """`/srv/models/x.gguf not found` → `x.gguf not found`: what an unauthenticated caller may
    read of a reason (where the files live is the operator's business)."""
    return _DIRS.sub("", text)


@dataclass(frozen=True)
class DaemonConfig:
    manifest: Manifest
    state_dir: Path
    pairs: list[str]
    api_key: str | None = None
    host: str = "127.0.0.1"  # the address it listens on (a Host header may name it)
    pair_args: tuple[str, ...] = ()  # `serve --pair`: fixed across reloads (else the manifest's)


@dataclass(frozen=True)
class Reloaded:
    """What `reload()` did: per pair, kept / restarted / started / stopped; or why nothing."""

    ok: bool
    error: str = ""
    kept: tuple[str, ...] = ()
    restarted: tuple[str, ...] = ()
    started: tuple[str, ...] = ()
    stopped: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "error": self.error or None,
            "kept": list(self.kept),
            "restarted": list(self.restarted),
            "started": list(self.started),
            "stopped": list(self.stopped),
            "notes": list(self.notes),
        }

    def summary(self) -> str:
        if not self.ok:
            return f"reload refused, the running configuration stays: {self.error}"
        parts = [
            f"{what} {', '.join(names)}"
            for what, names in (
                ("kept", self.kept),
                ("restarting", self.restarted),
                ("starting", self.started),
                ("stopped", self.stopped),
            )
            if names
        ]
        return "reloaded: " + "; ".join(parts + list(self.notes))


# GenerationStats fields a request's log line leaves out: the response, /metrics and status
# carry them (mean_accepted_length follows from the logged counts).
UNLOGGED = frozenset(
    {"prompt_format", "accepted_per_position", "mean_accepted_length", "threads", "threads_reason"}
)


class Daemon:
    def __init__(self, config: DaemonConfig, probe: Callable[[], Machine] = probe_machine) -> None:
        """`probe`: what the memory watch samples (resources.probe_machine; tests script it)."""
        self.config = config
        self.probe = probe
        self.server = config.manifest.spec.server
        self.metrics = Metrics()
        self.log = RequestLog(config.state_dir / LOG_NAME)
        self.log_lost = 0  # request lines that could not be written
        self.log_error = ""  # why the last write failed (empty once one succeeds again)
        self.started_at = time.time()
        # Completion requests refused before any generation, by HTTP status (not logged:
        # requests.jsonl holds the requests that ran; `status` and /metrics show these).
        self.refusals: dict[int, int] = {}
        self._announced = False
        self._closing = False
        self._base: Machine | None = None  # the first engine's probe, budgets applied
        self._loader: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._rpc: asyncio.Task[None] | None = None
        self._rpc_waiting: set[str] = set()  # failed pairs that found a worker down
        self._reloading = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()  # reloads and swaps under way
        self._retiring: set[PairWorker] = set()  # replaced or removed, still draining
        self._settling = Settling()
        self.workers = {name: self._worker(config.manifest, name) for name in config.pairs}

    def _worker(self, manifest: Manifest, name: str) -> PairWorker:
        return PairWorker(
            manifest,
            name,
            max_queue=manifest.spec.server.max_queue,
            machine_for=self._machine_for,
            on_ready=self._on_ready,
            state_dir=self.config.state_dir,
            settling=self._settling,
        )

    def start(self) -> None:
        """Start the pairs' engines in the background, one after another (the app answers
        /health meanwhile): each is planned on what the earlier ones left (two pairs that do
        not fit together degrade or refuse), and does its after-load work after theirs."""
        loop = asyncio.get_running_loop()
        self._loader = loop.create_task(self._load_all())
        self._watch = loop.create_task(self._watch_memory())
        self._rpc = loop.create_task(self._watch_workers())

    async def _load_all(self) -> None:
        for w in list(self.workers.values()):
            if self._closing:
                return
            if self.workers.get(w.name) is w:  # not replaced or removed by a reload meanwhile
                await w.start()

    # --- reload (SIGHUP, `homespec reload`) ------------------------------------------------

    def reload_soon(self) -> None:
        """Reload in the background (the SIGHUP handler cannot wait)."""
        self._keep(asyncio.get_running_loop().create_task(self.reload()))

    def _keep(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def reload(self) -> Reloaded:
        """Re-read models.toml. A config that does not load, names a pair it lacks, or whose
        pairs' files fail the checks `ask` makes is refused as a whole: the running pairs stay
        as they are. Otherwise unchanged pairs keep running; changed ones drain their requests,
        stop and start again on the new config; removed ones drain and stop; new ones start.
        A restarted pair answers 503 (retry shortly) between its old engine and its new one."""
        async with self._reloading:
            path = self.config.manifest.path
            try:
                manifest = await asyncio.to_thread(load_manifest, path)
                names = list(
                    self.config.pair_args or manifest.spec.server.pairs or [manifest.default_pair]
                )
                for name in names:
                    await asyncio.to_thread(inspect_pair, manifest, name)
            except HomespecError as exc:
                result = Reloaded(False, error=str(exc))
                LOG.error("%s", result.summary())
                return result
            old = self.config.manifest
            kept, restarted, started, stopped = [], [], [], []
            for name in names:
                if name not in self.workers:
                    started.append(name)
                elif _pair_config(old, name) == _pair_config(manifest, name):
                    kept.append(name)
                else:
                    restarted.append(name)
            stopped = [name for name in self.workers if name not in names]
            notes = []
            if manifest.spec.server.model_dump(exclude={"max_queue", "pairs"}) != (
                old.spec.server.model_dump(exclude={"max_queue", "pairs"})
            ):
                notes.append("[server]: only max_queue and pairs apply without a restart")
            if manifest.spec.memory.budget != old.spec.memory.budget:
                notes.append("[memory] budget: applies to pairs as they (re)start")
            self.config = replace(self.config, manifest=manifest, pairs=names)
            self.server = manifest.spec.server
            for name in kept:
                self.workers[name].manifest = manifest
                self.workers[name].max_queue = manifest.spec.server.max_queue
            for name in stopped:
                self._swap(self.workers.pop(name), None)
            for name in restarted:
                new = self._worker(manifest, name)
                self._swap(self.workers[name], new)
                self.workers[name] = new
            for name in started:
                new = self._worker(manifest, name)
                self.workers[name] = new
                self._swap(None, new)
            result = Reloaded(
                True,
                kept=tuple(kept),
                restarted=tuple(restarted),
                started=tuple(started),
                stopped=tuple(stopped),
                notes=tuple(notes),
            )
            LOG.warning("%s", result.summary())
            return result

    def _swap(self, old: PairWorker | None, new: PairWorker | None) -> None:
        """In the background: drain and stop `old`, then start `new` (never both loaded at
        once: the box was planned for one)."""

        async def swap() -> None:
            if old is not None:
                self._retiring.add(old)
                await old.drain(self.server.shutdown_timeout_s)
                await old.close()
                self._retiring.discard(old)
            if new is not None and not self._closing:
                await new.start()

        self._keep(asyncio.get_running_loop().create_task(swap()))

    async def _watch_memory(self) -> None:
        """Sample free memory every `[memory] watch_interval_s`; each pair's worker drops or
        brings back its draft (daemon/memory_watch.py). A failed probe skips a sample."""
        while not self._closing:
            spec = self.config.manifest.spec.memory  # a reload may change it
            await asyncio.sleep(spec.watch_interval_s)
            try:
                machine = await asyncio.to_thread(self.probe)
            except Exception as exc:  # the watch must never take the daemon down
                LOG.warning(
                    "memory watch: probe failed (%s); next sample in %gs",
                    exc,
                    spec.watch_interval_s,
                )
                continue
            for w in self.workers.values():
                w.watch_memory(machine, spec.min_free_bytes)

    async def _watch_workers(self) -> None:
        """Every `[memory] watch_interval_s`: re-plan a pair planned without some of its RPC
        workers once they all answer again (daemon/rpc_watch.py). The watch must never take
        the daemon down."""
        while not self._closing:
            await asyncio.sleep(self.config.manifest.spec.memory.watch_interval_s)
            for name, w in list(self.workers.items()):
                try:
                    await self._watch_pair(name, w)
                except Exception as exc:
                    LOG.warning("worker watch: pair %s: %s", name, exc)

    async def _watch_pair(self, name: str, w: PairWorker) -> None:
        if self.workers.get(name) is not w or w in self._retiring:
            return
        why = await rpc_watch.check(w, self._rpc_waiting)
        if why and self.workers.get(name) is w:
            LOG.warning("pair %s: %s: re-planning the pair", name, why)
            new = self._worker(w.manifest, name)
            self._swap(w, new)
            self.workers[name] = new

    def _machine_for(self, worker: PairWorker) -> Machine | None:
        """The first probe less what the other pairs hold: each one's plan, or what its engine
        holds where more (None: the engine probes; the daemon never loads llama.cpp)."""
        if self._base is None:
            return None
        taken: dict[str, int] = {}
        for w in self.workers.values():
            if w is not worker and w.info is not None:
                planned = {use.device: use.need for use in w.info.plan.devices}
                for device, n in held(planned, w.memory()).items():
                    taken[device] = taken.get(device, 0) + n
        return self._base.minus(taken)

    def _on_ready(self, worker: PairWorker) -> None:
        if self._base is None and worker.probed is not None:
            self._base = machine_budgets(self.config.manifest, worker.probed)
        if not self._announced:
            self._announced = True
            notify(f"READY=1\nSTATUS=serving pair {worker.name} (draft loading)")

    async def close(self) -> None:
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        notify("STOPPING=1\nSTATUS=draining requests, then unloading models")
        if self._loader is not None:
            self._loader.cancel()
        if self._watch is not None:
            self._watch.cancel()
        if self._rpc is not None:
            self._rpc.cancel()
        workers = [*self.workers.values(), *self._retiring]
        await asyncio.gather(*(w.close() for w in workers))
        LOG.info("models unloaded")

    # --- routing ---------------------------------------------------------------------------

    def resolve(self, model: str | None) -> tuple[PairWorker, list[str]]:
        """The worker for a request's `model`, and notes when it is not the one named."""
        default = self.config.manifest.default_pair
        if default not in self.workers:
            default = next(iter(self.workers))
        if model is None or model == "":
            return self.workers[default], []
        if model in self.workers:
            return self.workers[model], []
        known = ", ".join(self.workers)
        if model in self.config.manifest.spec.pairs:
            raise UnknownModel(f"pair {model!r} is not loaded by this daemon", f"loaded: {known}")
        if self.server.unknown_model == "error":
            raise UnknownModel(f"no pair named {model!r}", f"use one of: {known}")
        return self.workers[default], [
            f"model {model!r} is not a pair here: served by the default pair {default!r}"
        ]

    # --- request records -------------------------------------------------------------------

    def refused(self, endpoint: str, status: int) -> None:
        """A completion request answered with `status` before any generation."""
        self.refusals[status] = self.refusals.get(status, 0) + 1
        self.metrics.refused.labels(endpoint, str(status)).inc()

    def new_id(self) -> str:
        return f"hs-{uuid.uuid4().hex[:20]}"

    def record(
        self,
        rid: str,
        endpoint: str,
        worker: PairWorker,
        req: GenerationRequest,
        requested_model: str | None,
        notes: list[str],
        outcome: Outcome,
    ) -> None:
        """One request's log line and metrics (called once per request, however it ended)."""
        s = outcome.stats
        rec: dict[str, Any] = {
            "id": rid,
            "time": round(time.time(), 3),
            "endpoint": endpoint,
            "pair": worker.name,
            "model": requested_model,
            "task": req.task,
            "speculative_requested": req.speculative,
            "outcome": outcome.status,
            "error": outcome.error or None,
            "signal": outcome.signal or None,
            "notes": notes or None,
        }
        if outcome.status == "cancelled":
            rec["completion_tokens"] = outcome.sent  # what the client got before it left
        if s is not None:
            rec |= {k: v for k, v in s.to_dict().items() if k not in UNLOGGED}
        try:
            self.log.append(rec)
            self.log_error = ""
        except Exception as exc:  # a full disk must not fail the request, nor go unseen
            self.log_lost += 1
            self.log_error = f"request log {self.log.path}: cannot write ({exc})"
            self.metrics.log_lost.inc()
            LOG.error("%s; %d line(s) lost so far", self.log_error, self.log_lost)
        self.metrics.observe(worker.name, s.mode if s else worker.mode, outcome.status, s)

    # --- reports ---------------------------------------------------------------------------

    def health(self, *, detail: bool = True) -> dict[str, Any]:
        """State, mode and why, per pair. `detail=False` (a caller without the API key): the
        same, with file paths cut to their names."""
        states = [w.state for w in self.workers.values()]
        reasons = [f"{w.name}: {w.reason}" for w in self.workers.values() if w.degraded]
        reasons += [
            f"{w.name}: RPC worker {', '.join(down)} unreachable: planned without it"
            for w in self.workers.values()
            if (down := rpc_watch.missing(w.info))
        ]
        if self.log_error:
            reasons.append(f"{self.log_error}; {self.log_lost} line(s) lost")
        if "ready" not in states:
            if all(s == "failed" for s in states):
                status = "failed"
            else:
                status = "restarting" if "restarting" in states else "starting"
        else:
            status = "degraded" if reasons else "ready"
        shown = (lambda text: text) if detail else without_paths
        return {
            "status": status,
            "reasons": [shown(r) for r in reasons],
            "pairs": {
                w.name: {
                    "state": str(w.state),
                    "mode": w.mode,
                    "reason": shown(w.reason),
                    **({"workers": layout} if (layout := rpc_watch.layout(w.info)) else {}),
                }
                for w in self.workers.values()
            },
        }

    def status(self) -> dict[str, Any]:
        return {
            "version": __version__,
            "uptime_s": round(time.time() - self.started_at, 1),
            "status": self.health()["status"],
            "manifest": str(self.config.manifest.path),
            "request_log": str(self.log.path),
            "refused": {str(code): n for code, n in sorted(self.refusals.items())},
            "pairs": [self._pair_status(w) for w in self.workers.values()],
        }

    def _pair_status(self, w: PairWorker) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": w.name,
            "state": str(w.state),
            "mode": w.mode,
            "reason": w.reason,
            "degraded": w.degraded,
            "queue_depth": w.pending,
            "max_queue": w.max_queue,
            "requests": w.served,
            "rolling_accept_rate": w.rolling_accept_rate(),
            "prompt_note": w.info.prompt_note if w.info else "",
            "ready_after_s": w.ready_after_s,
            "speculative_after_s": w.speculative_after_s,
            "measured_after_s": w.measured_after_s,
            "engine": {
                "pid": w.pid,
                "memory": w.memory(),
                "deaths": [{"signal": d.signal, "site": d.site.label} for d in w.deaths],
                "last_incident": w.incident or None,
                # llama.cpp CPU threads after the last request, and why fewer than configured
                "threads": w.threads[0] or None,
                "threads_reason": w.threads[1] or None,
            },
            # the runtime memory watch (daemon/memory_watch.py)
            "memory_watch": {
                "draft_dropped": w.memory_watch.dropped,
                "reason": w.memory_watch.reason or None,
                "drops": w.memory_drops,
            },
        }
        if w.info is not None:
            out.update(engine_report(w.info))
        return out
