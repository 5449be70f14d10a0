"""The daemon's state: its pair workers, request log, metrics, and what /health and /status say.

Created once per app by `create_app` (no module globals); routes reach it as `app.state.daemon`.
"""

from __future__ import annotations

import logging
import threading
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
from homespec.errors import HomespecError
from homespec.manifest import Manifest
from homespec.pairs import machine_budgets
from homespec.reqlog import LOG_NAME, RequestLog

LOG = logging.getLogger("homespec.daemon")


class UnknownModel(HomespecError):
    exit_code = 2


class NotReady(HomespecError):
    exit_code = 1


class PairUnavailable(HomespecError):
    exit_code = 1


@dataclass(frozen=True)
class DaemonConfig:
    manifest: Manifest
    state_dir: Path
    pairs: list[str]
    api_key: str | None = None


class Daemon:
    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.server = config.manifest.spec.server
        self.metrics = Metrics()
        self.log = RequestLog(config.state_dir / LOG_NAME)
        self.started_at = time.time()
        self._announced = False
        self._closing = False
        self.workers = {
            name: PairWorker(
                config.manifest,
                name,
                max_queue=self.server.max_queue,
                on_ready=self._on_ready,
            )
            for name in config.pairs
        }

    def start(self) -> None:
        """Load the pairs in the background, one after another (the app answers /health
        meanwhile): each pair is planned on what the earlier ones left, so two pairs that do
        not fit together degrade or refuse instead of overcommitting the box."""
        threading.Thread(target=self._load_all, name="homespec-loader", daemon=True).start()

    def _load_all(self) -> None:
        from homespec.engine.loader import probe

        manifest = self.config.manifest
        machine = machine_budgets(manifest, probe())
        taken: dict[str, int] = {}
        for w in self.workers.values():
            if self._closing:
                return
            if w.load_target(machine.minus(taken)) and w.loaded is not None:
                for use in w.loaded.plan.devices:
                    taken[use.device] = taken.get(use.device, 0) + use.need

    def _on_ready(self, worker: PairWorker) -> None:
        if not self._announced:
            self._announced = True
            notify(f"READY=1\nSTATUS=serving pair {worker.name} (draft loading)")

    def close(self) -> None:
        self._closing = True
        notify("STOPPING=1\nSTATUS=draining requests, then unloading models")
        for w in self.workers.values():
            w.close()
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
            "notes": notes or None,
        }
        if s is not None:
            d = s.to_dict()
            for key in (
                "mode", "drafter", "reason", "prompt_tokens", "completion_tokens",
                "proposed_tokens", "accepted_tokens", "accept_rate", "ttft_ms", "e2e_ms",
                "tokens_per_s", "finish_reason", "draft_steps", "verify_steps",
            ):  # fmt: skip
                rec[key] = d[key]
        try:
            self.log.append(rec)
        except OSError as exc:  # a full disk must not fail the request
            LOG.error("request log: %s", exc)
        self.metrics.observe(worker.name, s.mode if s else worker.mode, outcome.status, s)

    # --- reports ---------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        states = [w.state for w in self.workers.values()]
        reasons = [f"{w.name}: {w.reason}" for w in self.workers.values() if w.degraded]
        if "ready" not in states:
            status = "failed" if all(s == "failed" for s in states) else "starting"
        else:
            status = "degraded" if reasons else "ready"
        return {
            "status": status,
            "reasons": reasons,
            "pairs": {
                w.name: {"state": w.state, "mode": w.mode, "reason": w.reason}
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
            "state": w.state,
            "mode": w.mode,
            "reason": w.reason,
            "degraded": w.degraded,
            "queue_depth": w.pending,
            "max_queue": w.max_queue,
            "requests": w.served,
            "rolling_accept_rate": w.rolling_accept_rate(),
            "ready_after_s": w.ready_after_s,
            "speculative_after_s": w.speculative_after_s,
        }
        if w.loaded is not None:
            plan = w.loaded.plan
            out["plan"] = plan.summary()
            out["memory"] = {
                check.role: {"predicted": check.predicted, "measured_after_load": check.measured}
                for check in w.loaded.memory
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
                "target": w.loaded.files.target.path.name,
                "draft": w.loaded.files.draft.path.name if w.loaded.files.draft else None,
                "draft_loaded": w.loaded.runtime.draft is not None,
            }
        return out
