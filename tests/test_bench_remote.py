"""`homespec bench --against`: another OpenAI-compatible server in the same table.

The "other server" here is a real `homespec serve` over the scripted fake engine, and the local
pair is the same fake target, so both must give the same answers; timings come from the run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from homespec.bench import Run, render_table, run_bench, summarize, warm_up_modes
from homespec.bench_remote import Remote, parse_against, run_remote
from homespec.bench_standing import standings
from homespec.engine.drafters import ModelDrafter, NgramDrafter
from homespec.engine.runtime import PairRuntime
from homespec.engine.types import GenerationStats, Message
from homespec.errors import ConfigError, RequestError
from homespec.manifest import PairSpec
from homespec.workload import WorkItem
from tests.daemon_process import Daemon, fake_daemon, free_port
from tests.fake_target import FakeTarget
from tests.fixed_costs import cheap_drafts


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
        runs = run_bench(
            rt, items(), modes=["plain", "ngram", "auto"], remotes=[remote], client=client
        )
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
    # the fake server is a homespec daemon: auto is held against forced n-gram, not against it
    standing = {s.task: s for s in standings(list(rows.values()))}["all"]
    assert not fake.other_server
    assert (standing.other, standing.forced) == (None, "ngram")


def llama_server_like(request: httpx.Request) -> httpx.Response:
    """An OpenAI-compatible stream as llama-server sends it: no `homespec` stats."""
    events = [
        {"choices": [{"delta": {"content": "Hello"}, "finish_reason": None}]},
        {"choices": [{"delta": {"content": " there"}, "finish_reason": "stop"}]},
        {
            "choices": [],
            "usage": {"completion_tokens": 2, "prompt_tokens": 9},
            "timings": {"draft_n": 4, "draft_n_accepted": 1},
        },
    ]
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})


def test_auto_is_held_against_a_server_that_is_not_homespec() -> None:
    spec = PairSpec(target="t", draft="d")
    rt = PairRuntime("p", spec, FakeTarget(), ModelDrafter(FakeTarget()), NgramDrafter())
    remote = Remote("llama", "http://llama.test")
    with httpx.Client(transport=httpx.MockTransport(llama_server_like)) as client:
        text, stats, own = run_remote(client, remote, items()[1], temperature=0.0, max_tokens=8)
        runs = run_bench(rt, items(), modes=["plain", "auto"], remotes=[remote], client=client)
    assert (text, own) == ("Hello there", False)
    assert (stats.proposed_tokens, stats.accepted_tokens) == (4, 1)
    rows = summarize(runs)
    assert {r.mode for r in rows if r.other_server} == {"llama"}
    standing = {s.task: s for s in standings(rows)}["all"]
    assert standing.other == "llama" and standing.vs_other is not None


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


def test_only_auto_teaches_the_governor_what_drafts_are_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Forced modes run the same prompts as auto; had they taught the governor, auto would be
    measured on acceptance a server running auto never has. Only auto's own runs teach it.
    Drafting is priced cheap (cheap_drafts), so auto drafts whatever the machine's load."""
    spec = PairSpec(target="t", draft="d", spec_min_max_tokens=0)

    def learned(modes: list[str]) -> float:
        drafter = ModelDrafter(FakeTarget(decode_s=0))
        rt = PairRuntime("p", spec, FakeTarget(decode_s=0), drafter, NgramDrafter())
        cheap_drafts(monkeypatch, rt)
        run_bench(rt, items(), modes=modes)
        tables = rt.ledger.by_task.values()
        return sum(acc.tries[0] for table in tables for acc in table.values())

    assert learned(["plain", "model", "ngram", "hybrid"]) == 0
    assert learned(["plain", "auto"]) > 0


