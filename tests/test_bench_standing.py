"""Where auto stands per task: the ratios under the bench's table (pure, synthetic rows)."""

from __future__ import annotations

import pytest

from homespec.bench import Row, choose_modes
from homespec.bench_standing import render_standings, standings


def row(task: str, mode: str, tps: float, *, server: bool = False) -> Row:
    return Row(
        task, mode, 2, tps, 1000.0, 50.0, None, None, None, None, None, None, other_server=server
    )


def test_auto_is_held_against_plain_the_fastest_forced_mode_and_the_fastest_other_server() -> None:
    rows = [
        row("code", "plain", 80.0),
        row("code", "model", 70.0),
        row("code", "ngram", 150.0),
        row("code", "hybrid", 120.0),
        row("code", "auto", 165.0),
        row("code", "llama-ngram-mod", 140.0, server=True),
        row("code", "llama-plain", 75.0, server=True),
        row("code", "homespec-daemon", 170.0),  # homespec itself, through HTTP: not held against
    ]
    [s] = standings(rows)
    assert s.task == "code"
    assert s.vs_plain == pytest.approx(165 / 80)
    assert (s.forced, s.vs_forced) == ("ngram", pytest.approx(165 / 150))
    assert (s.other, s.vs_other) == ("llama-ngram-mod", pytest.approx(165 / 140))
    text = render_standings([s])
    assert "1.10× (ngram)" in text and "1.18× (llama-ngram-mod)" in text and "2.06×" in text


def test_without_other_servers_the_table_has_no_column_for_them() -> None:
    rows = [row("short", "plain", 70.0), row("short", "ngram", 72.0), row("short", "auto", 69.3)]
    [s] = standings(rows)
    assert s.other is None and s.vs_other is None
    assert s.vs_forced == pytest.approx(69.3 / 72)
    text = render_standings([s])
    assert "other server" not in text
    assert "0.96× (ngram)" in text and "0.99×" in text


def test_a_task_without_auto_or_without_anything_to_hold_it_against_has_no_standing() -> None:
    rows = [
        row("a", "plain", 70.0),
        row("a", "ngram", 90.0),  # auto did not run
        row("b", "auto", 90.0),  # nothing else did
    ]
    assert standings(rows) == []
    assert render_standings([]) == ""


def test_the_json_names_what_auto_was_held_against() -> None:
    rows = [row("x", "plain", 50.0), row("x", "auto", 100.0), row("x", "other", 80.0, server=True)]
    d = standings(rows)[0].to_dict()
    assert d == {
        "task": "x",
        "vs_plain": 2.0,
        "vs_best_forced": None,
        "best_forced": None,
        "vs_best_other": 1.25,
        "best_other": "other",
    }


@pytest.mark.parametrize(
    ("asked", "runs"),
    [
        (None, ["plain", "auto", "model", "ngram", "hybrid"]),
        ("ngram", ["plain", "ngram"]),
        ("auto, plain", ["auto", "plain"]),
        ("plain,plain,auto,auto", ["plain", "auto"]),
        ("ngram,,ngram", ["plain", "ngram"]),
    ],
)
def test_the_modes_asked_for_run_once_each_with_plain_always_among_them(
    asked: str | None, runs: list[str]
) -> None:
    assert choose_modes(asked, has_draft=True, pair="p") == runs
