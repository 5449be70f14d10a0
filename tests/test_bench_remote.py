"""`homespec bench --against`: another OpenAI-compatible server in the same table.

The "other server" here is a real `homespec serve` over the scripted fake engine, and the local
pair is the same fake target, so both must give the same answers; timings come from the run.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from homespec.bench import render_table, run_bench, summarize
from homespec.bench_remote import Remote, parse_against, run_remote
from homespec.engine.drafters import ModelDrafter, NgramDrafter
from homespec.engine.generate import PairRuntime
from homespec.engine.types import Message
from homespec.errors import ConfigError, RequestError
from homespec.manifest import PairSpec
from homespec.workload import WorkItem
from tests.daemon_process import Daemon, fake_daemon, free_port
from tests.fake_target import FakeTarget


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = fake_daemon(tmp_path_factory.mktemp("other"), env={"HOMESPEC_FAKE_DECODE_S": "0.002"})
    yield d
    d.stop()


def items() -> list[WorkItem]:
    ask = [("extract", "forever the same words again. "), ("short", "Say hello.")]
    return [WorkItem(t, [Message("user", text)], 40, n) for n, (t, text) in enumerate(ask, 1)]


def test_the_other_server_answers_the_same_requests_in_the_same_table(other: Daemon) -> None:
    spec = PairSpec(target="t", draft="d")
    rt = PairRuntime(
        "p", spec, FakeTarget(decode_s=0.002), ModelDrafter(FakeTarget()), NgramDrafter()
    )
    remote = parse_against(f"fake={other.url}/v1", 1)
    with httpx.Client(timeout=30) as client:
        runs = run_bench(rt, items(), modes=["plain", "ngram"], remotes=[remote], client=client)
    assert [r.mode for r in runs].count("fake") == 2  # one per prompt, interleaved
    by = {(r.item, r.mode): r for r in runs}
    for item in range(2):
        mine, theirs = by[(item, "plain")], by[(item, "fake")]
        assert theirs.text == mine.text  # the same scripted answer, through HTTP
        assert theirs.stats.completion_tokens == mine.stats.completion_tokens > 0
        assert 0 < theirs.stats.ttft_ms <= theirs.stats.e2e_ms
    rows = {(r.task, r.mode): r for r in summarize(runs)}
    fake = rows[("all", "fake")]
    assert fake.identical == 1.0 and fake.speedup is not None and fake.speedup > 0
    assert "fake" in render_table(list(rows.values()))


def test_against_values_are_checked() -> None:
    assert parse_against("http://h:1/v1/", 3) == Remote("remote3", "http://h:1")
    assert parse_against("llama=http://h:1", 1) == Remote("llama", "http://h:1")
    for bad in ("h:1", "bad label=http://h:1", "=http://h:1"):
        with pytest.raises(ConfigError):
            parse_against(bad, 1)


def test_a_server_that_is_not_there_is_named() -> None:
    remote = Remote("gone", f"http://127.0.0.1:{free_port()}")
    with httpx.Client(timeout=5) as client, pytest.raises(RequestError, match="gone at http"):
        run_remote(client, remote, items()[0], temperature=0.0, max_tokens=4)


def test_a_server_that_refuses_is_named(other: Daemon, tmp_path: Path) -> None:
    remote = Remote("fake", other.url + "/nowhere")
    with httpx.Client(timeout=5) as client, pytest.raises(RequestError, match=r"fake at .*: 404"):
        run_remote(client, remote, items()[0], temperature=0.0, max_tokens=4)


def test_the_bench_memory_learns_each_prompt_once_after_all_its_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No mode may draft from another mode's answer to the same prompt: the n-gram memory
    learns a prompt from its last run only, after every mode ran it, and starts empty at each
    repeat."""
    spec = PairSpec(target="t", draft="ngram")
    rt = PairRuntime("p", spec, FakeTarget(decode_s=0), None, NgramDrafter(memory_tokens=4096))
    memory = rt.ngram.memory
    assert memory is not None
    events: list[str] = []
    learn, forget = memory.add, memory.clear
    monkeypatch.setattr(memory, "add", lambda tokens: (events.append("learn"), learn(tokens)))
    monkeypatch.setattr(memory, "clear", lambda: (events.append("clear"), forget()))
    run_bench(
        rt, items(), modes=["plain", "ngram"], repeat=2, progress=lambda _: events.append("run")
    )
    # per prompt: one run, then the other, which learns as it ends (before it is reported)
    item = ["run", "learn", "run"]
    assert events == ["clear", *item, *item] * 2
