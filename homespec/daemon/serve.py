"""`homespec serve`: check the bind and the API key, build the app, run uvicorn until SIGTERM.

SIGTERM (systemd stop) makes uvicorn stop accepting connections and wait for in-flight
requests, streams included, up to `server.shutdown_timeout_s`; then the app's lifespan unloads
the models. Binding anything but loopback requires an API key, read from $HOMESPEC_API_KEY or
a file (never from the command line, where `ps` would show it).
"""

from __future__ import annotations

import ipaddress
import logging
import os
from pathlib import Path

import uvicorn

from homespec.daemon.app import create_app
from homespec.daemon.service import DaemonConfig
from homespec.errors import ConfigError
from homespec.manifest import Manifest
from homespec.paths import state_dir

LOG = logging.getLogger("homespec.daemon")
API_KEY_ENV = "HOMESPEC_API_KEY"


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
            key = key_file.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"--api-key-file {key_file}: {exc}", "give a readable file") from None
        if not key:
            raise ConfigError(f"--api-key-file {key_file} is empty", "put the key in it")
        return key
    return os.environ.get(API_KEY_ENV) or None


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
    names = pairs or manifest.spec.server.pairs or [manifest.default_pair]
    for name in names:
        manifest.pair(name)
    return DaemonConfig(manifest=manifest, state_dir=state_dir(state), pairs=names, api_key=key)


def run(config: DaemonConfig, *, host: str, port: int) -> None:
    app = create_app(config)
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
    server.run()
