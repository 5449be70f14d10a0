"""Conversations put aside (engine/prompt_cache.py): the pure plan, the budget and the RAM
floor on a context that counts its snapshots, the loop on the scripted fake target (its
restore fails on a snapshot brought back under another conversation's tokens) and what a
daemon's client sees of it. The real models' side (bit-identical answers after a restore) is
in tests/test_engine.py."""

from __future__ import annotations

import logging
import time

import httpx
import pytest
from click.testing import CliRunner
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from homespec.cli import cli
from homespec.engine.drafters import ModelDrafter, NgramDrafter
from homespec.engine.prompt_cache import (
    MIN_GAIN,
    MIN_READ,
    MIN_TOKENS,
    RAM_FLOOR,
    SAVE_SHARE,
    PromptCache,
    cache_report,
    plan,
)
from homespec.engine.runtime import PairRuntime
from homespec.engine.types import GenerationRequest, GenerationStats, Message
from homespec.manifest import PairSpec
from homespec.sizes import GiB

from .daemon_process import Daemon, read_log, user
from .fake_target import FakeTarget
from .test_verify import run

A = list(range(1000, 1300))  # a 300-token conversation
B = list(range(5000, 5200))  # another one


def test_a_new_conversation_puts_the_cached_one_aside_and_brings_nothing_back() -> None:
    p = plan(A, B, [])
    assert p.save and p.restore is None and p.reused == 0


def test_a_continued_conversation_keeps_the_cache_and_saves_nothing() -> None:
    p = plan(A, [*A, 1, 2, 3], [])
    assert not p.save and p.restore is None and p.reused == len(A)


def test_the_snapshot_sharing_most_of_the_prompt_comes_back() -> None:
    longer_a = [*A, 7, 7]
    p = plan(B, [*longer_a, 9], [A[:100], longer_a, B])
    assert p.restore == 1 and p.reused == len(longer_a)
    assert p.save is False  # the cache (B) is held by a snapshot already


def test_a_restore_must_spare_enough_reading_for_what_it_copies() -> None:
    """A chat template's opening is shared by every conversation: not worth a copy. Nor is
    a long conversation for a little of it; a short one that shares a system prompt is."""
    opening = list(range(10, 40))  # 30 tokens every history starts with
    system = list(range(40, 40 + MIN_GAIN))  # a system prompt
    cached = [*opening, *B]
    chat = [*opening, *system, *A]  # 346 tokens; it spares MIN_GAIN + 300 of them
    assert plan(cached, [*chat, 5], [chat]).restore == 0
    assert plan(cached, [*opening, 5, 6], [chat]).restore is None  # spares nothing
    # the same system prompt, another question: spares MIN_GAIN tokens for 346 copied
    assert plan(cached, [*opening, *system, 5, 6], [chat]).restore is None
    short = [*opening, *system, *A[:10]]  # 56 tokens: MIN_GAIN spared is worth copying them
    assert plan(cached, [*opening, *system, 5, 6], [short]).restore == 0
    assert plan(cached, [*opening, *system[:-1], 5, 6], [short]).restore is None


def test_a_short_cache_or_a_small_drop_is_not_saved() -> None:
    assert not plan(A[: MIN_TOKENS - 1], B, []).save
    # the prompt's last token is read again (its logits): a history that parts from the cache
    # MIN_TOKENS - 1 tokens before its end drops as many, as rejected drafts do
    assert not plan(A, [*A[: len(A) - MIN_TOKENS + 1], 5], []).save
    assert plan(A, [*A[: len(A) - MIN_TOKENS], 5], []).save


def test_what_status_says_of_the_cache_follows_its_measured_costs() -> None:
    assert cache_report(None, 2.0)["puts_aside"] is True  # nothing copied yet: as declared
    cheap, dear = cache_report(0.015, 2.3), cache_report(0.2, 0.1)
    assert cheap["copy_over_read"] == pytest.approx(0.0065, abs=1e-4) and cheap["puts_aside"]
    assert dear["copy_over_read"] == 2.0 and dear["puts_aside"] is False


def test_where_copying_costs_about_what_reading_does_nothing_is_put_aside_or_brought_back() -> None:
    """`dear`: a copied token's cost over a read one's, as measured. A thousandth (a CPU's)
    changes nothing; past SAVE_SHARE nothing is saved; a restore must spare 1.5x what its copy
    costs in reading (one H100 read the demo pair's prompts faster than it copied its cache)."""
    opening = list(range(10, 40))
    chat = [*opening, *A]  # 330 tokens; a turn of it spares 300 reads
    turn = [*chat, 5]
    for cheap in (None, 0.001, SAVE_SHARE):
        assert plan(A, B, [], cheap).save
        assert plan([*opening, *B], turn, [chat], cheap).restore == 0
    assert not plan(A, B, [], SAVE_SHARE * 1.01).save
    assert plan([*opening, *B], turn, [chat], 0.6).restore == 0  # 300 > 1.5 × 0.6 × 330
    assert plan([*opening, *B], turn, [chat], 0.7).restore is None  # 300 < 1.5 × 0.7 × 330


