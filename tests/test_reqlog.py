"""The request log and `report`'s arithmetic on hand-written records."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from homespec.reqlog import RequestLog, parse_since, read, render, report

NOW = 1_800_000_000.0


def rec(
    t: float,
    *,
    pair: str = "p",
    task: str = "code",
    proposed: int = 10,
    accepted: int = 9,
    ttft: float = 100,
    e2e: float = 1000,
    mode: str = "speculative",
    outcome: str = "ok",
) -> dict[str, Any]:
    return {
        "time": t,
        "pair": pair,
        "task": task,
        "mode": mode,
        "outcome": outcome,
        "proposed_tokens": proposed,
        "accepted_tokens": accepted,
        "ttft_ms": ttft,
        "e2e_ms": e2e,
        "tokens_per_s": 30.0,
    }


def test_concurrent_appends_are_whole_lines(tmp_path: Path) -> None:
    log = RequestLog(tmp_path / "requests.jsonl")

    def writer(i: int) -> None:
        for j in range(50):
            log.append({"id": i, "n": j, "pad": "x" * 5000})

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records, bad = read(log.path)
    assert bad == 0 and len(records) == 200


def test_reader_skips_a_torn_or_foreign_line(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text(json.dumps(rec(NOW)) + "\nnot json\n" + '{"time": 1, "pair"')
    records, bad = read(path)
    assert len(records) == 1 and bad == 2
    assert read(tmp_path / "missing.jsonl") == ([], 0)


@pytest.mark.parametrize(
    "line",
    ['{"time": "nope"}', '{"time": 1, "outcome": "ok", "ttft_ms": "x"}', '{"pair": 3}', "[1]"],
)
def test_a_line_whose_fields_report_cannot_read_is_skipped_and_counted(
    tmp_path: Path, line: str
) -> None:
    """Edited by hand or written by another program: counted as unreadable, not a traceback
    from `homespec report` (float("nope")), nor a pair named 3."""
    path = tmp_path / "requests.jsonl"
    path.write_text(json.dumps(rec(NOW)) + "\n" + line + "\n")
    records, bad = read(path)
    assert records == [rec(NOW)] and bad == 1
    rows, _ = report(records, since_s=None, by="pair", now=NOW)
    assert [r.key for r in rows] == ["p"]


def test_report_percentiles_accept_rate_and_speculative_share() -> None:
    records = [rec(NOW - i, ttft=100 + i, e2e=1000 + 10 * i) for i in range(20)]
    records += [rec(NOW - 1, mode="plain", proposed=0, accepted=0)]
    records += [rec(NOW - 1, outcome="error")]
    rows, warnings = report(records, since_s=3600, by="pair", now=NOW)
    (row,) = rows
    assert (row.requests, row.errors) == (22, 1)
    assert row.ttft_p50 == pytest.approx(110, abs=1)
    assert row.ttft_p95 is not None and row.ttft_p95 > 115
    assert row.accept_rate == pytest.approx(0.9)
    assert row.speculative_share == pytest.approx(20 / 21)
    assert warnings == []
    assert next(render(rows, "pair")).startswith("pair")


def test_report_shows_how_long_requests_waited_and_reads_logs_from_before_the_field() -> None:
    waited = [rec(NOW - i) | {"queue_ms": 40.0 * i} for i in range(20)]
    (row,), _ = report([*waited, rec(NOW - 1)], since_s=3600, by="pair", now=NOW)
    assert row.queue_p95 is not None and 700 < row.queue_p95 < 800
    header, line = render([row], "pair")
    assert "queue p95" in header and f"{row.queue_p95:.0f}" in line.split()


def test_report_shows_the_share_of_prompt_tokens_a_cache_held() -> None:
    cached = [rec(NOW - i) | {"prompt_tokens": 100, "cached_tokens": 75} for i in range(3)]
    old = rec(NOW - 1) | {"prompt_tokens": 100}  # a log from before the field: none cached
    (row,), _ = report([*cached, old], since_s=3600, by="pair", now=NOW)
    assert row.cached_share == pytest.approx(225 / 400)
    header, line = render([row], "pair")
    assert header.split()[-2] == "cached" and line.split()[-2] == "56%"


def test_report_shows_the_share_of_predicted_answers_drafted_from_their_prediction() -> None:
    guessed = rec(NOW - 1) | {
        "completion_tokens": 80,
        "prediction_tokens": 90,
        "accepted_prediction_tokens": 60,
    }
    unguessed = rec(NOW - 2) | {"completion_tokens": 100}  # sent none: not in the share
    (row,), _ = report([guessed, unguessed], since_s=3600, by="pair", now=NOW)
    assert row.predicted_share == pytest.approx(60 / 80)
    header, line = render([row], "pair")
    assert header.split()[-1] == "predicted" and line.split()[-1] == "75%"
    (row,), _ = report([unguessed], since_s=3600, by="pair", now=NOW)
    assert row.predicted_share is None and list(render([row], "pair"))[1].split()[-1] == "—"


def test_window_and_grouping_by_task() -> None:
    records = [rec(NOW - 10, task="code"), rec(NOW - 20, task="extract"), rec(NOW - 7200)]
    rows, _ = report(records, since_s=parse_since("1h"), by="task", now=NOW)
    assert [(r.key, r.requests) for r in rows] == [("code", 1), ("extract", 1)]


def test_acceptance_drop_against_history_is_warned() -> None:
    history = [rec(NOW - 7200 - i, accepted=9) for i in range(30)]
    window = [rec(NOW - i, accepted=4) for i in range(10)]
    _, warnings = report(history + window, since_s=3600, by="pair", now=NOW)
    (w,) = warnings
    assert "pair p: accept rate 40% over 10 speculative requests, down from 90%" in w
    _, none = report(history + window[:2], since_s=3600, by="pair", now=NOW)
    assert none == []  # too few requests in the window to call it


def test_since_parsing() -> None:
    assert parse_since("90s") == 90 and parse_since("15m") == 900 and parse_since("2d") == 172800
    with pytest.raises(ValueError, match="not a duration"):
        parse_since("yesterday")
