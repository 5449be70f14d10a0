"""The daemon's decision after an engine death (pure): restart, drop the draft, or give up."""

from __future__ import annotations

import signal

from homespec.daemon.crashes import EngineDeath, describe, recover
from homespec.engine.crashsite import Site

SEGV, KILL, ABRT = -signal.SIGSEGV, -signal.SIGKILL, -signal.SIGABRT


def deaths(*spec: tuple[float, int, Site]) -> list[EngineDeath]:
    return [EngineDeath(at, code, site) for at, code, site in spec]


def test_a_fault_while_drafting_drops_the_draft_and_says_so() -> None:
    r = recover(
        deaths((0, SEGV, Site.DRAFT)), draft_file="d-q4", draft_dropped=False, limit=3, window_s=600
    )
    assert (r.restart, r.without_draft) == (True, True)
    assert (
        r.reason == "engine crashed (SIGSEGV) while drafting with d-q4; restarted without the draft"
    )


def test_an_abort_while_loading_the_draft_drops_it_too() -> None:
    r = recover(
        deaths((0, ABRT, Site.LOAD_DRAFT)),
        draft_file="d",
        draft_dropped=False,
        limit=3,
        window_s=600,
    )
    assert r.without_draft and "crashed (SIGABRT) while loading the draft d" in r.reason


def test_a_fault_in_the_target_restarts_as_it_was() -> None:
    r = recover(
        deaths((0, SEGV, Site.TARGET)), draft_file="d", draft_dropped=False, limit=3, window_s=600
    )
    assert (r.restart, r.without_draft) == (True, False)
    assert r.reason.endswith("while decoding with the target; restarted as it was")


def test_sigkill_while_drafting_is_not_blamed_on_the_draft() -> None:
    """The OOM killer or a person, not a bug in the draft's code: keep the pair as declared."""
    r = recover(
        deaths((0, KILL, Site.DRAFT)), draft_file="d", draft_dropped=False, limit=3, window_s=600
    )
    assert not r.without_draft
    assert r.reason.startswith("engine killed (SIGKILL: out of memory, or by hand)")


def test_a_dropped_draft_stays_dropped_across_later_restarts() -> None:
    r = recover(
        deaths((0, SEGV, Site.DRAFT), (10, KILL, Site.IDLE)),
        draft_file="d",
        draft_dropped=True,
        limit=3,
        window_s=600,
    )
    assert r.restart and r.without_draft and r.reason.endswith("still without the draft")


def test_limit_deaths_in_the_window_fail_the_pair_older_ones_do_not_count() -> None:
    within = deaths((0, SEGV, Site.TARGET), (100, SEGV, Site.TARGET), (200, SEGV, Site.TARGET))
    r = recover(within, draft_file=None, draft_dropped=False, limit=3, window_s=600)
    assert not r.restart and "3 engine deaths within 600 s: pair stopped" in r.reason
    spread = deaths((0, SEGV, Site.TARGET), (700, SEGV, Site.TARGET), (1400, SEGV, Site.TARGET))
    assert recover(spread, draft_file=None, draft_dropped=False, limit=3, window_s=600).restart


def test_a_pair_without_a_draft_model_never_drops_one() -> None:
    r = recover(
        deaths((0, SEGV, Site.DRAFT)), draft_file=None, draft_dropped=False, limit=3, window_s=600
    )
    assert r.restart and not r.without_draft


def test_an_exit_code_reads_as_such() -> None:
    assert describe(EngineDeath(0, 1, Site.IDLE), None) == (
        "engine exited unexpectedly (exit 1) while outside llama.cpp"
    )
