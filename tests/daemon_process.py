"""A real `homespec serve` process on loopback for the daemon tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx

from homespec.engine.crashsite import CrashSite
from homespec.engine.protocol import Load, Loaded, Stop
from homespec.manifest import Manifest, load_manifest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


CHAT = "/v1/chat/completions"
LONG = "forever Once upon a time, a lighthouse keeper kept a very long watch. "


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


REPO = Path(__file__).resolve().parent.parent
# The daemon runs tests/fake_engine.py for every pair instead of llama.cpp (no model files).
FAKE_ENGINE = {"HOMESPEC_ENGINE": "tests.fake_engine", "PYTHONPATH": str(REPO)}


def fake_manifest_file(directory: Path, server: str = "") -> Path:
    """The demo pair's shape (a draft pair and an n-gram pair over one target) with model
    files that need not exist: for a daemon running the fake engine."""
    path = directory / "models.toml"
    path.write_text(
        f'default_pair = "smollm2"\n[server]\n{server}\n'
        '[models.t]\npath = "fake-target.gguf"\n[models.d]\npath = "fake-draft.gguf"\n'
        '[pairs.smollm2]\ntarget = "t"\ndraft = "d"\nn_ctx = 1024\n'
        "[pairs.smollm2.tasks.creative]\nspeculative = false\n"
        '[pairs.smollm2-ngram]\ntarget = "t"\ndraft = "ngram"\nn_ctx = 1024\n'
    )
    return path


def demo_manifest_file(
    demo: Manifest, directory: Path, server: str = "", flash_attn: str = "auto"
) -> Path:
    """The demo pair with absolute paths (so the file can live anywhere) and a small context.
    `flash_attn` other than "auto" pins the CPU contexts to llama.cpp's full batch, so their
    footprint does not follow what this machine measured (engine/flash.py)."""
    target = demo.model_path("smollm2-135m-f32")
    draft = demo.model_path("smollm2-135m-q4_1")
    path = directory / "models.toml"
    path.write_text(
        f'default_pair = "smollm2"\n[server]\n{server}\n'
        f'[models.t]\npath = "{target}"\n[models.d]\npath = "{draft}"\n'
        f'[pairs.smollm2]\ntarget = "t"\ndraft = "d"\nn_ctx = 1024\nflash_attn = "{flash_attn}"\n'
        "[pairs.smollm2.tasks.creative]\nspeculative = false\n"
        f'[pairs.smollm2-ngram]\ntarget = "t"\ndraft = "ngram"\nn_ctx = 1024\n'
        f'flash_attn = "{flash_attn}"\n'
    )
    return path


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    url: str
    state_dir: Path
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(self.url + path, timeout=30, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=120, **kw)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)


def start_daemon(
    manifest: Path, tmp: Path, *extra: str, env: dict[str, str] | None = None, wait: bool = True
) -> Daemon:
    port = free_port()
    state = tmp / "state"
    log_path = tmp / f"daemon-{port}.log"
    cmd = [
        sys.executable,
        "-m",
        "homespec",
        "serve",
        "--config",
        str(manifest),
        "--port",
        str(port),
        "--state-dir",
        str(state),
        *extra,
    ]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    d = Daemon(proc, f"http://127.0.0.1:{port}", state, log_path)
    if wait:
        wait_until(d, all_attached)
        key = {**os.environ, **(env or {})}.get("HOMESPEC_API_KEY")
        wait_measured(d, {"Authorization": f"Bearer {key}"} if key else {})
    return d


def all_attached(health: dict[str, Any]) -> bool:
    """Every pair serves in the mode it declares: speculative, or n-gram drafting for a pair
    without a draft model, not n-gram drafting while its draft is still loading."""
    pairs = health["pairs"].values()
    return health["status"] == "ready" and all(
        p["mode"] in ("speculative", "ngram") and p["reason"] != "draft model still loading"
        for p in pairs
    )


def wait_measured(d: Daemon, headers: dict[str, str], timeout: float = 120) -> None:
    """Until every pair's engine has measured the governor's costs (it does so in pieces
    between requests once its draft serves): the tests start from a settled daemon."""

    def measured(status: dict[str, Any]) -> bool:
        return all(p["measured_after_s"] is not None for p in status["pairs"])

    wait_until(d, measured, timeout, path="/homespec/status", headers=headers)


def wait_until(
    d: Daemon,
    ok: Any,
    timeout: float = 120,
    *,
    path: str = "/health",
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Poll `path` (JSON) until `ok` of it holds; its last answer."""
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        if d.proc.poll() is not None:
            raise AssertionError(f"daemon exited with {d.proc.returncode}:\n{d.log()}")
        try:
            last = d.get(path, headers=headers or {}).json()
            if ok(last):
                return last
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"daemon not ready in {timeout}s: {last}\n{d.log()}")


def fake_daemon(
    tmp: Path, *extra: str, server: str = "", env: dict[str, str] | None = None, wait: bool = True
) -> Daemon:
    """A daemon over fake_manifest_file() whose engines run the scripted fake target."""
    config = fake_manifest_file(tmp, server)
    return start_daemon(config, tmp, *extra, env={**FAKE_ENGINE, **(env or {})}, wait=wait)


@contextmanager
def fake_engine(
    directory: Path, env: dict[str, str], without_draft: str = ""
) -> Iterator[Connection]:
    """The engine program over the fake target in a process of its own, loaded and driven
    over a socket pair the way the daemon drives it; stopped (exit 0) at the end."""
    manifest = load_manifest(fake_manifest_file(directory))
    ours, theirs = socket.socketpair()
    site, site_fd = CrashSite.shared()
    cmd = [sys.executable, "-m", "tests.fake_engine", "--fd", str(theirs.fileno())]
    cmd += ["--site-fd", str(site_fd), "--pair", "smollm2", "--log-level", "WARNING"]
    proc = subprocess.Popen(
        cmd, pass_fds=(theirs.fileno(), site_fd), env={**os.environ, **FAKE_ENGINE, **env}
    )
    theirs.close()
    os.close(site_fd)
    conn = Connection(ours.detach())
    try:
        conn.send(Load(manifest, "smollm2", None, without_draft=without_draft))
        assert isinstance(conn.recv(), Loaded)
        yield conn
        conn.send(Stop())
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()
        conn.close()
        site.close()


def read_log(daemon: Daemon) -> list[dict[str, object]]:
    """The daemon's request log, a record a line."""
    lines = (daemon.state_dir / "requests.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]
