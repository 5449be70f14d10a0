"""A crash inside llama.cpp takes down one engine process, never the daemon: killed engines
(SIGSEGV, SIGKILL) mid-stream and mid-request, a fault in the draft's code, crash loops, and
the daemon's own death. The engines run the scripted fake target (tests/fake_engine.py, the
same engine program and crash-site marker), except for one real llama.cpp segfault."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from homespec.manifest import Manifest

from .daemon_process import Daemon, demo_manifest_file, fake_daemon, start_daemon, wait_until

CHAT = "/v1/chat/completions"
LONG = [{"role": "user", "content": "forever The lighthouse keeper watched the sea. "}]
SLOW = {"HOMESPEC_FAKE_DECODE_S": "0.01"}  # 400 tokens take seconds: time to kill mid-way


def engine_pid(d: Daemon, pair: str = "smollm2") -> int:
    status = d.get("/homespec/status").json()
    pid: int = next(p for p in status["pairs"] if p["name"] == pair)["engine"]["pid"]
    assert pid and pid != d.proc.pid
    return pid


def kill_engine(d: Daemon, pid: int, sig: int) -> None:
    """Signal the engine read from status, once. If it is already gone, say what the daemon
    said then, instead of a bare ProcessLookupError. (The one time this fired in CI, the
    stream below had signalled twice: a blank line between SSE events kept the count at the
    kill point, and the second kill found the first one's engine already reaped.)"""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        status = d.get("/homespec/status").json()["pairs"]
        pytest.fail(f"engine {pid} was gone before the kill; status {status}\n{d.log()[-4000:]}")


def log_lines(d: Daemon, rid: str) -> list[dict[str, Any]]:
    path = d.state_dir / "requests.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [r for r in map(json.loads, lines) if r["id"] == rid]


def serving_again(pair: str, old_pid: int, d: Daemon) -> Any:
    def ok(h: dict[str, Any]) -> bool:
        p = h["pairs"][pair]
        return p["state"] == "ready" and p["mode"] != "loading" and engine_pid(d, pair) != old_pid

    return ok


@pytest.fixture()
def daemon(tmp_path: Path) -> Any:
    d = fake_daemon(tmp_path, env=SLOW)
    yield d
    d.stop()


def stream_until_killed(d: Daemon, pid: int, sig: int) -> tuple[str, dict[str, Any]]:
    """A long streamed request whose engine is killed after a few chunks: the client must
    get an end (an error event, then [DONE]), not a hang. Returns (request id, error)."""
    body = {"messages": LONG, "max_tokens": 400, "stream": True}
    lines: list[str] = []
    with httpx.stream("POST", d.url + CHAT, json=body, timeout=60) as r:
        rid = r.headers["x-request-id"]
        for line in r.iter_lines():
            if not line:
                continue  # the blank line between events: counting it again would kill twice
            lines.append(line)
            if len(lines) == 4:
                kill_engine(d, pid, sig)
    assert lines[-1] == "data: [DONE]"
    error: dict[str, Any] = json.loads(lines[-2].removeprefix("data: "))["error"]
    return rid, error


def request_until_killed(d: Daemon, pid: int, sig: int) -> tuple[str, dict[str, Any]]:
    """A long non-streamed request whose engine is killed while it runs: a 503 envelope."""
    body = {"messages": LONG, "max_tokens": 400, "speculative": False}
    result: list[httpx.Response] = []
    t = threading.Thread(target=lambda: result.append(d.post(CHAT, body)))
    t.start()
    deadline = time.monotonic() + 30
    while d.get("/homespec/status").json()["pairs"][0]["queue_depth"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.5)  # well inside a 400-token answer
    kill_engine(d, pid, sig)
    t.join(timeout=60)
    (r,) = result
    assert r.status_code == 503 and r.headers["retry-after"]
    error: dict[str, Any] = r.json()["error"]
    return r.headers["x-request-id"], error


@pytest.mark.parametrize(
    ("sig", "words", "kill"),
    [
        (signal.SIGSEGV, "engine crashed (SIGSEGV)", stream_until_killed),
        (signal.SIGKILL, "engine killed (SIGKILL", stream_until_killed),
        (signal.SIGSEGV, "engine crashed (SIGSEGV)", request_until_killed),
        (signal.SIGKILL, "engine killed (SIGKILL", request_until_killed),
    ],
    ids=["segv-mid-stream", "kill-mid-stream", "segv-mid-request", "kill-mid-request"],
)
def test_a_killed_engine_ends_its_request_cleanly_and_the_pair_serves_again(
    daemon: Daemon, sig: int, words: str, kill: Any
) -> None:
    pid = engine_pid(daemon)
    rid, error = kill(daemon, pid, sig)
    assert error["type"] == "engine_crashed" and words in error["message"], error
    assert daemon.proc.poll() is None  # the daemon is up
    (rec,) = log_lines(daemon, rid)  # exactly one line for the request
    assert (rec["outcome"], rec["signal"]) == ("engine_crashed", signal.Signals(sig).name)
    h = wait_until(daemon, serving_again("smollm2", pid, daemon))
    assert h["status"] == "degraded"
    (reason,) = h["reasons"]
    assert reason.startswith(f"smollm2: {words}")
    ok = daemon.post(CHAT, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8})
    assert ok.status_code == 200
    assert words in ok.json()["homespec"]["reason"]
    status = daemon.get("/homespec/status").json()["pairs"][0]
    assert [d["signal"] for d in status["engine"]["deaths"]] == [signal.Signals(sig).name]
    assert status["engine"]["pid"] != pid and status["engine"]["memory"]["ram"] > 0


