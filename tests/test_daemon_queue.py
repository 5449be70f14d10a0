"""A pair's queue, seen from a client: what is refused before it queues (a prompt over the
context, a burst over `max_queue`), what a request that waited says of its wait, and a client
that leaves. A daemon over the scripted fake target (tests/fake_engine.py), as in test_daemon.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from .daemon_process import CHAT, LONG, Daemon, fake_daemon, read_log, user


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = fake_daemon(
        tmp_path_factory.mktemp("queue"),
        "--pair",
        "smollm2",
        server="max_queue = 2",
        env={"HOMESPEC_FAKE_DECODE_S": "0.005"},
    )
    yield d
    d.stop()


def test_prompt_longer_than_the_context_names_both_sizes(daemon: Daemon) -> None:
    r = daemon.post(CHAT, {"messages": user("word " * 300), "max_tokens": 8})
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "1024-token context" in message and "the prompt is 15" in message  # 1500 bytes + 11


def test_a_prompt_over_the_context_is_a_400_streamed_or_queued_and_never_logged(
    daemon: Daemon,
) -> None:
    too_long = {"messages": user("word " * 300), "max_tokens": 8}
    # On an idle pair the engine counts it as it starts: still a 400, not an event stream.
    r = daemon.post(CHAT, {**too_long, "stream": True})
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    assert "1024-token context" in r.json()["error"]["message"] and r.headers["x-request-id"]

    # Behind a running request it is counted before it queues: answered while that one runs.
    running = threading.Event()
    body = {"messages": user(LONG), "max_tokens": 400, "stream": True, "speculative": False}

    def long_answer() -> None:
        with httpx.stream("POST", daemon.url + CHAT, json=body, timeout=60) as s:
            for line in s.iter_lines():
                if '"content"' in line:
                    running.set()

    t = threading.Thread(target=long_answer)
    t.start()
    assert running.wait(30)
    for stream in (False, True):
        r = daemon.post(CHAT, {**too_long, "stream": stream})
        assert r.status_code == 400 and "1024-token context" in r.json()["error"]["message"]
    assert t.is_alive()  # 400 tokens of 5 ms: the refusals did not wait for it
    t.join()
    refused = [x for x in read_log(daemon) if "token context" in str(x.get("error"))]
    assert refused == [] and read_log(daemon)[-1]["outcome"] == "ok"


def test_burst_over_the_queue_gets_503s_and_the_rest_succeed(daemon: Daemon) -> None:
    results: list[httpx.Response] = []
    # Six at once, each long enough (200 plain steps of 5 ms) that they overlap whatever the
    # machine: 48 speculative tokens ran in a few steps on a fast box, so the six were served
    # one after another and none was refused.
    together = threading.Barrier(6)

    def one() -> None:
        body = {"messages": user(LONG), "max_tokens": 200, "speculative": False}
        together.wait(30)
        results.append(daemon.post(CHAT, body))

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r.status_code for r in results)
    assert 503 in codes and 200 in codes, codes
    assert set(codes) <= {200, 503}
    busy = next(r for r in results if r.status_code == 503)
    assert busy.headers["retry-after"] and busy.json()["error"]["type"] == "server_busy"


def test_a_request_that_waited_counts_its_wait_in_ttft_and_e2e_but_not_in_tok_s(
    daemon: Daemon,
) -> None:
    body = {"messages": user(LONG), "max_tokens": 120, "speculative": False}
    answers: dict[str, httpx.Response] = {}

    def ask(key: str) -> None:
        answers[key] = daemon.post(CHAT, body)

    first = threading.Thread(target=ask, args=("first",))
    first.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pairs = daemon.get("/homespec/status").json()["pairs"]
        if any(p["name"] == "smollm2" and p["queue_depth"] for p in pairs):
            break
        time.sleep(0.01)
    ask("second")  # behind the first: 120 tokens of 5 ms
    first.join()
    a, b = (answers[k].json()["homespec"] for k in ("first", "second"))
    generating = a["e2e_ms"] - a["queue_ms"]
    assert a["queue_ms"] < generating / 4 < b["queue_ms"]
    assert b["ttft_ms"] > b["queue_ms"] and b["e2e_ms"] > b["queue_ms"] + generating / 2
    # tok/s is the pair's speed, the same for both; over e2e the second's would look halved.
    assert b["tokens_per_s"] > 0.7 * a["tokens_per_s"]
    assert 1000 * b["completion_tokens"] / b["e2e_ms"] < 0.8 * b["tokens_per_s"]
    logged = {x["id"]: x for x in read_log(daemon)}[answers["second"].headers["x-request-id"]]
    assert logged["queue_ms"] == b["queue_ms"] and logged["ttft_ms"] == b["ttft_ms"]


def test_client_disconnect_stops_generation(daemon: Daemon) -> None:
    body = {"messages": user(LONG), "max_tokens": 400, "stream": True, "speculative": False}
    with httpx.stream("POST", daemon.url + CHAT, json=body, timeout=60) as r:
        rid = r.headers["x-request-id"]
        for n, _ in enumerate(r.iter_lines()):
            if n >= 6:
                break  # leave mid-stream
    deadline = time.monotonic() + 30
    record = None
    while time.monotonic() < deadline and record is None:
        record = next((x for x in read_log(daemon) if x["id"] == rid), None)
        time.sleep(0.1)
    assert record is not None and record["outcome"] == "cancelled", record
    status = daemon.get("/homespec/status").json()
    assert all(p["queue_depth"] == 0 for p in status["pairs"])


def _refusals(daemon: Daemon) -> tuple[dict[str, int], dict[str, float]]:
    """(status's refusals by HTTP status, /metrics' homespec_refused_requests_total by status
    for chat completions)."""
    shown = daemon.get("/homespec/status").json()["refused"]
    counted: dict[str, float] = {}
    for line in daemon.get("/metrics").text.splitlines():
        if line.startswith("homespec_refused_requests_total{") and "chat.completions" in line:
            code = line.split('status="')[1].split('"')[0]
            counted[code] = float(line.rsplit(" ", 1)[1])
    return shown, counted


def test_refusals_are_counted_by_status_and_left_out_of_the_request_log(daemon: Daemon) -> None:
    shown0, counted0 = _refusals(daemon)
    lines0 = len(read_log(daemon))
    too_long = {"messages": user("word " * 300), "max_tokens": 8}
    assert daemon.post(CHAT, too_long).status_code == 400  # the engine's count, non-streamed
    assert daemon.post(CHAT, {**too_long, "stream": True}).status_code == 400  # streamed
    assert daemon.post(CHAT, {"messages": user("hi"), "top_p": 7}).status_code == 400  # invalid
    results: list[int] = []
    together = threading.Barrier(6)  # overlapping whatever the machine, as in the burst above

    def one() -> None:
        body = {"messages": user(LONG), "max_tokens": 200, "speculative": False}
        together.wait(30)
        results.append(daemon.post(CHAT, body).status_code)

    burst = [threading.Thread(target=one) for _ in range(6)]
    for t in burst:
        t.start()
    for t in burst:
        t.join()
    busy, served = results.count(503), results.count(200)
    assert busy and served + busy == 6, results
    # A client that leaves a non-streamed answer gets (nobody) a 499: it ran, and is logged.
    slow = {"messages": user(LONG), "max_tokens": 400, "speculative": False}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(daemon.url + CHAT, json=slow, timeout=0.5)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(read_log(daemon)) - lines0 < served + 1:
        time.sleep(0.05)
    assert read_log(daemon)[-1]["outcome"] == "cancelled"

    shown, counted = _refusals(daemon)
    assert shown.get("400", 0) - shown0.get("400", 0) == 3
    assert shown.get("503", 0) - shown0.get("503", 0) == busy
    assert counted.get("400", 0) - counted0.get("400", 0) == 3
    assert counted.get("503", 0) - counted0.get("503", 0) == busy
    assert set(shown) <= {"400", "503"}  # the answered ones were not counted
    assert len(read_log(daemon)) - lines0 == served + 1  # the log holds the requests that ran
