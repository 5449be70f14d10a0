"""The daemon as a real process on loopback, its engines running the scripted fake target
(tests/fake_engine.py: homespec's own engine program and protocol, no model files): the OpenAI
SDK, raw HTTP errors, metrics, status/report, against one daemon kept up for the module.
test_daemon_lifecycle.py has kill -9, SIGTERM, keys, binds and restarts; test_daemon_queue.py
the queue and clients that leave; test_daemon_models.py what needs the real demo pair."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from homespec.cli import cli

from .daemon_process import CHAT, Daemon, fake_daemon, read_log, user

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


def test_a_begun_answer_is_continued_and_the_response_says_so(daemon: Daemon) -> None:
    begun = [*user("Name a fruit."), {"role": "assistant", "content": "A"}]
    r = daemon.post(CHAT, {"messages": begun, "max_tokens": 8})
    assert r.status_code == 200
    fmt = r.json()["homespec"]["prompt_format"]
    assert fmt == "chat template; continuing the assistant's last message"
    r = daemon.post(CHAT, {"messages": begun, "max_tokens": 8, "continue_final_message": False})
    assert r.json()["homespec"]["prompt_format"] == "chat template"
    r = daemon.post(CHAT, {"messages": user("Hi"), "continue_final_message": True})
    assert r.status_code == 400
    assert "continue_final_message: the last message is the user's" in r.json()["error"]["message"]


def _preflight(daemon: Daemon, origin: str) -> httpx.Response:
    asks = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
    }
    return httpx.request("OPTIONS", daemon.url + CHAT, headers=asks)


def test_a_page_served_from_this_machine_may_call_the_api_and_no_other_page_may(
    daemon: Daemon,
) -> None:
    """CORS (daemon/cors.py): by default pages from loopback origins, any port."""
    for origin in ("http://localhost:3000", "http://127.0.0.1:5173", "http://[::1]:8000"):
        ok = _preflight(daemon, origin)
        assert ok.status_code == 200, origin
        assert ok.headers["access-control-allow-origin"] == origin
        assert "x-stainless-os" in ok.headers["access-control-allow-headers"].lower()
    for origin in ("https://evil.example", "http://localhost.evil.example"):
        no = _preflight(daemon, origin)
        assert no.status_code == 400 and "access-control-allow-origin" not in no.headers
    r = daemon.post(
        CHAT, {"messages": user("Hi"), "max_tokens": 4}, headers={"Origin": "http://localhost:3000"}
    )
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert "x-request-id" in r.headers["access-control-expose-headers"]


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
        # Python's JSON reads NaN and Infinity, which no client means as a temperature
        (
            b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
            400,
            "temperature: Input should be a finite number",
        ),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "top_p": -Infinity}',
            400,
            "top_p: Input should be a finite number",
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
        "nan",
        "infinity",
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


def test_llama_servers_paths_without_v1_answer_as_the_v1_ones(daemon: Daemon) -> None:
    """A client given the server's address without /v1 (llama-server answers both) gets the
    same API, its refusals counted the same; any other path gets a 404 listing the endpoints."""
    r = daemon.post("/chat/completions", {"messages": user("hi"), "max_tokens": 4})
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    r = daemon.post("/completions", {"prompt": "1, 2, 3,", "max_tokens": 4})
    assert r.status_code == 200 and r.json()["choices"][0]["text"]
    assert daemon.get("/models").json() == daemon.get("/v1/models").json()
    assert daemon.get("/models/smollm2").json()["id"] == "smollm2"
    before = daemon.get("/homespec/status").json()["refused"]
    assert daemon.post("/chat/completions", {"messages": user("hi"), "n": 2}).status_code == 400
    after = daemon.get("/homespec/status").json()["refused"]
    assert after["400"] == before.get("400", 0) + 1
    lost = daemon.post("/api/chat", {"messages": user("hi")})
    assert lost.status_code == 404
    assert (
        "POST /api/chat: no such endpoint here: POST /v1/chat/completions"
        in (lost.json()["error"]["message"])
    )


def test_status_and_report_cli_against_the_live_daemon(daemon: Daemon) -> None:
    runner = CliRunner()
    assert daemon.post(CHAT, {"messages": user("hi"), "n": 3}).status_code == 400
    for _ in range(3):  # this test's own requests (the fixture's daemon serves the module's)
        body = {"messages": user("hi"), "max_tokens": 4, "task": "qa"}
        assert daemon.post(CHAT, body).status_code == 200
    r = runner.invoke(cli, ["status", "--url", daemon.url])
    assert r.exit_code == 0, r.output
    assert "smollm2" in r.stdout and "speculative" in r.stdout and "MiB" in r.stdout
    start = r"start: target served after [\d.]+ s, draft after [\d.]+ s, costs measured after"
    assert re.search(start, r.stdout), r.stdout
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
    measured = log.index("pair smollm2: costs measured after")
    assert ready < attached < measured
    pair = daemon.get("/homespec/status").json()["pairs"][0]
    assert 0 < pair["ready_after_s"] <= pair["speculative_after_s"] <= pair["measured_after_s"]


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


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"temperature": 5}, "temperature"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": 100000}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "a\x00b"}]}, "messages[0].content"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_refused_field_is_named_in_the_errors_param(
    daemon: Daemon, body: dict[str, Any], param: str
) -> None:
    """OpenAI's envelope names the offending field in `param`, which clients show (the openai
    SDK's BadRequestError.param); the message names it too."""
    r = daemon.post(CHAT, {"messages": user("x"), **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert param.split(".")[0].split("[")[0] in err["message"]


def test_a_body_that_names_no_field_has_no_param(daemon: Daemon) -> None:
    r = httpx.post(daemon.url + CHAT, content=b"{", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] is None
