"""The daemon's state: its pair workers, request log, metrics, and what /health and /status say.

Created once per app by `create_app` (no module globals); routes reach it as `app.state.daemon`.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from homespec import __version__
from homespec.daemon.metrics import Metrics
from homespec.daemon.systemd import notify
from homespec.daemon.worker import Outcome, PairWorker
from homespec.engine.types import GenerationRequest
from homespec.errors import UnknownModel
from homespec.manifest import Manifest
from homespec.pairs import machine_budgets
from homespec.reqlog import LOG_NAME, RequestLog
from homespec.resources import Machine, held

LOG = logging.getLogger("homespec.daemon")


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


class Daemon:
    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.server = config.manifest.spec.server
        self.metrics = Metrics()
        self.log = RequestLog(config.state_dir / LOG_NAME)
        self.log_lost = 0  # request lines that could not be written
        self.log_error = ""  # why the last write failed (empty once one succeeds again)
        self.started_at = time.time()
        self._announced = False
        self._closing = False
        self._base: Machine | None = None  # the first engine's probe, budgets applied
        self._loader: asyncio.Task[None] | None = None
        self.workers = {
            name: PairWorker(
                config.manifest,
                name,
                max_queue=self.server.max_queue,
                machine_for=self._machine_for,
                on_ready=self._on_ready,
            )
            for name in config.pairs
        }

    def start(self) -> None:
        """Start the pairs' engines in the background, one after another (the app answers
        /health meanwhile): each pair is planned on what the earlier ones left, so two pairs
        that do not fit together degrade or refuse instead of overcommitting the box."""
        self._loader = asyncio.get_running_loop().create_task(self._load_all())

    async def _load_all(self) -> None:
        for w in self.workers.values():
            if self._closing:
                return
            await w.start()

    def _machine_for(self, worker: PairWorker) -> Machine | None:
        """The first probe less what the other pairs hold: each one's plan, or what its engine
        was measured to hold where that is more (None: let the engine probe; the daemon itself
        never loads llama.cpp)."""
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
        notify("STOPPING=1\nSTATUS=draining requests, then unloading models")
        if self._loader is not None:
            self._loader.cancel()
        await asyncio.gather(*(w.close() for w in self.workers.values()))
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
            d = s.to_dict()
            for key in (
                "mode",
                "drafter",
                "reason",
                "prompt_tokens",
                "completion_tokens",
                "proposed_tokens",
                "accepted_tokens",
                "accept_rate",
                "ttft_ms",
                "e2e_ms",
                "tokens_per_s",
                "finish_reason",
                "draft_steps",
                "verify_steps",
            ):
                rec[key] = d[key]
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
                w.name: {"state": str(w.state), "mode": w.mode, "reason": shown(w.reason)}
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
            "ready_after_s": w.ready_after_s,
            "speculative_after_s": w.speculative_after_s,
            "engine": {
                "pid": w.pid,
                "memory": w.memory(),
                "deaths": [{"signal": d.signal, "site": d.site.label} for d in w.deaths],
                "last_incident": w.incident or None,
                # llama.cpp CPU threads after the last request, and why fewer than configured
                "threads": w.threads[0] or None,
                "threads_reason": w.threads[1] or None,
            },
        }
        if w.info is not None:
            info = w.info
            plan = info.plan
            out["plan"] = plan.summary()
            out["memory"] = {
                check.role: {"predicted": check.predicted, "measured_after_load": check.measured}
                for check in info.memory
            }
            out["memory_planned"] = {
                d.device: {
                    "target": d.target_weights + d.target_kv,
                    "draft": d.draft_weights + d.draft_kv,
                    "compute": d.compute,
                    "total": d.need,
                }
                for d in plan.devices
            }
            out["models"] = {
                "target": info.target_file,
                "draft": info.draft_file,
                "draft_loaded": info.draft_loaded,
                "load_ms": {role: round(ms) for role, ms in info.load_ms.items()},
            }
            out["costs"] = {
                "verify_ms": {str(n): round(ms, 2) for n, ms in sorted(info.verify_ms.items())},
                "draft_ms_per_token": None if info.draft_ms is None else round(info.draft_ms, 2),
            }
            out["repack"] = {
                role: {"repack": v.repack, "source": v.source, "note": v.note or None}
                for role, v in info.repack.items()
            }
        return out
