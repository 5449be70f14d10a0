"""Daemon commands: `serve` runs it, `status` asks it, `report` reads its request log."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import click

from homespec.cli_common import config_option, err, stats_line
from homespec.engine.types import GenerationRequest
from homespec.errors import ConfigError
from homespec.sizes import fmt_size


@click.command()
@config_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True)
@click.option(
    "--pair",
    "pairs",
    multiple=True,
    help="Pair to serve (repeatable; default: server.pairs, else default_pair).",
)
@click.option(
    "--state-dir",
    envvar="HOMESPEC_STATE_DIR",
    help="Where requests.jsonl goes (default: $XDG_STATE_HOME/homespec).",
)
@click.option(
    "--api-key-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="File holding the API key (else $HOMESPEC_API_KEY). Required off loopback.",
)
def serve(
    config: Path | None,
    host: str,
    port: int,
    pairs: tuple[str, ...],
    state_dir: str | None,
    api_key_file: Path | None,
) -> None:
    """Run the daemon: an OpenAI-compatible API over the pair(s), with per-request stats.

    The target loads first and serves plain decoding as soon as it is ready; the draft loads
    after and the pair turns speculative when it is attached (/health shows both). Endpoints:
    POST /v1/chat/completions and /v1/completions (stream or not; extras "speculative", "task",
    "draft_tokens"; stats in a "homespec" object), GET /v1/models (the three also without /v1,
    as llama-server's), /health, /metrics, /homespec/status. Every request that runs is a line
    in requests.jsonl (one refused before it ran is counted: /metrics, `homespec status`). Under
    systemd (Type=notify) it reports READY=1 once the target serves; SIGTERM drains in-flight
    requests, then unloads; SIGHUP (or `homespec reload`) re-reads models.toml.
    """
    from homespec.daemon.serve import build, run
    from homespec.manifest import load_manifest

    if not logging.getLogger().isEnabledFor(logging.INFO):  # a service logs what it does
        logging.getLogger("homespec").setLevel(logging.INFO)

    manifest = load_manifest(config)
    daemon_config = build(
        manifest, host=host, pairs=list(pairs), state=state_dir, key_file=api_key_file
    )
    err(f"homespec: serving {', '.join(daemon_config.pairs)} on http://{host}:{port}")
    run(daemon_config, host=host, port=port)


url_option = click.option(
    "--url", envvar="HOMESPEC_URL", help="The daemon (default: http://127.0.0.1:8080)."
)


def _uptime(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def _ms(ms: float) -> str:
    """A cost in ms to three figures (a GPU's decodes cost about one; a CPU's tens)."""
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.3g}"


def _memory(p: dict[str, Any]) -> str:
    planned = p.get("memory_planned") or {}
    target = sum(d["target"] for d in planned.values())
    draft = sum(d["draft"] for d in planned.values())
    total = sum(d["total"] for d in planned.values())
    if not total:
        return "—"
    devices = "+".join(planned)
    return f"{fmt_size(total)} ({devices}; target {fmt_size(target)}, draft {fmt_size(draft)})"


@click.command()
@url_option
@click.option("--json", "as_json", is_flag=True, help="Print what the daemon did as JSON.")
def reload(url: str | None, as_json: bool) -> None:
    """Make the running daemon re-read its models.toml (as `systemctl reload homespec` does).

    Unchanged pairs keep running; changed pairs finish their requests and restart on the new
    settings; removed pairs finish and stop; new pairs (in [server] pairs) start. A config
    with any error is refused as a whole with the error `ask` would print, exit 2, and the
    daemon keeps running what it ran.
    """
    from homespec.client import DaemonClient

    code, result = DaemonClient(url).post("/homespec/reload")
    if code == 400:
        message = (result.get("error") or {}).get("message")
        if not message:
            raise ConfigError("the new config was refused", "fix models.toml and reload again")
        # The daemon's message says what to fix already (`— fix the syntax at that line`)
        raise ConfigError(f"{message}; then run `homespec reload` again")
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    for what in ("kept", "restarted", "started", "stopped"):
        if result[what]:
            click.echo(f"{what}: {', '.join(result[what])}")
    for note in result["notes"]:
        click.echo(f"note: {note}")


# What a refusal's HTTP status means here (app.py, errors.py).
_REFUSALS = {
    "400": "(invalid request)",
    "401": "(API key)",
    "404": "(unknown model)",
    "413": "(body too big)",
    "421": "(Host header)",
    "429": "(wrong API keys)",
    "503": "(busy or not ready)",
}


@click.command()
@url_option
@click.option("--json", "as_json", is_flag=True, help="Print the daemon's status object.")
def status(url: str | None, as_json: bool) -> None:
    """What the daemon runs now: each pair's mode and why, memory including the draft, its
    engine process (pid, resident memory, restarts), rolling accept rate, queue and uptime
    (like `ollama ps`), and the completion requests refused before they ran, by HTTP status."""
    from homespec.client import DaemonClient

    st = DaemonClient(url).get("/homespec/status")
    if as_json:
        click.echo(json.dumps(st, indent=2))
        return
    click.echo(f"homespec {st['version']} · {st['status']} · up {_uptime(st['uptime_s'])}")
    refused = st.get("refused") or {}  # absent from a daemon older than the count
    if refused:
        what = ", ".join(
            f"{n} × {code} {_REFUSALS.get(code, '')}".rstrip() for code, n in refused.items()
        )
        click.echo(f"refused before running (not in the request log): {what}")
    click.echo(f"{'PAIR':<14} {'MODE':<12} {'ACCEPT':>7} {'QUEUE':>6} {'REQS':>5}  MEMORY")
    for p in st["pairs"]:
        rate = p["rolling_accept_rate"]
        accept = "—" if rate is None else f"{rate:.0%}"
        queue = f"{p['queue_depth']}/{p['max_queue']}"
        click.echo(
            f"{p['name']:<14} {p['mode']:<12} {accept:>7} {queue:>6} {p['requests']:>5}  "
            f"{_memory(p)}"
        )
        click.echo(f"{'':<14} why: {p['reason']}")
        if p.get("prompt_note"):
            click.echo(f"{'':<14} chat: llama.cpp's built-in renderer ({p['prompt_note']})")
        plan = p.get("plan") or {}
        if plan.get("remote_layers") or plan.get("workers_down"):
            spread = ", ".join(f"{n} on {d}" for d, n in plan["remote_layers"].items() if n)
            down = ", ".join(plan["workers_down"])
            click.echo(
                f"{'':<14} workers: target layers {spread or 'none'}"
                + (f"; DOWN: {down} (re-planned when back)" if down else "")
            )
        for note in plan.get("notes") or []:
            click.echo(f"{'':<14} note: {note}")
        engine = p.get("engine") or {}
        if engine.get("pid"):
            held = ", ".join(f"{d} {fmt_size(n)}" for d, n in (engine.get("memory") or {}).items())
            deaths = len(engine.get("deaths") or [])
            again = f", restarted {deaths}×" if deaths else ""
            click.echo(f"{'':<14} engine: pid {engine['pid']}, holds {held or '—'}{again}")
        if engine.get("threads_reason"):
            click.echo(f"{'':<14} threads: {engine['threads']} ({engine['threads_reason']})")
        started = _start(p)
        if started:
            click.echo(f"{'':<14} start: {started}")
        costs = p.get("costs") or {}
        if costs.get("verify_ms"):
            curve = ", ".join(f"{n}→{_ms(ms)}" for n, ms in costs["verify_ms"].items())
            click.echo(f"{'':<14} costs: target decode ms by tokens {curve}")
        if costs.get("draft_ms"):
            batches = ", ".join(f"{n}→{_ms(ms)}" for n, ms in costs["draft_ms"].items())
            click.echo(f"{'':<14}        draft decode ms by tokens {batches}")
        if costs.get("draft_agreement") is not None:
            agree = costs["draft_agreement"]
            click.echo(
                f"{'':<14}        draft agrees with the target on {agree:.0%} of next tokens"
            )
        if costs.get("draft_catch_up"):
            click.echo(f"{'':<14}        draft {costs['draft_catch_up']}")
        if costs.get("step_overhead_ms"):
            own = ", ".join(f"{k} {ms:.2f}" for k, ms in costs["step_overhead_ms"].items())
            click.echo(f"{'':<14}        homespec's own work a step beyond its decodes, ms: {own}")
        cache = p.get("prompt_cache") or {}
        if cache.get("copy_over_read") is not None:
            what = "put aside" if cache["puts_aside"] else "read again (copies too dear)"
            click.echo(
                f"{'':<14} prompt cache: a copied token costs {cache['copy_over_read']:.3g}× a "
                f"read one ({cache['copy_ms_per_token']:.3g} against "
                f"{cache['read_ms_per_token']:.3g} ms): conversations {what}"
            )
        for role, v in (p.get("repack") or {}).items():
            if v.get("note"):
                click.echo(f"{'':<14} {role}: {v['note']}")
        for role, hp in (p.get("huge_pages") or {}).items():
            note = f": {hp['note']}" if hp.get("note") else ""
            click.echo(
                f"{'':<14} {role}: {fmt_size(hp['huge'])} of {fmt_size(hp['bytes'])} in 2 MiB "
                f"pages{note}"
            )


def _start(pair: dict[str, Any]) -> str:
    """How far the pair's start has come: its target serving, its draft drafting, the
    governor's costs measured (in pieces between requests; priors until then)."""
    ready, spec = pair.get("ready_after_s"), pair.get("speculative_after_s")
    if ready is None:
        return ""
    said = [f"target served after {ready:.1f} s"]
    if spec is not None:
        said.append(f"draft after {spec:.1f} s")
    measured = pair.get("measured_after_s", 0)  # (absent: a daemon older than the field)
    if measured is None and spec is not None:
        said.append("measuring the costs between requests (priors until then)")
    elif measured:
        said.append(f"costs measured after {measured:.1f} s")
    return ", ".join(said)


@click.command()
@click.option(
    "--state-dir", envvar="HOMESPEC_STATE_DIR", help="Where the daemon writes requests.jsonl."
)
@click.option("--since", default="1h", show_default=True, help="Window: 15m, 1h, 2d, or all.")
@click.option("--by", type=click.Choice(["pair", "task"]), default="pair", show_default=True)
@click.option("--json", "as_json", is_flag=True)
def report(state_dir: str | None, since: str, by: str, as_json: bool) -> None:
    """Per-request stats from the daemon's request log: requests, p50/p95 ttft and e2e, tok/s,
    accept rate and speculative share, with a warning when a pair's acceptance dropped
    against its own history."""
    from homespec import reqlog
    from homespec.paths import state_dir as resolve_state_dir

    path = resolve_state_dir(state_dir) / reqlog.LOG_NAME
    try:
        since_s = None if since == "all" else reqlog.parse_since(since)
    except ValueError as exc:
        raise ConfigError(f"--since: {exc}", "or --since all") from None
    records, bad = reqlog.read(path)
    rows, warnings = reqlog.report(records, since_s=since_s, by=by, now=time.time())
    if as_json:
        payload = {
            "log": str(path),
            "since": since,
            "by": by,
            "rows": [r.to_dict() for r in rows],
            "warnings": warnings,
            "unreadable_lines": bad,
        }
        click.echo(json.dumps(payload, indent=2))
        return
    if not rows:
        err(f"report: no requests in {path} for --since {since}")
        return
    for line in reqlog.render(rows, by):
        click.echo(line)
    for w in warnings:
        err(f"warning: {w}")
    if bad:
        err(f"report: skipped {bad} unreadable line(s) in {path}")


def ask_via_daemon(
    url: str | None, req: GenerationRequest, pair: str | None, *, as_json: bool
) -> bool:
    """Answer `req` through a running daemon; False (nothing printed) when none answers there
    or it does not serve `pair`, so the caller answers in-process."""
    from homespec.client import DaemonClient
    from homespec.daemon.openai_api import request_payload

    client = DaemonClient(url)
    health = client.health()
    if not health or health.get("status") not in ("ready", "degraded"):
        return False
    if pair is not None and pair not in health.get("pairs", {}):
        err(f"homespec: the daemon at {client.url} does not serve pair {pair!r}: in-process")
        return False
    path, payload = request_payload(req, pair)
    parts: list[str] = []
    stats: dict[str, Any] = {}
    for event in client.stream(path, payload):
        choice = event["choices"][0] if event.get("choices") else {}
        text = choice.get("delta", {}).get("content") or choice.get("text") or ""
        if text:
            parts.append(text)
            if not as_json:
                click.echo(text, nl=False)
        if "homespec" in event:
            stats = event["homespec"]
    if as_json:
        click.echo(json.dumps({"text": "".join(parts), "stats": stats, "via": client.url}))
    else:
        click.echo()
        err(stats_line(stats) + f" · via daemon {client.url}")
    return True
