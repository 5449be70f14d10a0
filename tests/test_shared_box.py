"""A daemon that shares its box (issue 16): untrusted text, an unusable state dir, /health for
callers without the key, wrong-key throttling. The daemon runs the scripted fake engine."""

from __future__ import annotations

import json
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from homespec.cli import cli
from homespec.daemon.middleware import Throttle
from homespec.daemon.service import without_paths
from tests.conftest import write_tiny_gguf
from tests.daemon_process import (
    FAKE_ENGINE,
    Daemon,
    all_attached,
    fake_daemon,
    fake_manifest_file,
    start_daemon,
    wait_until,
)

CHAT = "/v1/chat/completions"
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = fake_daemon(tmp_path_factory.mktemp("box"), env={"HOMESPEC_FAKE_DECODE_S": "0.002"})
    yield d
    d.stop()


def log_lines(d: Daemon) -> list[dict[str, object]]:
    path = d.state_dir / "requests.jsonl"
    return [json.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


@pytest.mark.parametrize(
    ("body", "field", "what"),
    [
        (
            rb'{"messages": [{"role": "user", "content": "a\u0000bc"}]}',
            "messages[0].content",
            "NUL",
        ),
        (
            rb'{"model": "\ud800", "messages": [{"role": "user", "content": "hi"}]}',
            "model",
            "lone UTF-16 surrogate",
        ),
        (
            rb'{"messages": [{"role": "user", "content": "hi"}], "stop": ["ok", "x\u0000"]}',
            "stop[1]",
            "NUL",
        ),
        (
            rb'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\udc00"}]}]}',
            "messages[0].content[0].text",
            "lone UTF-16 surrogate",
        ),
        (rb'{"messages": [{"role": "user", "content": "hi"}], "user": "\u0000"}', "user", "NUL"),
    ],
    ids=["nul-content", "surrogate-model", "nul-stop", "surrogate-part", "nul-ignored-field"],
)
def test_nul_and_lone_surrogates_are_400s_that_name_the_field(
    daemon: Daemon, body: bytes, field: str, what: str
) -> None:
    r = httpx.post(daemon.url + CHAT, content=body, headers=JSON)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert f"{field} holds a" in message and what in message, message


def test_a_raw_prompt_with_a_nul_is_refused_too(daemon: Daemon) -> None:
    body = rb'{"prompt": "abc\u0000def", "max_tokens": 4}'
    r = httpx.post(daemon.url + "/v1/completions", content=body, headers=JSON)
    assert r.status_code == 400 and "prompt holds a NUL" in r.json()["error"]["message"]


def test_every_answered_request_leaves_exactly_one_log_line(daemon: Daemon) -> None:
    odd = [
        rb'{"model": "gpt-4\u2028\ud83d\ude00", "messages": [{"role": "user", "content": "hi"}]}',
        rb'{"model": "smollm2", "task": "t\"\\\n", "messages": [{"role": "user", "content": "x"}]}',
        '{"model": "smollm2", "messages": [{"role": "user", "content": "é ü 😀"}]}'.encode(),
    ]
    before = len(log_lines(daemon))
    for n, body in enumerate(odd, 1):
        r = httpx.post(daemon.url + CHAT, content=body + b"", headers=JSON, timeout=30)
        assert r.status_code == 200, r.text
        lines = log_lines(daemon)
        assert len(lines) == before + n
        assert lines[-1]["id"] == r.headers["X-Request-Id"] and lines[-1]["outcome"] == "ok"
    assert log_lines(daemon)[-3]["model"] == "gpt-4\u2028😀"


def test_a_state_dir_that_cannot_be_used_is_exit_2(tmp_path: Path) -> None:
    config = str(fake_manifest_file(tmp_path))
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    r = CliRunner().invoke(cli, ["serve", "--config", config, "--state-dir", str(a_file / "s")])
    assert r.exit_code == 2, r.output
    assert f"Error: cannot create directory {a_file / 's'}" in r.stderr
    assert "writable directory" in r.stderr
    state = tmp_path / "state"
    (state / "requests.jsonl").mkdir(parents=True)  # the log itself cannot be opened
    r = CliRunner().invoke(cli, ["serve", "--config", config, "--state-dir", str(state)])
    assert r.exit_code == 2, r.output
    assert f"Error: cannot write the request log {state / 'requests.jsonl'}" in r.stderr
    assert "--state-dir" in r.stderr


def test_a_log_that_fails_at_run_time_degrades_health_and_counts_lost_lines(
    tmp_path: Path,
) -> None:
    d = fake_daemon(tmp_path, env={"HOMESPEC_FAKE_DECODE_S": "0.002"})
    try:
        ask = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        assert d.post(CHAT, ask).status_code == 200
        log = d.state_dir / "requests.jsonl"
        log.unlink()
        log.mkdir()  # from now on every append fails
        for _ in range(2):
            assert d.post(CHAT, ask).status_code == 200  # the answer is not lost
        health = d.get("/health").json()
        assert health["status"] == "degraded"
        assert any("cannot write" in r and "2 line(s) lost" in r for r in health["reasons"])
        metrics = d.get("/metrics").text
        assert "homespec_request_log_lost_lines_total 2.0" in metrics
        shutil.rmtree(log)
        assert d.post(CHAT, ask).status_code == 200
        assert d.get("/health").json()["status"] == "ready"  # writing works again
        assert len(log.read_text().splitlines()) == 1
    finally:
        d.stop()


def test_health_without_the_key_names_no_paths(tmp_path: Path) -> None:
    # The real engine, on a manifest whose model files do not exist: the pair fails, and its
    # reason names the missing file.
    config = fake_manifest_file(tmp_path)
    d = start_daemon(config, tmp_path, env={"HOMESPEC_API_KEY": "s3cret"}, wait=False)
    try:
        wait_until(d, lambda h: h["status"] == "failed")
        full = d.get("/health", headers={"Authorization": "Bearer s3cret"})
        assert str(tmp_path / "fake-target.gguf") in full.text  # the owner sees where
        public = d.get("/health")
        assert public.status_code == full.status_code == 503
        assert public.json()["status"] == "failed"
        assert str(tmp_path) not in public.text
        assert "fake-target.gguf" in public.text  # which file, not where it lives
    finally:
        d.stop()


def test_paths_are_cut_to_their_names() -> None:
    assert without_paths("/srv/models/x.gguf not found") == "x.gguf not found"
    assert without_paths("see ~/m/y.gguf, C:\\m\\z.gguf") == "see y.gguf, z.gguf"
    assert without_paths("1/2 of http://h/x") == "1/2 of http://h/x"


def test_repeated_wrong_keys_are_slowed_but_the_right_key_is_not(tmp_path: Path) -> None:
    d = fake_daemon(tmp_path, env={"HOMESPEC_API_KEY": "s3cret"})
    try:
        wrong = {"Authorization": "Bearer guess"}
        codes = [d.get("/v1/models", headers=wrong).status_code for _ in range(15)]
        assert codes[: Throttle.MAX_FAILS] == [401] * Throttle.MAX_FAILS
        assert set(codes[Throttle.MAX_FAILS :]) == {429}
        r = d.get("/v1/models", headers=wrong)
        assert r.status_code == 429 and 1 <= int(r.headers["Retry-After"]) <= 60
        assert r.json()["error"]["type"] == "rate_limit_error"
        right = d.get("/v1/models", headers={"Authorization": "Bearer s3cret"})
        assert right.status_code == 200  # from the same address, at once
        assert d.get("/health").status_code == 200  # no key at all is not a wrong key
    finally:
        d.stop()


def test_the_throttle_forgets_old_failures() -> None:
    t = Throttle()
    for i in range(Throttle.MAX_FAILS):
        t.failed("a", float(i))
    assert t.retry_after("a", 10.0) == 50  # the oldest (t=0) ages out at 60
    assert t.retry_after("b", 10.0) == 0  # another address is not affected
    assert t.retry_after("a", 60.5) == 0


def test_fewer_threads_show_in_the_reason_status_and_metrics(tmp_path: Path) -> None:
    env = {"HOMESPEC_FAKE_OTHERS": "1.0", "HOMESPEC_FAKE_DECODE_S": "0.005"}
    d = fake_daemon(tmp_path, env=env)
    try:
        body = {"messages": [{"role": "user", "content": "forever busy box "}], "max_tokens": 60}
        stats = d.post(CHAT, body).json()["homespec"]
        assert stats["threads"] == 1
        assert "threads 1 of 2 (other processes use 1.0 of 2 cores)" in stats["reason"]
        engine = d.get("/homespec/status").json()["pairs"][0]["engine"]
        assert engine["threads"] == 1 and "1.0 of 2 cores" in engine["threads_reason"]
        assert 'homespec_engine_threads{pair="smollm2"} 1.0' in d.get("/metrics").text
        status = CliRunner().invoke(cli, ["status", "--url", d.url])
        assert "threads: 1 (other processes use 1.0 of 2 cores)" in status.output
    finally:
        d.stop()


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    env = {"HOMESPEC_API_KEY": "s3cret", "HOMESPEC_FAKE_DECODE_S": "0.01"}
    d = fake_daemon(tmp_path_factory.mktemp("keyed"), env=env)
    yield d
    d.stop()


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "non-streaming"])
@pytest.mark.parametrize("with_key", [True, False], ids=["key", "no-key"])
def test_a_client_that_leaves_stops_its_generation(
    daemon: Daemon, keyed: Daemon, stream: bool, with_key: bool
) -> None:
    d = keyed if with_key else daemon
    headers = {"Authorization": "Bearer s3cret"} if with_key else {}
    body = {
        "messages": [{"role": "user", "content": "forever a client that gives up. "}],
        "max_tokens": 2000,
        "speculative": False,
        "stream": stream,
    }
    before = len(log_lines(d))
    if stream:
        with httpx.stream("POST", d.url + CHAT, json=body, headers=headers, timeout=30) as r:
            for n, _ in enumerate(r.iter_lines()):
                if n >= 10:
                    break  # leave mid-stream
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(d.url + CHAT, json=body, headers=headers, timeout=httpx.Timeout(5, read=0.5))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(log_lines(d)) == before:
        time.sleep(0.05)
    record = log_lines(d)[-1]
    assert record["outcome"] == "cancelled", record
    made = record["completion_tokens"]
    assert isinstance(made, int) and 0 < made < 2000, record
    assert f"after {made} tokens" in str(record["error"])
    # The slot is free at once: the retry is served, not queued behind the abandoned answer.
    status = d.get("/homespec/status", headers=headers).json()
    assert all(p["queue_depth"] == 0 for p in status["pairs"])
    retry = {**body, "max_tokens": 8, "stream": False}
    assert httpx.post(d.url + CHAT, json=retry, headers=headers, timeout=10).status_code == 200