def test_the_warm_up_teaches_the_governor_and_the_memory_nothing() -> None:
    """Other servers are warmed up with a greeting: auto warmed up on the workload's first
    prompt would start that prompt knowing how its task's answers run."""
    spec = PairSpec(target="t", draft="d", spec_min_max_tokens=0)
    drafter = ModelDrafter(FakeTarget(decode_s=0))
    rt = PairRuntime("p", spec, FakeTarget(decode_s=0), drafter, NgramDrafter(memory_tokens=4096))
    warm_up_modes(rt, items()[0], ["plain", "auto", "ngram", "model"], 0.0)
    ledger = rt.ledger
    assert ledger.verify.points  # costs are measured all the same
    tables = ledger.by_task.values()
    assert sum(acc.tries[0] for table in tables for acc in table.values()) == 0
    assert not ledger.lengths.answers and not ledger.upkeep and not ledger.shares
    assert rt.ngram.memory is not None and len(rt.ngram.memory) == 0


def test_against_another_server_the_memory_is_kept_across_repeats_as_theirs_is(
    other: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama-server's ngram-mod table cannot be emptied between repeats: it has seen the prompt
    from the second repeat on, so homespec's memory must have too, or the table is unfair."""
    spec = PairSpec(target="t", draft="ngram")
    rt = PairRuntime("p", spec, FakeTarget(decode_s=0), None, NgramDrafter(memory_tokens=4096))
    memory = rt.ngram.memory
    assert memory is not None
    cleared: list[int] = []
    forget = memory.clear
    monkeypatch.setattr(memory, "clear", lambda: (cleared.append(len(memory)), forget()))
    remote = parse_against(f"fake={other.url}/v1", 1)
    with httpx.Client(timeout=30) as client:
        run_bench(rt, items(), modes=["plain", "ngram"], repeat=2, remotes=[remote], client=client)
    assert cleared == [] and len(memory) > 0


def _run(item: int, mode: str, rep: int, tokens: int, tok_s: float) -> Run:
    stats = GenerationStats("plain", "", "none", completion_tokens=tokens)
    stats.e2e_ms = stats.ttft_ms = 1000.0 * tokens / tok_s
    return Run("extract", item, rep, mode, "", stats)


def test_a_tasks_tok_s_is_its_tokens_over_its_time_not_one_prompts_median() -> None:
    """Measured on this box (extract, --repeat 3): a median of six runs of two prompts is the
    mean of one prompt's slowest and the other's fastest run, and it had auto 10% behind forced
    n-gram where the runs' tokens over their time have them 3% apart."""
    rates = {
        "auto": ([50.2, 63.2, 67.2], [44.5, 43.0, 43.2]),
        "ngram": ([63.6, 63.8, 65.6], [40.9, 39.4, 41.6]),
        "plain": ([37.9, 39.2, 48.5], [41.3, 35.8, 36.5]),
    }
    runs = [
        _run(item, mode, rep, tokens, per_prompt[item][rep])
        for mode, per_prompt in rates.items()
        for item, tokens in enumerate((256, 110))
        for rep in range(3)
    ]
    rows = {r.mode: r for r in summarize(runs) if r.task == "extract"}

    def throughput(mode: str) -> float:
        seconds = sum(t / r for t, rs in zip((256, 110), rates[mode], strict=True) for r in rs)
        return 3 * (256 + 110) / seconds

    for mode in rates:
        assert rows[mode].tokens_per_s == pytest.approx(throughput(mode))
    assert rows["auto"].speedup == pytest.approx(throughput("auto") / throughput("plain"))
    assert rows["auto"].tokens_per_s / rows["ngram"].tokens_per_s == pytest.approx(0.97, abs=0.01)


def test_a_homespec_daemons_own_draft_counts_reach_the_table(other: Daemon) -> None:
    """A homespec daemon has no llama-server `timings`: its `homespec` stats give the row's
    accept rate (scripts/llama_server_compare.sh puts the daemon beside llama-server)."""
    with httpx.Client(timeout=30) as client:
        _, stats, own = run_remote(
            client, Remote("own", other.url), items()[0], temperature=0.0, max_tokens=40
        )
    assert own  # homespec itself: `auto` is not held against it as against another server
    assert stats.mode == "speculative" and stats.drafter != "none"
    assert 0 < stats.accepted_tokens <= stats.proposed_tokens
    assert stats.accept_rate is not None and 0 < stats.accept_rate <= 1
