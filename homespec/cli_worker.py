"""`homespec worker`: lend this box's memory to another box's homespec over llama.cpp's RPC."""

from __future__ import annotations

import os
import socket

import click

from homespec.cli_common import err, load_llama_first
from homespec.errors import ConfigError
from homespec.paths import cache_dir as cache_dir_of_homespec
from homespec.workers import DEFAULT_PORT, public_bind


@click.command()
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    envvar="HOMESPEC_WORKER_HOST",
    help="Address to listen on: loopback, or this box's address on a private network.",
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    envvar="HOMESPEC_WORKER_PORT",
)
@click.option(
    "--device",
    "devices",
    multiple=True,
    help="llama.cpp device to lend (repeatable, e.g. CUDA0; default: every GPU, else the CPU).",
)
@click.option("--threads", type=click.IntRange(1, 512), help="CPU threads (default: all cores).")
@click.option(
    "--cache/--no-cache",
    default=True,
    show_default=True,
    help="Keep received weights on disk (~/.cache/homespec/rpc), so a restart of the main "
    "box sends only what is new.",
)
@click.option(
    "--allow-public",
    is_flag=True,
    help="Listen on a public address or every interface (0.0.0.0). llama.cpp's RPC server has "
    "no authentication: anyone who reaches the port can use this box's memory and compute.",
)
def worker(
    host: str,
    port: int,
    devices: tuple[str, ...],
    threads: int | None,
    cache: bool,
    allow_public: bool,
) -> None:
    """Serve this box's GPU or RAM to a homespec on another box (llama.cpp's RPC server).

    The main box lists it in models.toml (`[workers.NAME] endpoint = "HOST:PORT"`) and a pair
    spreads its target over it (`target_workers = ["NAME"]`). Both boxes must run the same
    homespec install: this is llama.cpp's RPC server from the very library homespec loads, so
    they speak the same protocol version. It serves one client at a time. Runs until killed;
    `systemd/homespec-worker.service` runs it as a service.
    """
    if ":" in host:
        raise ConfigError(
            f"--host {host}: llama.cpp's RPC server takes an IPv4 address or a host name",
            "use 127.0.0.1 or this box's private IPv4 address",
        )
    why = public_bind(host)
    if why and not allow_public:
        raise ConfigError(
            f"refusing to listen on {host}: {why}, and llama.cpp's RPC server has no "
            "authentication",
            "listen on loopback or a private address (--host 192.168.x.y), or pass "
            "--allow-public if a firewall guards the port",
        )
    try:  # llama.cpp's server would only print "Failed to create server socket"
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            "another worker (or program) may hold the port: pick another with --port",
        ) from None
    load_llama_first()
    from homespec.engine.llama_backend import ggml

    g = ggml()
    available = g.devices()
    if devices:
        by_name = {d.name.lower(): d for d in available}
        unknown = [n for n in devices if n.lower() not in by_name]
        if unknown:
            raise ConfigError(
                f"no llama.cpp device named {', '.join(unknown)}",
                "this box has: " + ", ".join(d.name for d in available),
            )
        lend = [by_name[n.lower()] for n in devices]
    else:
        # as llama.cpp's rpc-server: every GPU (integrated ones too), else the CPU
        lend = [d for d in available if d.kind in ("gpu", "igpu")] or [
            d for d in available if d.kind == "cpu"
        ]
    if why:
        err(f"homespec worker: WARNING: {why}; anyone who reaches port {port} can use this box")
    cache_dir = cache_dir_of_homespec() / "rpc" if cache else None
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
    endpoint = f"{host}:{port}"
    names = ", ".join(f"{d.name} ({d.description})" for d in lend)
    err(f"homespec worker: lending {names} on {endpoint}")
    g.serve(endpoint, lend, threads=threads or os.cpu_count() or 1, cache=cache_dir)
