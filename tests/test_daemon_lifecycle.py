"""The daemon's life as a process (the scripted fake target, tests/fake_engine.py): kill -9
and SIGTERM mid-stream, API keys and binds, a taken port, the target serving before the draft,
unknown models, what the governor learned surviving a restart, and its sockets' options.
test_daemon.py has the API against one daemon kept up for the module."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from homespec.cli import cli
from homespec.daemon.serve import bind

from .daemon_process import CHAT, LONG, fake_daemon, fake_manifest_file, read_log, user


def test_kill_9_mid_stream_leaves_only_whole_log_lines(tmp_path: Path) -> None:
    d = fake_daemon(tmp_path, env={"HOMESPEC_FAKE_DECODE_S": "0.01"})
    try:
        for _ in range(3):
            d.post(CHAT, {"messages": user("Hi"), "max_tokens": 6})
        # 3 s of answer: the kill comes a few events (stream_interval_ms apart) into it.
        body = {"messages": user(LONG), "max_tokens": 300, "stream": True, "speculative": False}
        with httpx.stream("POST", d.url + CHAT, json=body, timeout=60) as r:
            for n, _ in enumerate(r.iter_lines()):
                if n == 4:
                    d.stop(signal.SIGKILL)
                    break
    finally:
        d.stop(signal.SIGKILL)
    raw = (d.state_dir / "requests.jsonl").read_bytes()
    assert raw.endswith(b"\n")
    assert [json.loads(line)["outcome"] for line in raw.splitlines()] == ["ok"] * 3


def test_sigterm_drains_the_in_flight_stream_then_exits(tmp_path: Path) -> None:
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # plays systemd's NOTIFY_SOCKET
    notify.bind(str(tmp_path / "notify.sock"))
    notify.settimeout(30)
    d = fake_daemon(
        tmp_path,
        env={"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "HOMESPEC_FAKE_DECODE_S": "0.01"},
    )
    assert notify.recv(4096).startswith(b"READY=1\nSTATUS=serving pair smollm2")
    body = {"messages": user(LONG), "max_tokens": 60, "stream": True, "speculative": False}
    lines: list[str] = []
    with httpx.stream("POST", d.url + CHAT, json=body, timeout=60) as r:
        for n, line in enumerate(r.iter_lines()):
            lines.append(line)
            if n == 2:
                d.proc.send_signal(signal.SIGTERM)
    lines = [line for line in lines if line]
    assert lines[-1] == "data: [DONE]"
    assert '"finish_reason": "length"' in "".join(lines)
    # uvicorn re-raises the signal once drained: systemd counts death by SIGTERM as clean.
    assert d.proc.wait(timeout=60) in (0, -signal.SIGTERM)
    assert "models unloaded" in d.log()
    assert notify.recv(4096).startswith(b"STOPPING=1")
    notify.close()
    assert [r["outcome"] for r in read_log(d)] == ["ok"]


def test_api_key_is_enforced_everywhere_but_health(tmp_path: Path) -> None:
    d = fake_daemon(tmp_path, env={"HOMESPEC_API_KEY": "s3cret", "HOMESPEC_FAKE_DECODE_S": "0.01"})
    try:
        assert d.get("/v1/models").status_code == 401
        assert d.get("/metrics").status_code == 401
        for scheme in ("Bearer", "bearer", "BEARER"):  # the scheme is case-insensitive
            ok = d.get("/v1/models", headers={"Authorization": f"{scheme} s3cret"})
            assert ok.status_code == 200, scheme
        assert d.get("/v1/models", headers={"X-API-Key": "s3cret"}).status_code == 200
        assert d.get("/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
        # A browser's preflight carries no key and is answered; the 401 after it is readable
        # by the page (CORS around the gate), so its script can say what went wrong.
        page = {"Origin": "http://localhost:3000"}
        asks = {**page, "Access-Control-Request-Method": "POST"}
        assert httpx.request("OPTIONS", d.url + CHAT, headers=asks).status_code == 200
        refused = d.post(CHAT, {"messages": user("Hi")}, headers=page)
        assert refused.status_code == 401
        assert refused.headers["access-control-allow-origin"] == "http://localhost:3000"
        # With a key, the Host check is the key's job: any Host with the right key is served.
        evil = {"Authorization": "Bearer s3cret", "Host": "evil.example"}
        assert d.get("/v1/models", headers=evil).status_code == 200
        # A client that gives up on a non-streamed answer stops its generation (the auth layer
        # used to keep it running to max_tokens, holding the queue).
        body = {"messages": user(LONG), "max_tokens": 400, "speculative": False}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                d.url + CHAT,
                json=body,
                headers={"Authorization": "Bearer s3cret"},
                timeout=httpx.Timeout(5, read=0.5),
            )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if (d.state_dir / "requests.jsonl").exists() and read_log(d):
                break
            time.sleep(0.05)
        assert read_log(d)[-1]["outcome"] == "cancelled", read_log(d)[-1]
        status = d.get("/homespec/status", headers={"Authorization": "Bearer s3cret"}).json()
        assert status["pairs"][0]["queue_depth"] == 0
    finally:
        d.stop()


def test_a_taken_port_is_an_error_before_anything_loads(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        config = str(fake_manifest_file(tmp_path))
        r = CliRunner().invoke(cli, ["serve", "--config", config, "--port", port])
    assert r.exit_code == 2
    assert f"Error: 127.0.0.1:{port} is already in use — stop what listens there" in r.stderr


def test_non_loopback_bind_without_a_key_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HOMESPEC_API_KEY", raising=False)
    config = str(fake_manifest_file(tmp_path))
    r = CliRunner().invoke(cli, ["serve", "--host", "0.0.0.0", "--config", config])
    assert r.exit_code == 2
    assert "refusing to listen on 0.0.0.0 without an API key" in r.stderr


def test_any_origin_without_a_key_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HOMESPEC_API_KEY", raising=False)
    config = str(fake_manifest_file(tmp_path, 'cors_origins = ["*"]'))
    r = CliRunner().invoke(cli, ["serve", "--config", config])
    assert r.exit_code == 2
    assert 'cors_origins has "*" on a daemon without an API key' in r.stderr


def test_health_shows_the_target_serving_before_the_draft_attaches(tmp_path: Path) -> None:
    d = fake_daemon(tmp_path, wait=False)
    seen: list[tuple[str, str, str]] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                h = d.get("/health").json()
            except httpx.HTTPError:
                time.sleep(0.05)
                continue
            p = h["pairs"]["smollm2"]
            seen.append((h["status"], p["mode"], p["reason"]))
            if p["mode"] == "speculative":
                break
            time.sleep(0.05)
    finally:
        d.stop()
    assert seen[-1][:2] == ("ready", "speculative"), seen
    # Before that: serving without the draft (n-gram drafting), and saying why.
    assert ("ready", "ngram", "draft model still loading") in seen, seen
    assert seen.index(("ready", "ngram", "draft model still loading")) < len(seen) - 1


def test_unknown_model_is_a_404_listing_pairs_when_the_manifest_says_so(tmp_path: Path) -> None:
    from homespec.daemon.service import Daemon as Service
    from homespec.daemon.service import DaemonConfig
    from homespec.errors import UnknownModel
    from homespec.manifest import load_manifest

    path = fake_manifest_file(tmp_path, 'unknown_model = "error"')
    service = Service(DaemonConfig(load_manifest(path), tmp_path, ["smollm2"]))
    assert service.resolve("smollm2")[0].name == "smollm2"
    assert service.resolve(None) == (service.workers["smollm2"], [])
    with pytest.raises(UnknownModel, match=r"no pair named 'gpt-4o'.*use one of: smollm2"):
        service.resolve("gpt-4o")
    with pytest.raises(UnknownModel, match="pair 'smollm2-ngram' is not loaded"):
        service.resolve("smollm2-ngram")


def test_what_the_governor_learned_survives_a_daemon_restart(tmp_path: Path) -> None:
    """Acceptance per task is saved in the state dir once the engine is idle (whole file,
    renamed into place; not on the way of the next request) and at a stop, and restored when
    the pair's engine starts again."""
    body = {
        "messages": [{"role": "user", "content": "forever the governor learns."}],
        "max_tokens": 60,
        "task": "code",
    }
    d = fake_daemon(tmp_path, env={"HOMESPEC_FAKE_DECODE_S": "0"})
    try:
        assert d.post(CHAT, body).status_code == 200
        deadline = time.monotonic() + 10  # written half a second after the engine went idle
        while not list(d.state_dir.glob("governor-smollm2-*.json")):
            assert time.monotonic() < deadline, "not written while the daemon runs"
            time.sleep(0.05)
        body["task"] = "prose"
        assert d.post(CHAT, body).status_code == 200
    finally:
        d.stop()  # the second request's learning is written at the stop, if not before
    files = list(d.state_dir.glob("governor-smollm2-*.json"))
    assert len(files) == 1, list(d.state_dir.iterdir())
    state = json.loads(files[0].read_text())
    assert {"code", "prose"} <= set(state["tasks"]) and not list(d.state_dir.glob(".*.tmp"))
    assert state["lengths"]["code"] == [[60, 60, True]]  # how long its answers ran, kept too
    again = fake_daemon(tmp_path, env={"HOMESPEC_FAKE_DECODE_S": "0"})
    try:
        assert "governor: acceptance for 2 task(s) restored from" in again.log()
    finally:
        again.stop()


def test_the_daemons_connections_send_without_waiting_for_acks() -> None:
    """Nagle's algorithm is off on every connection the daemon accepts (asyncio sets it only
    where the listening socket says TCP): otherwise a non-streamed response's body waits for
    the client's delayed ACK of its headers, 40 ms on each keep-alive request after the first."""
    listener = bind("127.0.0.1", 0)
    listener.listen()
    seen: list[int] = []

    async def accept() -> None:
        async def handle(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conn = writer.get_extra_info("socket")
            seen.append(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(handle, sock=listener)
        port = listener.getsockname()[1]
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            while not seen:
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(asyncio.wait_for(accept(), 10))
    assert seen == [1]
