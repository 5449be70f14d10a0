"""What the daemon does when a pair's engine process dies: a pure decision with its reason.

- A fault (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) while the draft model was loading or
  drafting is the draft's: the pair restarts one rung down, without the draft (n-gram drafting
  stays, it runs no model code).
- Anything else (a fault in the target, SIGKILL from the out-of-memory killer or a person, an
  exit with an error code) restarts the pair as it was.
- `limit` deaths within `window_s` seconds end it: the pair is `failed`, with the reason, and
  the daemon's other pairs keep serving.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from homespec.engine.crashsite import Site
from homespec.engine.repack import signal_name

FAULTS = frozenset({"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT"})


@dataclass(frozen=True)
class EngineDeath:
    at: float  # monotonic seconds
    returncode: int  # negative: killed by that signal
    site: Site  # what native work the engine had marked when it died

    @property
    def signal(self) -> str:
        return signal_name(self.returncode)


@dataclass(frozen=True)
class Recovery:
    restart: bool
    without_draft: bool
    reason: str  # what happened and what was done: /health, status, logs, later responses


def describe(death: EngineDeath, draft_file: str | None) -> str:
    """e.g. `engine crashed (SIGSEGV) while drafting with smollm2-135m-q4_1.gguf`."""
    if death.returncode == -signal.SIGKILL:
        what = "engine killed (SIGKILL: out of memory, or by hand)"
    elif death.returncode < 0:
        what = f"engine crashed ({death.signal})"
    else:
        what = f"engine exited unexpectedly ({death.signal})"
    where = death.site.label
    if draft_file and death.site == Site.DRAFT:
        where = f"drafting with {draft_file}"
    elif draft_file and death.site == Site.LOAD_DRAFT:
        where = f"loading the draft {draft_file}"
    return f"{what} while {where}"


def recover(
    deaths: list[EngineDeath],
    *,
    draft_file: str | None,
    draft_dropped: bool,
    limit: int,
    window_s: float,
) -> Recovery:
    """`deaths`: the pair's engine deaths so far, oldest first, the new one last."""
    last = deaths[-1]
    what = describe(last, draft_file)
    recent = sum(1 for d in deaths if last.at - d.at <= window_s)
    if recent >= limit:
        return Recovery(
            False,
            draft_dropped,
            f"{what}; {recent} engine deaths within {window_s:g} s: pair stopped "
            "(see the daemon's log; restart the daemon to try again)",
        )
    if draft_file and not draft_dropped and last.site.draft_path and last.signal in FAULTS:
        return Recovery(True, True, f"{what}; restarted without the draft")
    again = "restarted, still without the draft" if draft_dropped else "restarted as it was"
    return Recovery(True, draft_dropped, f"{what}; {again}")