class SlowCopies(FakeTarget):
    """A context whose copies take `copy_s` per token, like a card's through the host."""

    def __init__(self, copy_s: float) -> None:
        super().__init__(decode_s=0)
        self.copy_s = copy_s

    def snapshot(self) -> bytearray:
        time.sleep(self.copy_s * len(self.tokens))
        return super().snapshot()

    def restore(self, tokens: list[int], data: bytearray) -> bool:
        time.sleep(self.copy_s * len(tokens))
        return super().restore(tokens, data)


def test_a_cache_measures_its_copies_and_stops_saving_where_they_cost_like_reads(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ctx = SlowCopies(copy_s=0.0001)  # 0.1 ms a token
    cache = PromptCache(budget=1 << 30, available=lambda: 64 * GiB)
    cache.observe_read(MIN_READ - 1, 1000.0)  # too short a read to say what a token costs
    assert cache.read_ms is None and cache.dear is None
    ctx.extend(A)
    assert cache.recall(ctx, B).saved == len(A)  # nothing known yet: as before
    assert cache.copy_ms is not None and cache.copy_ms >= 0.1
    cache.observe_read(200, 2000.0)  # 10 ms a token: a CPU's read, copies cheap beside it
    assert cache.dear is not None and cache.dear < SAVE_SHARE
    ctx.extend(B)
    assert cache.recall(ctx, [7] * 100).saved == len(B)
    for _ in range(20):  # reads turn fast (a GPU's): 0.1 ms a token, a copy as dear
        cache.observe_read(200, 20.0)
    ctx.extend([7] * 100)
    with caplog.at_level(logging.INFO, logger="homespec.engine"):
        assert cache.recall(ctx, [8] * 100).saved == 0
        assert cache.recall(ctx, [*A, 1]).restored == 0  # A is kept, but reading is cheaper
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "conversations are read again instead of put aside" in said[0]


def test_the_loop_tells_the_target_cache_what_its_prompt_reads_cost() -> None:
    spec = PairSpec(target="t", draft="ngram", prompt_cache_mb=64)
    rt = PairRuntime("p", spec, FakeTarget(decode_s=0, token_s=0.0005), None, NgramDrafter())
    chat(rt, [Message("user", LONG)])
    assert rt.target_snapshots.read_ms == pytest.approx(0.5, rel=0.5)


class Counting(FakeTarget):
    """A FakeTarget whose snapshots weigh 1 MiB per token here, to exercise the budget."""

    def snapshot_size(self) -> int:
        return len(self.tokens) << 20

    def snapshot(self) -> bytearray:
        data = super().snapshot()
        return data + bytearray(len(self.tokens) * (1 << 20) - len(data))

    def restore(self, tokens: list[int], data: bytearray) -> bool:
        return super().restore(tokens, data[: 4 * len(tokens)])


def test_the_budget_keeps_the_most_recently_used_and_drops_extended_copies() -> None:
    ctx = Counting(decode_s=0)
    cache = PromptCache(budget=500 << 20, available=lambda: 64 * GiB)
    convs = [list(range(k * 1000, k * 1000 + 200)) for k in range(4)]
    for conv in convs:
        cache.recall(ctx, conv)
        ctx.extend(conv)
    # 200 tokens each: two fit in 500 MiB, and the third and fourth conversation pushed the
    # first two out (the last is the context's own, not a snapshot)
    assert [s.tokens for s in cache.kept] == [convs[1], convs[2]]
    back = cache.recall(ctx, [*convs[1], 1, 2])
    assert back.restored == len(convs[1]) and ctx.tokens == convs[1]
    # convs[2] made room for the context's convs[3]; convs[1], restored, is the most recent
    assert [s.tokens for s in cache.kept] == [convs[3], convs[1]]
    ctx.extend([*convs[1], 1, 2])
    cache.recall(ctx, convs[2][:10] + [0] * 100)  # nothing shares it: the cache goes aside
    # the extended conversation replaced its own older copy
    assert [s.tokens for s in cache.kept] == [convs[3], [*convs[1], 1, 2]]


def test_under_the_ram_floor_nothing_is_kept_and_what_was_kept_goes() -> None:
    ctx = Counting(decode_s=0)
    free = [64 * GiB]
    cache = PromptCache(budget=4 * GiB, available=lambda: free[0])
    ctx.extend(A)
    assert cache.recall(ctx, B).saved == len(A)
    ctx.extend(B)
    free[0] = RAM_FLOOR + (100 << 20)  # 100 MiB over the floor: B's 200 MiB copy does not fit
    assert cache.recall(ctx, [7] * 100).saved == 0
    assert cache.kept == []  # A's copy went first, to make room, and it was not enough


class Uncopyable(FakeTarget):
    """A context whose cache llama.cpp could not copy (LlamaContext.snapshot says so empty)."""

    def snapshot(self) -> bytearray:
        return bytearray()


def test_a_cache_that_cannot_be_copied_is_not_kept_and_the_request_goes_on() -> None:
    ctx = Uncopyable(decode_s=0)
    cache = PromptCache(budget=1 << 30, available=lambda: 64 * GiB)
    ctx.extend(A)
    r = cache.recall(ctx, B)
    assert r.saved == 0 and cache.kept == [] and ctx.tokens == A  # extend drops it next


def test_a_zero_budget_keeps_nothing() -> None:
    ctx = FakeTarget(decode_s=0)
    cache = PromptCache(budget=0)
    ctx.extend(A)
    r = cache.recall(ctx, B)
    assert r.saved == 0 and r.reused == 0 and cache.kept == [] and ctx.tokens == A


LONG = "Please review this text carefully. " * 12  # about 420 tokens in the fake vocabulary


def chat(rt: PairRuntime, messages: list[Message], **kw: object) -> tuple[str, GenerationStats]:
    return run(rt, GenerationRequest(messages=messages, max_tokens=80, **kw))  # type: ignore[arg-type]


def _conversation(prompt_cache_mb: int, copy_s: float = 0.0) -> list[GenerationStats]:
    spec = PairSpec(target="t", draft="d", prompt_cache_mb=prompt_cache_mb)
    draft = ModelDrafter(FakeTarget(decode_s=0))
    target = SlowCopies(copy_s) if copy_s else FakeTarget(decode_s=0)
    rt = PairRuntime("p", spec, target, draft, NgramDrafter())
    first = [Message("user", LONG)]
    text, s1 = chat(rt, first, speculative=True, drafter="model")
    _, s2 = chat(rt, [Message("user", "Say hello.")])  # a title request, another user
    again = [*first, Message("assistant", text), Message("user", "Shorter.")]
    text2, s3 = chat(rt, again, speculative=True, drafter="model")
    assert text2 == "Shorter."
    assert draft.ctx.tokens[: s3.prompt_tokens] == rt.target.tokens[: s3.prompt_tokens]
    return [s1, s2, s3]


def test_a_conversation_comes_back_after_another_took_the_cache() -> None:
    """The first chat went aside when "Say hello." came; its next turn reads it from the
    snapshot, on the target and on the draft model alike (their restores check the snapshot
    is the conversation's own). The fake's template marks only the answer being generated,
    so the turn re-reads the first answer from its rendered "assistant:" on."""
    first, hello, back = _conversation(256)
    assert first.cached_tokens == 0 and hello.cached_tokens < 10
    assert back.cached_tokens == first.prompt_tokens - 1
    _, _, cold = _conversation(0)
    assert cold.cached_tokens < 10  # the same turn with prompt_cache_mb = 0
    _, _, dear = _conversation(256, copy_s=0.0002)  # copies dearer than the fake's reads
    assert dear.cached_tokens < 10  # saved (nothing was known then), but not brought back


def test_a_conversation_put_aside_is_reported_cached_when_it_comes_back(
    sdk: OpenAI, daemon: Daemon
) -> None:
    """Another request took the pair's cache between two turns of a chat: the second turn's
    prompt comes from the conversation put aside, and OpenAI's usage says how much of it
    (`prompt_tokens_details.cached_tokens`), as do the stats, the request log and /metrics."""
    chat = user("Review this text. " * 12)
    first = sdk.chat.completions.create(model="smollm2", messages=chat, max_tokens=20)  # type: ignore[call-overload]
    sdk.chat.completions.create(model="smollm2", messages=user("Say hello."), max_tokens=8)  # type: ignore[call-overload]
    turn = [
        *chat,
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Shorter."},
    ]
    again = sdk.chat.completions.create(model="smollm2", messages=turn, max_tokens=20)  # type: ignore[call-overload]
    assert first.usage is not None and again.usage is not None
    details = again.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens is not None
    # the fake's template marks only the answer being generated: all of the first prompt but
    # that mark comes back
    assert details.cached_tokens == first.usage.prompt_tokens - 1
    assert again.model_dump()["homespec"]["cached_tokens"] == details.cached_tokens
    assert read_log(daemon)[-1]["cached_tokens"] == details.cached_tokens
    metrics = text_string_to_metric_families(httpx.get(daemon.url + "/metrics").text)
    cached = [
        s.value
        for family in metrics
        for s in family.samples
        if s.name == "homespec_tokens_total"
        and s.labels == {"pair": "smollm2", "kind": "prompt_cached"}
    ]
    assert cached and cached[0] >= details.cached_tokens
    # status: what the cache measured a copy and a read to cost, and that it puts aside
    pair = httpx.get(daemon.url + "/homespec/status").json()["pairs"][0]
    measured = pair["prompt_cache"]
    assert measured["copy_ms_per_token"] > 0 and measured["read_ms_per_token"] > 0
    assert measured["copy_over_read"] is not None and measured["puts_aside"] is True
    shown = CliRunner().invoke(cli, ["status", "--url", daemon.url]).stdout
    assert "prompt cache: a copied token costs " in shown and "conversations put aside" in shown
