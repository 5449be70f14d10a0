"""The memory watch's decision (pure), sample by sample."""

from __future__ import annotations

from pathlib import Path

from homespec.daemon.memory_watch import CALM_SAMPLES, ROOM_FACTOR, DraftWatch, decide
from homespec.sizes import GiB, MiB
from tests.daemon_process import fake_daemon, wait_until
from tests.fake_memory import FREE_FILE_ENV

MIN_FREE = 512 * MiB
DRAFT = 230 * MiB


def step(watch: DraftWatch, free: int, loaded: bool) -> tuple[str, DraftWatch]:
    v = decide(
        watch, device="ram", free=free, min_free=MIN_FREE, draft_bytes=DRAFT, draft_loaded=loaded
    )
    return v.action, v.watch


def test_short_memory_drops_the_draft_and_says_how_short() -> None:
    action, watch = step(DraftWatch(), 300 * MiB, loaded=True)
    assert action == "drop" and watch.dropped
    assert watch.reason == "memory: draft dropped (300.0 MiB free in ram, below min_free 512.0 MiB)"


def test_plenty_of_memory_keeps_everything_as_it_is() -> None:
    assert step(DraftWatch(), 4096 * MiB, loaded=True) == ("keep", DraftWatch())


def test_a_draft_that_never_loaded_is_not_the_watchs_to_drop_or_bring() -> None:
    assert step(DraftWatch(), 100 * MiB, loaded=False) == ("keep", DraftWatch())
    assert step(DraftWatch(), 8192 * MiB, loaded=False) == ("keep", DraftWatch())


def test_the_draft_comes_back_only_after_memory_stayed_back() -> None:
    _, watch = step(DraftWatch(), 300 * MiB, loaded=True)
    room = MIN_FREE * ROOM_FACTOR + DRAFT
    actions = []
    for free in [room, room, room - MiB, room, room, room]:  # one dip resets the count
        action, watch = step(watch, free, loaded=False)
        actions.append(action)
    assert actions == ["keep"] * (3 + CALM_SAMPLES - 1) + ["attach"]
    assert watch == DraftWatch()


def test_a_draft_that_came_back_another_way_is_watched_again() -> None:
    """An engine restart loads the draft whatever the watch did: short memory drops it again."""
    _, watch = step(DraftWatch(), 300 * MiB, loaded=True)
    action, again = step(watch, 300 * MiB, loaded=True)
    assert action == "drop" and again.dropped


def test_memory_just_above_min_free_does_not_bring_the_draft_back() -> None:
    """Loading it again would put the box straight back under the threshold: hysteresis."""
    _, watch = step(DraftWatch(), 300 * MiB, loaded=True)
    for _ in range(10):
        action, watch = step(watch, MIN_FREE + DRAFT + MiB, loaded=False)
        assert action == "keep" and watch.dropped and watch.reason.startswith("memory: draft")


# --- the running daemon ---------------------------------------------------------------------


def test_the_daemon_drops_the_draft_when_memory_runs_short_and_takes_it_back(
    tmp_path: Path,
) -> None:
    """speculative → draft dropped (loud: /health, status, metrics, log, every reason) → back,
    with the target answering throughout. Free RAM is scripted (tests/fake_memory.py)."""
    free = tmp_path / "free"
    free.write_text(str(8 * GiB))
    d = fake_daemon(
        tmp_path,
        server='[memory]\nmin_free = "512MiB"\nwatch_interval_s = 0.05',
        env={
            "HOMESPEC_MEMORY_PROBE": "tests.fake_memory:probe",
            FREE_FILE_ENV: str(free),
            "HOMESPEC_FAKE_DECODE_S": "0",
        },
    )
    ask = {"model": "smollm2", "max_tokens": 40, "drafter": "model", "speculative": True}
    ask["messages"] = [{"role": "user", "content": "forever speculation pays."}]

    def served() -> dict[str, object]:
        r = d.post("/v1/chat/completions", ask)
        assert r.status_code == 200, r.text
        stats: dict[str, object] = r.json()["homespec"]
        return stats

    def metric(name: str) -> float:
        line = next(
            x
            for x in d.get("/metrics").text.splitlines()
            if x.startswith(f'{name}{{pair="smollm2"}}')
        )
        return float(line.split()[-1])

    try:
        assert served()["drafter"] == "model"
        free.write_text(str(300 * MiB))
        health = wait_until(d, lambda h: h["pairs"]["smollm2"]["mode"] == "ngram")
        reason = health["pairs"]["smollm2"]["reason"]
        assert "memory: draft dropped (300.0 MiB free in ram" in reason
        assert health["status"] == "degraded" and any(
            "draft dropped" in r for r in health["reasons"]
        )
        stats = served()  # the target answers on, and the answer says why it is slower
        assert "memory: draft dropped" in str(stats["reason"]) and stats["drafter"] != "model"
        watch = d.get("/homespec/status").json()["pairs"][0]["memory_watch"]
        assert watch["draft_dropped"] and watch["drops"] == 1
        assert metric("homespec_draft_dropped_for_memory") == 1.0
        assert "draft dropped" in d.log()
        free.write_text(str(8 * GiB))
        # Back after the pair's queue is quiet and through the daemon's gate (settling.py).
        wait_until(d, lambda h: h["pairs"]["smollm2"]["mode"] == "speculative")
        assert served()["drafter"] == "model"
        assert metric("homespec_draft_dropped_for_memory") == 0.0
        assert metric("homespec_memory_draft_drops") == 1.0
        assert d.get("/health").json()["status"] == "ready"
    finally:
        d.stop()