# --- reload: a config edited under a running daemon ------------------------------------------


def test_reload_keeps_what_did_not_change_restarts_what_did_and_refuses_a_bad_config(
    tmp_path: Path,
) -> None:
    target, draft = write_tiny_gguf(tmp_path / "t.gguf"), write_tiny_gguf(tmp_path / "d.gguf")
    cfg = tmp_path / "models.toml"

    def write(
        pairs: str = '["smollm2", "smollm2-ngram"]', extra: str = "", ctx: str = "1024"
    ) -> None:
        cfg.write_text(
            f'default_pair = "smollm2"\n[server]\npairs = {pairs}\n'
            f'[models.t]\npath = "{target}"\n[models.d]\npath = "{draft}"\n'
            f'[pairs.smollm2]\ntarget = "t"\ndraft = "d"\nn_ctx = {ctx}\n{extra}'
            '[pairs.smollm2-ngram]\ntarget = "t"\ndraft = "ngram"\nn_ctx = 1024\n'
        )

    def pids() -> dict[str, int]:
        return {p["name"]: p["engine"]["pid"] for p in d.get("/homespec/status").json()["pairs"]}

    write()
    d = start_daemon(cfg, tmp_path, env={**FAKE_ENGINE, "HOMESPEC_FAKE_DECODE_S": "0"})
    try:
        before = pids()
        # A typo: refused as a whole, with the error `ask` would print; nothing restarts.
        write(ctx='"big"')
        result = CliRunner().invoke(cli, ["reload", "--url", d.url])
        assert result.exit_code == 2 and "pairs.smollm2.n_ctx" in result.stderr, result.output
        assert "Traceback" not in result.output
        # One hint, the config error's own, then what to do after it
        assert result.stderr.count(" — ") == 1, result.stderr
        assert "then run `homespec reload` again" in result.stderr
        # A missing model file: refused too.
        write()
        cfg.write_text(cfg.read_text().replace(str(draft), str(tmp_path / "gone.gguf")))
        r = d.post("/homespec/reload")
        assert r.status_code == 400 and "gone.gguf" in r.json()["error"]["message"]
        assert pids() == before and d.get("/health").json()["status"] == "ready"
        # SIGHUP with one pair changed: it restarts, the other keeps its engine.
        write(extra="draft_tokens = 4\n")
        d.proc.send_signal(signal.SIGHUP)
        wait_until(d, lambda h: all_attached(h) and pids()["smollm2"] != before["smollm2"])
        assert pids()["smollm2-ngram"] == before["smollm2-ngram"]
        assert "restarting smollm2" in d.log() and "kept smollm2-ngram" in d.log()
        served = d.post(CHAT, {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]})
        assert served.status_code == 200
        # A pair taken out of [server] pairs drains and stops.
        write(pairs='["smollm2"]', extra="draft_tokens = 4\n")
        result = CliRunner().invoke(cli, ["reload", "--url", d.url, "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["stopped"] == ["smollm2-ngram"]
        assert list(d.get("/health").json()["pairs"]) == ["smollm2"]
    finally:
        d.stop()
