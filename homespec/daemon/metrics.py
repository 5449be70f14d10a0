"""Prometheus metrics, in a registry owned by the app (no module-level collectors)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from homespec.engine.types import GenerationStats
from homespec.vocab import PAIR_MODES

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "homespec_requests",
            "Requests by pair, mode and outcome",
            ["pair", "mode", "outcome"],
            registry=r,
        )
        self.tokens = Counter(
            "homespec_tokens",
            "Prompt and completion tokens (prompt_cached: prompt tokens a cache held; "
            "prediction, prediction_accepted: a request's prediction, and those of its tokens "
            "drafted and kept)",
            ["pair", "kind"],
            registry=r,
        )
        self.proposed = Counter(
            "homespec_draft_proposed_tokens", "Draft tokens proposed", ["pair"], registry=r
        )
        self.accepted = Counter(
            "homespec_draft_accepted_tokens", "Draft tokens accepted", ["pair"], registry=r
        )
        self.per_position = Counter(
            "homespec_draft_accepted_at_position",
            "Verify steps whose draft token at this position (0-based) was accepted",
            ["pair", "position"],
            registry=r,
        )
        self.ttft = Histogram(
            "homespec_ttft_seconds",
            "Time to first token, from the request's arrival (its wait in the queue included)",
            ["pair"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "homespec_e2e_seconds",
            "Request latency, end to end, from the request's arrival",
            ["pair"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.waited = Histogram(
            "homespec_queue_seconds",
            "Time a request waited before its engine started it (behind the pair's others)",
            ["pair"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.mode = Gauge(
            "homespec_pair_mode",
            "1 for the mode each pair runs in now",
            ["pair", "mode"],
            registry=r,
        )
        self.queue = Gauge(
            "homespec_queue_depth", "Requests waiting or running per pair", ["pair"], registry=r
        )
        self.deaths = Gauge(
            "homespec_engine_deaths",
            "Times the pair's engine process died (crash, kill) since the daemon started",
            ["pair"],
            registry=r,
        )
        self.refused = Counter(
            "homespec_refused_requests",
            "Completion requests answered with an error before any generation (invalid, "
            "unknown model, a full queue, a pair not ready, auth), by endpoint and HTTP "
            "status; they are not lines of the request log",
            ["endpoint", "status"],
            registry=r,
        )
        self.log_lost = Counter(
            "homespec_request_log_lost_lines",
            "Request log lines that could not be written (disk full, permissions)",
            registry=r,
        )
        self.threads = Gauge(
            "homespec_engine_threads",
            "llama.cpp CPU threads the pair used at the end of its last request (fewer while "
            "other processes keep cores busy)",
            ["pair"],
            registry=r,
        )
        self.draft_dropped = Gauge(
            "homespec_draft_dropped_for_memory",
            "1 while the memory watch keeps the pair's draft unloaded (memory ran short)",
            ["pair"],
            registry=r,
        )
        self.draft_drops = Gauge(
            "homespec_memory_draft_drops",
            "Times the memory watch dropped the pair's draft since the daemon started",
            ["pair"],
            registry=r,
        )
        self.engine_memory = Gauge(
            "homespec_engine_memory_bytes",
            "Memory the pair's engine process holds, per device (ram: resident; cudaN: NVML)",
            ["pair", "device"],
            registry=r,
        )

        self.worker_layers = Gauge(
            "homespec_worker_layers",
            "Target layers the pair's plan puts on each RPC worker device (rpc:NAME:INDEX)",
            ["pair", "device"],
            registry=r,
        )
        self.workers_down = Gauge(
            "homespec_workers_down",
            "RPC workers the pair declares but was planned without (they did not answer)",
            ["pair"],
            registry=r,
        )

    def observe(self, pair: str, mode: str, outcome: str, stats: GenerationStats | None) -> None:
        self.requests.labels(pair, mode, outcome).inc()
        if stats is None:
            return
        self.tokens.labels(pair, "prompt").inc(stats.prompt_tokens)
        self.tokens.labels(pair, "prompt_cached").inc(stats.cached_tokens)
        self.tokens.labels(pair, "completion").inc(stats.completion_tokens)
        self.tokens.labels(pair, "prediction").inc(stats.prediction_tokens)
        self.tokens.labels(pair, "prediction_accepted").inc(stats.accepted_prediction_tokens)
        self.proposed.labels(pair).inc(stats.proposed_tokens)
        self.accepted.labels(pair).inc(stats.accepted_tokens)
        for i, n in enumerate(stats.accepted_per_position):
            if n:
                self.per_position.labels(pair, str(i)).inc(n)
        self.ttft.labels(pair).observe(stats.ttft_ms / 1000.0)
        self.e2e.labels(pair).observe(stats.e2e_ms / 1000.0)
        self.waited.labels(pair).observe(stats.queue_ms / 1000.0)
        if stats.threads:
            self.threads.labels(pair).set(stats.threads)

    def set_state(
        self,
        pair: str,
        mode: str,
        queue_depth: int,
        deaths: int,
        memory: dict[str, int],
        *,
        draft_dropped: bool = False,
        draft_drops: int = 0,
        worker_layers: dict[str, int] | None = None,
        workers_down: int = 0,
    ) -> None:
        for m in PAIR_MODES:
            self.mode.labels(pair, m).set(1 if m == mode else 0)
        self.queue.labels(pair).set(queue_depth)
        self.deaths.labels(pair).set(deaths)
        self.draft_dropped.labels(pair).set(1 if draft_dropped else 0)
        self.draft_drops.labels(pair).set(draft_drops)
        for device, n in memory.items():
            self.engine_memory.labels(pair, device).set(n)
        for device, n in (worker_layers or {}).items():
            self.worker_layers.labels(pair, device).set(n)
        self.workers_down.labels(pair).set(workers_down)

    def render(self) -> bytes:
        return generate_latest(self.registry)
