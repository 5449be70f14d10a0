"""`homespec serve`: check the bind and the API key, build the app, run uvicorn until SIGTERM.

SIGTERM (systemd stop) makes uvicorn stop accepting connections and wait for in-flight
requests, streams included, up to `server.shutdown_timeout_s`; then the app's lifespan unloads
the models. Binding anything but loopback requires an API key, read from $HOMESPEC_API_KEY or
a file (never from the command line, where `ps` would show it).
"""

from __future__ import annotations

import errno
import importlib
import ipaddress
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path

import uvicorn

from homespec.api_key import API_KEY_ENV, KEY_HINT, from_env, sendable
from homespec.daemon import cors
from homespec.daemon.app import create_app
from homespec.daemon.service import DaemonConfig
from homespec.errors import ConfigError
from homespec.manifest import Manifest
from homespec.paths import state_dir
from homespec.reqlog import LOG_NAME, RequestLog
from homespec.resources import Machine, probe_machine

LOG = logging.getLogger("homespec.daemon")
# What the memory watch samples, as MODULE:FUNCTION returning a resources.Machine. The tests
# point it at a scripted probe (tests/fake_memory.py), as HOMESPEC_ENGINE points at a fake engine.
MEMORY_PROBE_ENV = "HOMESPEC_MEMORY_PROBE"


def memory_probe() -> Callable[[], Machine]:
    where = os.environ.get(MEMORY_PROBE_ENV)
    if not where:
        return probe_machine
    module, _, name = where.partition(":")
    probe: Callable[[], Machine] = getattr(importlib.import_module(module), name)
    return probe


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_api_key(key_file: Path | None) -> str | None:
    if key_file is not None:
        try:
            key = key_file.read_text(encoding="utf-8-sig").strip()  # a BOM (Notepad) dropped
        except OSError as exc:
            raise ConfigError(f"--api-key-file {key_file}: {exc}", "give a readable file") from None
        except UnicodeDecodeError:
            raise ConfigError(f"--api-key-file {key_file} is not text", KEY_HINT) from None
        if not key:
            raise ConfigError(f"--api-key-file {key_file} is empty", "put the key in it")
        return sendable(key, f"--api-key-file {key_file}")
    return from_env()


def build(
    manifest: Manifest,
    *,
    host: str,
    pairs: list[str],
    state: str | None,
    key_file: Path | None,
) -> DaemonConfig:
    key = read_api_key(key_file)
    if not is_loopback(host) and not key:
        raise ConfigError(
            f"refusing to listen on {host} without an API key: anyone on the network could "
            "use the models",
            f"set {API_KEY_ENV} (or --api-key-file), or bind 127.0.0.1",
        )
    cors.check(manifest.spec.server.cors_origins, has_key=bool(key))
    names = pairs or manifest.spec.server.pairs or [manifest.default_pair]
    for name in names:
        manifest.pair(name)
    where = state_dir(state)
    log = RequestLog(where / LOG_NAME)
    try:
        log.check()
    except OSError as exc:
        raise ConfigError(
            f"cannot write the request log {log.path}: {exc.strerror or exc}",
            "give --state-dir (or $HOMESPEC_STATE_DIR) a directory this user can write",
        ) from None
    return DaemonConfig(
        manifest=manifest,
        state_dir=where,
        pairs=names,
        api_key=key,
        host=host,
        pair_args=tuple(pairs),
    )


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything loads: a taken port is an error at once.

    Made with its protocol named (IPPROTO_TCP, as getaddrinfo gives uvicorn when it binds
    itself): asyncio turns Nagle's algorithm off (TCP_NODELAY) only on connections whose socket
    says TCP. Left at 0, a non-streamed response's body waited for the client's delayed ACK of
    its headers: 40 ms more on every request after a keep-alive connection's first (an OpenAI
    client's default), a third of a short answer's time."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        taken = exc.errno == errno.EADDRINUSE
        raise ConfigError(
            f"{host}:{port} is already in use"
            if taken
            else f"cannot listen on {host}:{port}: {exc}",
            "stop what listens there or pick another --port" if taken else "check --host",
        ) from None
    return sock


def run(config: DaemonConfig, *, host: str, port: int) -> None:
    sock = bind(host, port)
    app = create_app(config, probe=memory_probe())
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="info",
            timeout_graceful_shutdown=int(config.manifest.spec.server.shutdown_timeout_s) or None,
            access_log=False,
        )
    )
    server.run(sockets=[sock])