def test_repeated_crashes_fail_the_pair_and_the_other_pairs_keep_serving(tmp_path: Path) -> None:
    d = fake_daemon(
        tmp_path, "--pair", "smollm2", "--pair", "smollm2-ngram", server="engine_crash_limit = 2"
    )
    try:
        first = engine_pid(d)
        os.kill(first, signal.SIGSEGV)
        wait_until(d, serving_again("smollm2", first, d))
        os.kill(engine_pid(d), signal.SIGSEGV)
        h = wait_until(d, lambda h: h["pairs"]["smollm2"]["state"] == "failed")
        assert h["status"] == "degraded"
        assert "2 engine deaths within 600 s: pair stopped" in h["pairs"]["smollm2"]["reason"]
        refused = d.post(CHAT, {"model": "smollm2", "messages": [{"role": "user", "content": "x"}]})
        assert refused.status_code == 503
        assert refused.json()["error"]["type"] == "pair_unavailable"
        other = d.post(
            CHAT,
            {
                "model": "smollm2-ngram",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "Hi"}],
            },
        )
        assert other.status_code == 200
        metrics = d.get("/metrics").text
        assert 'homespec_engine_deaths{pair="smollm2"} 2.0' in metrics
        assert 'homespec_engine_deaths{pair="smollm2-ngram"} 0.0' in metrics
        assert 'homespec_pair_mode{mode="failed",pair="smollm2"} 1.0' in metrics
    finally:
        d.stop()


def restarted_without_the_draft(d: Daemon) -> None:
    """The draft's first decode crashed the engine: the pair restarts without the draft, says
    why everywhere, and serves with n-gram drafting."""
    try:
        want = "engine crashed (SIGSEGV) while drafting with d; restarted without the draft"
        h = wait_until(
            d,
            lambda h: (
                (h["pairs"]["smollm2"]["reason"], h["pairs"]["smollm2"]["state"]) == (want, "ready")
            ),
        )
        assert h["status"] == "degraded" and h["pairs"]["smollm2"]["mode"] == "ngram"
        r = d.post(CHAT, {"messages": LONG, "max_tokens": 40})
        assert r.status_code == 200
        stats = r.json()["homespec"]
        assert stats["drafter"] == "auto" and want in stats["reason"]
        assert "draft model" not in stats["reason"].split("steps:")[-1]  # never drafted with it
        assert "Fatal Python error: Segmentation fault" in d.log()  # the engine's stack
        status = d.get("/homespec/status").json()["pairs"][0]
        assert status["models"]["draft_loaded"] is False
        assert [x["site"] for x in status["engine"]["deaths"]] == ["drafting with the draft model"]
    finally:
        d.stop()


def test_a_fault_in_the_drafts_code_restarts_the_pair_without_the_draft(tmp_path: Path) -> None:
    restarted_without_the_draft(
        fake_daemon(tmp_path, env={"HOMESPEC_FAKE_DRAFT_FAULT": "1"}, wait=False)
    )


@pytest.mark.models
def test_a_segfault_in_the_drafts_code_restarts_the_pair_without_the_draft(
    demo_manifest: Manifest, repack_crash_shim: Path, tmp_path: Path
) -> None:
    """A real native crash, not a kill: the draft is forced to load with repacked weights
    (no canary) under the shim, so its first decode segfaults inside llama.cpp."""
    config = demo_manifest_file(demo_manifest, tmp_path)
    text = config.read_text()
    text = text.replace('[models.d]\npath = "', '[models.d]\nrepack = true\npath = "')
    text = text.replace('[models.t]\npath = "', '[models.t]\nrepack = false\npath = "')
    config.write_text(text)
    env = {"LD_PRELOAD": str(repack_crash_shim)}
    restarted_without_the_draft(start_daemon(config, tmp_path, env=env, wait=False))
