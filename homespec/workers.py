"""RPC workers: other boxes whose memory a pair's target may use, through llama.cpp's RPC
backend (`homespec worker` on each of them; `[workers.NAME]` and a pair's `target_workers` in
models.toml).

Probing a worker never hangs and never takes the caller down: a TCP connect with a timeout, then
llama.cpp's own handshake and device query in a throwaway process with a timeout (llama.cpp
aborts a process whose worker does not answer). What comes back is a plain value the planner
turns into devices (`Remote`), or a reason the plan and `doctor` show.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from homespec.resources import Machine, Remote
from homespec.sizes import parse_size

if TYPE_CHECKING:
    from homespec.manifest import Manifest

LOG = logging.getLogger("homespec.workers")

DEFAULT_PORT = 50052
# A worker answers one client at a time (ggml-rpc's server loop): while a daemon's engine holds
# it, another probe waits in its backlog and times out.
BUSY = "busy (it serves one client at a time: a running homespec daemon may hold it)"


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """'host:port' → (host, port); ValueError naming what is wrong. llama.cpp's RPC client
    splits an endpoint at its first colon, so IPv6 addresses cannot be used."""
    host, sep, port = endpoint.partition(":")
    if not sep or not host:
        raise ValueError(f"{endpoint!r} is not HOST:PORT")
    if ":" in port or host.startswith("["):
        raise ValueError(f"{endpoint!r}: llama.cpp's RPC takes an IPv4 address or a host name")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{endpoint!r}: port must be 1..65535")
    return host, int(port)


def public_bind(host: str) -> str:
    """Why binding a worker on `host` would expose it beyond this box and its private network
    ("" when it does not): llama.cpp's RPC server has no authentication, and anyone who reaches
    it can make it allocate memory and run graphs."""
    try:
        addresses = {ipaddress.ip_address(host)}
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, None)
        except OSError:
            return f"{host!r} does not resolve"
        addresses = {ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos}
    for a in sorted(addresses, key=str):
        if a.is_unspecified:
            return f"{host} listens on every interface, public ones included"
        if not (a.is_loopback or a.is_private or a.is_link_local):
            return f"{a} is a public address"
    return ""


@dataclass(frozen=True)
class WorkerStatus:
    """What probing one worker found."""

    name: str
    endpoint: str
    reachable: bool
    reason: str = ""  # why it is not usable
    devices: tuple[dict[str, Any], ...] = ()  # name, description, kind, free, total
    probe_ms: float = 0.0


def _query(endpoint: str, timeout: float) -> tuple[list[dict[str, Any]], str]:
    argv = [sys.executable, "-m", "homespec.engine.rpc_query", endpoint]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [], f"connected, but no RPC handshake within {timeout:g} s: {BUSY}, or not a worker"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        if "handshake" in done.stderr:
            return [], (
                "RPC handshake failed: not a homespec/llama.cpp worker, or another llama.cpp "
                "version (run the same homespec install on both boxes)"
            )
        return [], f"device query failed (exit {done.returncode}): {last}"
    try:
        devices = json.loads(done.stdout.strip().splitlines()[-1])["devices"]
    except (ValueError, KeyError, IndexError):
        return [], "device query printed no JSON"
    return list(devices), ""


def probe(name: str, endpoint: str, timeout: float) -> WorkerStatus:
    t0 = time.perf_counter()

    def status(
        ok: bool, reason: str = "", devices: list[dict[str, Any]] | None = None
    ) -> WorkerStatus:
        ms = (time.perf_counter() - t0) * 1000
        return WorkerStatus(name, endpoint, ok, reason, tuple(devices or ()), ms)

    try:
        host, port = split_endpoint(endpoint)
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except ValueError as exc:
        return status(False, str(exc))
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        return status(False, f"unreachable ({why} within {timeout:g} s)")
    devices, reason = _query(endpoint, timeout + 5)
    if reason:
        return status(False, reason)
    if not devices:
        return status(False, "reports no devices")
    return status(True, devices=devices)


def probe_all(workers: Mapping[str, tuple[str, float]]) -> dict[str, WorkerStatus]:
    """{name: (endpoint, timeout)} → {name: status}, probed in parallel."""
    if not workers:
        return {}
    with ThreadPoolExecutor(max_workers=min(8, len(workers))) as pool:
        futures = {n: pool.submit(probe, n, ep, t) for n, (ep, t) in workers.items()}
        return {n: f.result() for n, f in futures.items()}


def remotes(
    statuses: Mapping[str, WorkerStatus], budgets: Mapping[str, str | None]
) -> tuple[Remote, ...]:
    """The reachable workers' devices as planner devices: `rpc:NAME:INDEX`."""
    out = []
    for name, st in statuses.items():
        if not st.reachable:
            continue
        cap = budgets.get(name)
        for i, d in enumerate(st.devices):
            out.append(
                Remote(
                    device=f"rpc:{name}:{i}",
                    worker=name,
                    endpoint=st.endpoint,
                    index=i,
                    description=str(d.get("description", "")),
                    total=int(d.get("total", 0)),
                    free=int(d.get("free", 0)),
                    budget=None if cap is None else parse_size(cap),
                )
            )
    return tuple(out)


def attach(machine: Machine, manifest: Manifest, names: Iterable[str]) -> Machine:
    """`machine` with the named workers probed: their devices as `remotes` (budgets applied),
    the others in `workers_down` with the reason."""
    specs = manifest.spec.workers
    wanted = [n for n in dict.fromkeys(names) if n in specs]
    found = probe_all({n: (specs[n].endpoint, specs[n].connect_timeout_s) for n in wanted})
    down = {n: st.reason for n, st in found.items() if not st.reachable}
    for name, reason in down.items():
        LOG.warning("worker %s (%s): %s", name, specs[name].endpoint, reason)
    return replace(
        machine,
        remotes=machine.remotes + remotes(found, {n: specs[n].budget for n in found}),
        workers_down={**machine.workers_down, **down},
    )
