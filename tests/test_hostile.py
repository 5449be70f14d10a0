"""A corpus of bad inputs: HTTP bodies to a running daemon and models.toml files to the CLI.

Each must get a 4xx (or a clean `Error:` from the CLI, exit 2) that says what was wrong, never a
500 or a traceback, and the daemon must serve a good request afterwards. The HTTP side runs
against one `homespec serve` over the scripted fake engine (no model files); the manifest side
uses tiny synthetic GGUFs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import write_tiny_gguf
from tests.daemon_process import Daemon, fake_daemon
from tests.test_cli import assert_clean_error, invoke

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], **fields}


@dataclass(frozen=True)
class Bad:
    name: str
    status: int
    says: str  # a piece of the error message that tells the client what was wrong
    body: Any = None  # JSON to send; or `raw` bytes
    raw: bytes | None = None
    path: str = CHAT
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)


BODIES = [
    # what is sent is not a request at all
    Bad(
        "malformed JSON",
        400,
        "JSON",
        raw=b'{"messages": [',
        headers={"content-type": "application/json"},
    ),
    Bad("a JSON list", 400, "object", body=[1, 2]),
    Bad("a JSON string", 400, "object", body="hello"),
    Bad("an empty body", 400, "body", raw=b"", headers={"content-type": "application/json"}),
    Bad(
        "invalid UTF-8",
        400,
        "UTF-8",
        raw=b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',
        headers={"content-type": "application/json"},
    ),
    Bad(
        "JSON nested 100000 deep",
        400,
        "JSON",
        raw=b"[" * 100_000 + b"]" * 100_000,
        headers={"content-type": "application/json"},
    ),
    Bad(
        "plain text content type",
        400,
        "JSON",
        raw=json.dumps(chat()).encode(),
        headers={"content-type": "text/plain"},
    ),
    Bad(
        "an oversize body",
        413,
        "request body over",
        raw=b'{"x": "' + b"a" * 2_000_000 + b'"}',
        headers={"content-type": "application/json"},
    ),
    # messages
    Bad("no messages", 400, "messages", body={"model": "smollm2"}),
    Bad("empty messages", 400, "messages", body=chat(messages=[])),
    Bad("messages not a list", 400, "messages", body=chat(messages="hi")),
    Bad("a wrong role", 400, "role", body=chat(messages=[{"role": "wizard", "content": "hi"}])),
    Bad("a message without content", 400, "content", body=chat(messages=[{"role": "user"}])),
    Bad(
        "a number as content", 400, "content", body=chat(messages=[{"role": "user", "content": 5}])
    ),
    Bad(
        "an image part",
        400,
        "content",
        body=chat(
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}],
                }
            ]
        ),
    ),
    Bad(
        "a NUL in content",
        400,
        "messages[0].content holds a NUL",
        body=chat(messages=[{"role": "user", "content": "a\x00b"}]),
    ),
    Bad(
        "a lone surrogate",
        400,
        "lone UTF-16 surrogate",
        raw=b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}',
        headers={"content-type": "application/json"},
    ),
    Bad(
        "a prompt over the context",
        400,
        "token context",
        body=chat(messages=[{"role": "user", "content": "word " * 3000}]),
    ),
    # sampling and length
    Bad("max_tokens 0", 400, "max_tokens", body=chat(max_tokens=0)),
    Bad("max_tokens negative", 400, "max_tokens", body=chat(max_tokens=-5)),
    Bad("max_tokens huge", 400, "max_tokens", body=chat(max_tokens=10**12)),
    Bad("max_tokens a word", 400, "max_tokens", body=chat(max_tokens="ten")),
    Bad(
        "temperature NaN",
        400,
        "temperature",
        raw=b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        headers={"content-type": "application/json"},
    ),
    Bad("temperature negative", 400, "temperature", body=chat(temperature=-0.5)),
    Bad(
        "temperature infinite",
        400,
        "temperature",
        raw=b'{"messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}',
        headers={"content-type": "application/json"},
    ),
    Bad("top_p above 1", 400, "top_p", body=chat(top_p=2)),
    Bad("top_k negative", 400, "top_k", body=chat(top_k=-3)),
    Bad("seed a word", 400, "seed", body=chat(seed="abc")),
    Bad("stream a word", 400, "stream", body=chat(stream="maybe")),
    Bad("stop not strings", 400, "stop", body=chat(stop=[1, 2])),
    Bad(
        "seventeen stop strings",
        400,
        "at most 16 stop strings, got 17",
        body=chat(stop=[f"s{i}" for i in range(17)]),
    ),
    Bad("an empty stop string", 400, "stop string is empty", body=chat(stop="")),
    Bad("an empty stop in a list", 400, "stop string is empty", body=chat(stop=["a", ""])),
    # OpenAI fields homespec cannot honour
    Bad("n 2", 400, "n", body=chat(n=2)),
    Bad("a presence penalty", 400, "presence_penalty", body=chat(presence_penalty=0.5)),
    Bad("a logit bias", 400, "logit_bias", body=chat(logit_bias={"50256": -100})),
    Bad(
        "a JSON response format",
        400,
        "response_format",
        body=chat(response_format={"type": "json_object"}),
    ),
    Bad("tools", 400, "tools", body=chat(tools=[{"type": "function", "function": {"name": "f"}}])),
    Bad("logprobs", 400, "logprobs", body=chat(logprobs=True)),
    # other servers' samplers
    Bad("a llama.cpp grammar", 400, "grammar", body=chat(grammar='root ::= "a"')),
    Bad("a repeat penalty", 400, "repeat_penalty", body=chat(repeat_penalty=1.3)),
    Bad("vLLM's guided JSON", 400, "guided_json", body=chat(guided_json={"type": "object"})),
    Bad("min_p above 1", 400, "min_p", body=chat(min_p=3)),
    Bad("n_predict 0", 400, "n_predict", body=chat(n_predict=0)),
    # homespec's extras
    Bad("speculative maybe", 400, "speculative", body=chat(speculative="maybe")),
    Bad("an unknown drafter", 400, "drafter", body=chat(drafter="wizard")),
    Bad("draft_tokens 0", 400, "draft_tokens", body=chat(draft_tokens=0)),
    Bad("draft_tokens 1000", 400, "draft_tokens", body=chat(draft_tokens=1000)),
    Bad("a task name 1000 long", 400, "task", body=chat(task="t" * 1000)),
    # completions
    Bad("a prompt of token ids", 400, "prompt", path=COMPLETIONS, body={"prompt": [1, 2, 3]}),
    Bad("no prompt", 400, "prompt", path=COMPLETIONS, body={"max_tokens": 4}),
    # the wrong door
    Bad("GET on chat completions", 405, "/v1/chat/completions takes POST, not GET", method="GET"),
    Bad(
        "an unknown path",
        404,
        "POST /v1/nothing: no such endpoint here: POST /v1/chat/completions",
        path="/v1/nothing",
        body=chat(),
    ),
]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = fake_daemon(tmp_path_factory.mktemp("hostile"), env={"HOMESPEC_FAKE_DECODE_S": "0"})
    yield d
    d.stop()


@pytest.mark.parametrize("bad", BODIES, ids=[b.name for b in BODIES])
def test_a_bad_request_gets_a_4xx_that_says_what_was_wrong(daemon: Daemon, bad: Bad) -> None:
    content = bad.raw if bad.raw is not None else None
    kwargs: dict[str, Any] = {"headers": bad.headers, "timeout": 60}
    if content is not None:
        kwargs["content"] = content
    elif bad.body is not None:
        kwargs["json"] = bad.body
    r = httpx.request(bad.method, daemon.url + bad.path, **kwargs)
    assert r.status_code == bad.status, r.text[:500]
    error = r.json()["error"]
    assert bad.says in error["message"], error
    assert error["type"] and "Traceback" not in r.text


def test_the_daemon_serves_after_the_corpus_and_logged_no_traceback(daemon: Daemon) -> None:
    for bad in BODIES:  # whatever ran before: once more, in one go
        content = bad.raw if bad.raw is not None else json.dumps(bad.body).encode()
        httpx.request(bad.method, daemon.url + bad.path, content=content, timeout=60)
    r = daemon.post(CHAT, chat(max_tokens=8))
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    assert daemon.get("/health").json()["status"] == "ready"
    assert "Traceback" not in daemon.log()


# --- models.toml ----------------------------------------------------------------------------

GOOD_PAIR = '[pairs.p]\ntarget = "t"\ndraft = "ngram"\n'


def _manifest(tmp: Path, text: str) -> Path:
    model = write_tiny_gguf(tmp / "tiny.gguf")
    path = tmp / "models.toml"
    path.write_text(text.replace("TINY", str(model)).replace("DIR", str(tmp)))
    return path


MANIFESTS = [
    ("TOML syntax", '[models.t\npath = "TINY"\n', "models.toml"),
    (
        "a typo in a key",
        '[models.t]\npath = "TINY"\n' + GOOD_PAIR + "draft_tokenz = 4\n",
        "pairs.p.draft_tokenz",
    ),
    (
        "a wrong type",
        '[models.t]\npath = "TINY"\n' + GOOD_PAIR + 'n_ctx = "big"\n',
        "pairs.p.n_ctx",
    ),
    (
        "a negative context",
        '[models.t]\npath = "TINY"\n' + GOOD_PAIR + "n_ctx = -5\n",
        "pairs.p.n_ctx",
    ),
    (
        "a negative thread count",
        '[models.t]\npath = "TINY"\n' + GOOD_PAIR + "threads = -1\n",
        "pairs.p.threads",
    ),
    (
        "draft_tokens 0",
        '[models.t]\npath = "TINY"\n' + GOOD_PAIR + "draft_tokens = 0\n",
        "pairs.p.draft_tokens",
    ),
    (
        "a negative n-gram memory",
        '[models.t]\npath = "TINY"\n' + GOOD_PAIR + "ngram_memory = -1\n",
        "pairs.p.ngram_memory",
    ),
    (
        "a model declared twice",
        '[models.t]\npath = "TINY"\n[models.t]\npath = "TINY"\n' + GOOD_PAIR,
        "models.toml",
    ),
    (
        "a pair naming itself",
        '[models.t]\npath = "TINY"\n[pairs.p]\ntarget = "p"\ndraft = "ngram"\n',
        "'p'",
    ),
    (
        "a draft that is the target",
        '[models.t]\npath = "TINY"\n[pairs.p]\ntarget = "t"\ndraft = "t"\n',
        "is the target itself",
    ),
    (
        "a draft that is no model",
        '[models.t]\npath = "TINY"\n[pairs.p]\ntarget = "t"\ndraft = "nothing"\n',
        "'nothing'",
    ),
    (
        "a default pair that is not declared",
        'default_pair = "q"\n[models.t]\npath = "TINY"\n' + GOOD_PAIR,
        "'q'",
    ),
    ("no pairs at all", '[models.t]\npath = "TINY"\n', "pair"),
    (
        "a hot default temperature",
        '[models.t]\npath = "TINY"\n' + GOOD_PAIR + "[pairs.p.sampling]\ntemperature = -1\n",
        "temperature",
    ),
    (
        "a budget that is no size",
        '[memory]\nbudget = { ram = "lots" }\n[models.t]\npath = "TINY"\n' + GOOD_PAIR,
        "lots",
    ),
    ("a model path that is a directory", '[models.t]\npath = "DIR"\n' + GOOD_PAIR, "directory"),
    (
        "a model file that is missing",
        '[models.t]\npath = "DIR/none.gguf"\n' + GOOD_PAIR,
        "none.gguf",
    ),
    (
        "a worker endpoint without a port",
        '[workers.w]\nendpoint = "box"\n[models.t]\npath = "TINY"\n' + GOOD_PAIR,
        "workers.w",
    ),
    (
        "a worker endpoint in IPv6",
        '[workers.w]\nendpoint = "[::1]:50052"\n[models.t]\npath = "TINY"\n' + GOOD_PAIR,
        "IPv4 address or a host name",
    ),
    (
        "a worker budget that is no size",
        '[workers.w]\nendpoint = "h:1"\nbudget = "a lot"\n[models.t]\npath = "TINY"\n' + GOOD_PAIR,
        "workers.w",
    ),
    (
        "a pair spread over a worker nobody declared",
        '[models.t]\npath = "TINY"\n' + GOOD_PAIR + 'target_workers = ["ghost"]\n',
        "'ghost'",
    ),
    (
        "a negative stream interval",
        '[server]\nstream_interval_ms = -5\n[models.t]\npath = "TINY"\n' + GOOD_PAIR,
        "server.stream_interval_ms",
    ),
    (
        "huge pages asked for with a word",
        '[models.t]\npath = "TINY"\n' + GOOD_PAIR + 'huge_pages = "maybe"\n',
        "pairs.p.huge_pages",
    ),
    (
        "a worker timeout of zero",
        '[workers.w]\nendpoint = "h:1"\nconnect_timeout_s = 0\n[models.t]\npath = "TINY"\n'
        + GOOD_PAIR,
        "connect_timeout_s",
    ),
]


@pytest.mark.parametrize(("name", "text", "says"), MANIFESTS, ids=[m[0] for m in MANIFESTS])
def test_a_bad_manifest_is_a_clean_error_that_names_it(
    tmp_path: Path, name: str, text: str, says: str
) -> None:
    cfg = _manifest(tmp_path, text)
    code, out, err = invoke("ask", "--local", "hi", "--config", str(cfg))
    assert code == 2, out + err
    assert_clean_error(code, out, err, says)


def _tokenizer_broken(path: Path) -> None:
    """A GGUF whose token list is numbers, not strings: llama.cpp's vocabulary would be bad."""
    import numpy as np
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_context_length(256)
    w.add_embedding_length(8)
    w.add_head_count(2)
    w.add_tokenizer_model("gpt2")
    w.add_array("tokenizer.ggml.tokens", [1, 2, 3])
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("damage", ["truncated", "not GGUF", "tokens not strings", "empty"])
def test_a_damaged_model_file_is_a_clean_error_that_names_it(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "bad.gguf"
    if damage == "truncated":
        full = write_tiny_gguf(tmp_path / "full.gguf").read_bytes()
        path.write_bytes(full[: len(full) // 2])
    elif damage == "not GGUF":
        path.write_text("just some notes\n")
    elif damage == "tokens not strings":
        _tokenizer_broken(path)
    else:
        path.write_bytes(b"")
    cfg = tmp_path / "models.toml"
    cfg.write_text(f'[models.t]\npath = "{path}"\n{GOOD_PAIR}')
    code, out, err = invoke("ask", "--local", "hi", "--config", str(cfg))
    assert code == 2, out + err
    assert_clean_error(code, out, err, "bad.gguf")


@pytest.mark.parametrize("model", ["gpt-3.5-turbo", "../../../etc/passwd", "/dev/zero", "💥" * 40])
def test_an_unknown_or_path_like_model_name_is_served_by_the_default_pair_and_said(
    daemon: Daemon, model: str
) -> None:
    """By design (README): a `model` that names no pair is served by the default pair and the
    response says so; it is a name, never a path that is opened."""
    r = daemon.post(CHAT, {**chat(max_tokens=4), "model": model})
    assert r.status_code == 200, r.text
    notes = r.json()["homespec"]["notes"]
    assert notes == [f"model {model!r} is not a pair here: served by the default pair 'smollm2'"]
