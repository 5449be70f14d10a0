"""The daemon as a real process on loopback, its engines running the scripted fake target
(tests/fake_engine.py: homespec's own engine program and protocol, no model files): the OpenAI
SDK, raw HTTP errors, the request log under kill -9, SIGTERM draining, metrics, status/report.
test_daemon_queue.py has the queue and clients that leave; test_daemon_models.py what needs the
real demo pair."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from homespec.cli import cli
from homespec.daemon.serve import bind

from .daemon_process import CHAT, LONG, Daemon, fake_daemon, fake_manifest_file, read_log, user

STATS_KEYS = {
    "proposed_tokens",
    "accepted_tokens",
    "accept_rate",
    "ttft_ms",
    "e2e_ms",
    "tokens_per_s",
    "mode",
    "reason",
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("daemon")
    d = fake_daemon(
        tmp,
        "--pair",
        "smollm2",
        "--pair",
        "smollm2-ngram",
        server="max_queue = 2\nmax_tokens_limit = 512",
        env={"HOMESPEC_FAKE_DECODE_S": "0.005"},
    )
    yield d
    d.stop()


def test_openai_sdk_non_streaming_carries_usage_and_stats(sdk: OpenAI) -> None:
    r = sdk.chat.completions.create(
        model="smollm2", messages=user("Write a Dockerfile for a Flask app."), max_tokens=48
    )  # type: ignore[call-overload]
    assert r.choices[0].message.content
    assert r.model == "smollm2"
    assert r.usage is not None and 0 < r.usage.completion_tokens <= 48
    stats = r.model_dump()["homespec"]
    assert set(stats) >= STATS_KEYS
    assert stats["mode"] == "speculative" and stats["proposed_tokens"] > 0


def test_openai_sdk_streaming_puts_stats_in_the_last_chunk(sdk: OpenAI) -> None:
    chunks = list(
        sdk.chat.completions.create(
            model="smollm2", messages=user("List three colors."), max_tokens=40, stream=True
        )  # type: ignore[call-overload]
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    last = chunks[-1].model_dump()
    assert last["choices"][0]["finish_reason"] in ("stop", "length")
    assert set(last["homespec"]) >= STATS_KEYS
    assert last["usage"]["completion_tokens"] == last["homespec"]["completion_tokens"]


def test_include_usage_streams_the_usage_in_a_chunk_of_its_own(sdk: OpenAI) -> None:
    """As OpenAI streams it: the finish chunk, then a chunk with no choices and the usage (the
    shape OpenAI's examples read usage from), null usage before it; without stream_options the
    finish chunk carries the usage (the test above)."""
    chunks = list(
        sdk.chat.completions.create(
            model="smollm2",
            messages=user("List three colors."),
            max_tokens=40,
            stream=True,
            stream_options={"include_usage": True},
        )  # type: ignore[call-overload]
    )
    *answer, finish, tail = [c.model_dump() for c in chunks]
    assert tail["choices"] == [] and tail["usage"]["completion_tokens"] > 0
    assert finish["choices"][0]["finish_reason"] in ("stop", "length")
    assert finish["usage"] is None and set(finish["homespec"]) >= STATS_KEYS
    assert tail["usage"]["completion_tokens"] == finish["homespec"]["completion_tokens"]
    assert all(c["usage"] is None and c["choices"] for c in answer)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text


def test_a_sampled_answer_reports_its_seed_and_the_seed_repeats_it(sdk: OpenAI) -> None:
    """Through the daemon, streamed or not: the seed a sampled answer drew with is in
    `homespec.seed`, and sending it back gives the same text (test_verify.py has the same on
    every drafter)."""
    ask = {"model": "smollm2", "messages": user("forever a b c d e f g h"), "max_tokens": 60}
    first = sdk.chat.completions.create(**ask, temperature=1.6)  # type: ignore[call-overload]
    seed = first.model_dump()["homespec"]["seed"]
    assert isinstance(seed, int)
    again = sdk.chat.completions.create(
        **ask, temperature=1.6, seed=seed, stream=True, extra_body={"speculative": False}
    )  # type: ignore[call-overload]
    chunks = list(again)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == first.choices[0].message.content
    assert chunks[-1].model_dump()["homespec"]["seed"] == seed
    greedy = sdk.chat.completions.create(**ask, temperature=0)  # type: ignore[call-overload]
    assert greedy.model_dump()["homespec"]["seed"] is None
    assert greedy.choices[0].message.content != text  # 1.6 strays from the fake's script


def test_speculation_off_per_request_via_extra_body(sdk: OpenAI) -> None:
    r = sdk.chat.completions.create(
        model="smollm2",
        messages=user("Say hello."),
        max_tokens=40,
        extra_body={"speculative": False},
    )  # type: ignore[call-overload]
    stats = r.model_dump()["homespec"]
    assert (stats["mode"], stats["reason"], stats["proposed_tokens"]) == (
        "plain",
        "request: speculation off",
        0,
    )


def test_placeholder_model_is_served_by_the_default_pair_and_says_so(daemon: Daemon) -> None:
    r = daemon.post(CHAT, {"model": "gpt-3.5-turbo", "messages": user("Hi"), "max_tokens": 8})
    assert r.status_code == 200
    body = r.json()
    assert body["model"] == "smollm2"
    assert (
        "model 'gpt-3.5-turbo' is not a pair here: served by the default pair"
        in (body["homespec"]["reason"])
    )
    assert r.headers["x-request-id"] == body["id"]


def test_text_completions_and_models(daemon: Daemon) -> None:
    r = daemon.post(
        "/v1/completions", {"model": "smollm2-ngram", "prompt": "1, 2, 3,", "max_tokens": 8}
    )
    assert r.status_code == 200 and r.json()["choices"][0]["text"]
    ids = [m["id"] for m in daemon.get("/v1/models").json()["data"]]
    assert ids == ["smollm2", "smollm2-ngram"]
    one = daemon.get("/v1/models/smollm2-ngram")  # the OpenAI SDK's models.retrieve
    assert one.status_code == 200 and one.json()["id"] == "smollm2-ngram"
    assert one.json()["object"] == "model"
    missing = daemon.get("/v1/models/gpt-4o")
    assert missing.status_code == 404
    err = missing.json()["error"]
    assert "gpt-4o" in err["message"] and "smollm2, smollm2-ngram" in err["message"]
    assert err["type"] == "not_found_error" and err["param"] == "model"


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b'{"messages": "hello"}', 400, "messages: Input should be a valid list"),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}',
            400,
            "max_tokens",
        ),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}',
            400,
            "max_tokens 100000 is over this daemon's limit of 512",
        ),
        (  # llama.cpp's name for it: the same cap
            b'{"messages": [{"role": "user", "content": "x"}], "n_predict": 100000}',
            400,
            "max_tokens 100000 is over this daemon's limit of 512",
        ),
        (b'{"messages": [{"role": "user", "content": "x"}], "n": 3}', 400, "n:"),
        (b'{"messages": [{"role": "wizard", "content": "x"}]}', 400, "messages.0.role"),
        (b'{"model": "smollm2", "messages": []}', 400, "messages"),
        (
            b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
            400,
            "invalid request: messages.0: content[0] has type 'image_url': only text parts",
        ),
        (b"", 400, "the body is empty: send the request as a JSON object"),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": true}',
            400,
            "max_tokens=true is not a number",
        ),
    ],
    ids=[
        "malformed",
        "wrong-type",
        "bad-max-tokens",
        "over-limit",
        "n-predict-over-limit",
        "n",
        "role",
        "empty",
        "image",
        "no-body",
        "boolean",
    ],
)
def test_client_mistakes_get_400_envelopes(
    daemon: Daemon, body: bytes, status: int, needle: str
) -> None:
    r = httpx.post(daemon.url + CHAT, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and needle in err["message"], err


def test_unknown_route_and_oversized_body(daemon: Daemon) -> None:
    r = daemon.get("/v1/nope")
    assert r.status_code == 404 and "error" in r.json()
    big = {"messages": user("x" * 2_000_000)}
    r = daemon.post(CHAT, big)
    assert r.status_code == 413 and "request body over" in r.json()["error"]["message"]


def test_every_request_is_one_log_line_with_its_stats(daemon: Daemon) -> None:
    r = daemon.post(CHAT, {"messages": user("Name a fruit."), "max_tokens": 12, "task": "qa"})
    rid = r.headers["x-request-id"]
    rec = next(x for x in read_log(daemon) if x["id"] == rid)
    assert rec["pair"] == "smollm2" and rec["task"] == "qa" and rec["outcome"] == "ok"
    assert STATS_KEYS - {"mode", "reason"} <= set(rec) and rec["reason"]


def test_metrics_parse_with_prometheus_client(daemon: Daemon) -> None:
    daemon.post(CHAT, {"messages": user("Hi"), "max_tokens": 40, "speculative": True})
    families = {f.name: f for f in text_string_to_metric_families(daemon.get("/metrics").text)}
    for name in (
        "homespec_requests",
        "homespec_tokens",
        "homespec_draft_proposed_tokens",
        "homespec_draft_accepted_tokens",
        "homespec_draft_accepted_at_position",
        "homespec_ttft_seconds",
        "homespec_e2e_seconds",
        "homespec_queue_seconds",
        "homespec_pair_mode",
        "homespec_queue_depth",
    ):
        assert name in families, name
    modes = {
        s.labels["mode"]: s.value
        for s in families["homespec_pair_mode"].samples
        if s.labels["pair"] == "smollm2"
    }
    assert modes["speculative"] == 1 and modes["plain"] == 0


def test_status_and_report_cli_against_the_live_daemon(daemon: Daemon) -> None:
    runner = CliRunner()
    assert daemon.post(CHAT, {"messages": user("hi"), "n": 3}).status_code == 400
    for _ in range(3):  # this test's own requests (the fixture's daemon serves the module's)
        body = {"messages": user("hi"), "max_tokens": 4, "task": "qa"}
        assert daemon.post(CHAT, body).status_code == 200
    r = runner.invoke(cli, ["status", "--url", daemon.url])
    assert r.exit_code == 0, r.output
    assert "smollm2" in r.stdout and "speculative" in r.stdout and "MiB" in r.stdout
    # The costs as the last request left them, homespec's own work per step among them
    assert "costs: target decode ms by tokens 1→" in r.stdout
    own = re.search(r"homespec's own work a step beyond its decodes, ms: (.+)", r.stdout)
    assert own and re.fullmatch(r"((plain|n-gram|draft model) \d+\.\d\d(, )?)+", own[1])
    assert "refused before running (not in the request log):" in r.stdout
    assert "× 400 (invalid request)" in r.stdout
    r = runner.invoke(cli, ["status", "--url", daemon.url, "--json"])
    pair = json.loads(r.stdout)["pairs"][0]
    assert pair["mode"] == "speculative" and pair["engine"]["memory"]["ram"] > 0
    r = runner.invoke(cli, ["report", "--state-dir", str(daemon.state_dir), "--json"])
    assert r.exit_code == 0, r.output
    rows = {row["key"]: row for row in json.loads(r.stdout)["rows"]}
    assert rows["smollm2"]["requests"] >= 3 and rows["smollm2"]["ttft_p50"] > 0
    r = runner.invoke(cli, ["report", "--state-dir", str(daemon.state_dir), "--by", "task"])
    assert "qa" in r.stdout


def test_ask_uses_the_daemon_and_says_so(daemon: Daemon) -> None:
    r = CliRunner().invoke(
        cli, ["ask", "Say hi.", "--max-tokens", "8", "--json", "--url", daemon.url]
    )
    assert r.exit_code == 0, r.output
    payload = json.loads(r.stdout)
    assert payload["via"] == daemon.url and payload["text"]


def test_progressive_start_serves_the_target_before_the_draft(daemon: Daemon) -> None:
    log = daemon.log()
    ready = log.index("pair smollm2: target ready after")
    attached = log.index("pair smollm2: draft attached after")
    assert ready < attached
    pair = daemon.get("/homespec/status").json()["pairs"][0]
    assert 0 < pair["ready_after_s"] <= pair["speculative_after_s"]


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


def test_a_keyless_daemon_answers_only_hosts_that_name_it(daemon: Daemon) -> None:
    """A web page that rebinds its own name to 127.0.0.1 sends its own Host: refused."""
    port = daemon.url.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}"):
        assert daemon.get("/homespec/status", headers={"Host": host}).status_code == 200, host
    r = daemon.get("/homespec/status", headers={"Host": f"evil.example:{port}"})
    assert r.status_code == 421
    assert "'evil.example:" in r.json()["error"]["message"]
    assert "allowed_hosts" in r.json()["error"]["message"]


def test_head_health_answers_like_get(daemon: Daemon) -> None:
    r = httpx.head(daemon.url + "/health", timeout=10)
    assert r.status_code == 200 and not r.content


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
