"""Where `auto` stands on each task of a bench run: against plain decoding, against the best
mode forced by hand, and against the best other server (`--against`).

`auto` is the governor's promise (README, "The governor"): never meaningfully slower than plain
decoding, about as fast as the best drafter forced by hand for the task, and ahead of the other
servers. These are the ratios a reader would otherwise work out from the table by hand; each is
one tok/s over another from the same run, never across runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from homespec.vocab import DRAFTERS

if TYPE_CHECKING:
    from homespec.bench import Row


@dataclass(frozen=True)
class Standing:
    task: str
    vs_plain: float | None  # auto's tok/s over plain's (None: plain did not run)
    vs_forced: float | None  # over the fastest forced mode's
    forced: str | None  # which mode that was
    vs_other: float | None  # over the fastest other server's
    other: str | None

    def to_dict(self) -> dict[str, Any]:
        r = _round
        return {
            "task": self.task,
            "vs_plain": r(self.vs_plain),
            "vs_best_forced": r(self.vs_forced),
            "best_forced": self.forced,
            "vs_best_other": r(self.vs_other),
            "best_other": self.other,
        }


def standings(rows: list[Row]) -> list[Standing]:
    """One Standing per task that ran `auto` and something to hold it against, in the table's
    order. A homespec daemon benched with --against (scripts/llama_server_compare.sh puts one
    beside llama-server) is homespec, not another server: it is not held against."""
    by_task: dict[str, list[Row]] = {}
    for row in rows:
        by_task.setdefault(row.task, []).append(row)
    out = []
    for task, group in by_task.items():
        auto = next((r for r in group if r.mode == "auto"), None)
        if auto is None or auto.tokens_per_s <= 0:
            continue
        plain = next((r for r in group if r.mode == "plain"), None)
        forced = _fastest(r for r in group if r.mode in DRAFTERS)
        other = _fastest(r for r in group if r.other_server)
        if plain is None and forced is None and other is None:
            continue
        out.append(
            Standing(
                task,
                _ratio(auto, plain),
                _ratio(auto, forced),
                forced.mode if forced else None,
                _ratio(auto, other),
                other.mode if other else None,
            )
        )
    return out


def render_standings(rows: list[Standing]) -> str:
    """The standings as a small table under the bench's, or "" when there are none."""
    if not rows:
        return ""
    others = any(s.other for s in rows)
    head = f"{'auto against':<12} {'plain':>6}  {'best forced mode':<18}"
    if others:
        head += f"  {'best other server':<24}"
    lines = [head.rstrip(), "-" * len(head.rstrip())]
    for s in rows:
        line = f"{s.task:<12} {_x(s.vs_plain):>6}  {_named(s.vs_forced, s.forced):<18}"
        if others:
            line += f"  {_named(s.vs_other, s.other):<24}"
        lines.append(line.rstrip())
    return "\n".join(lines)


def _fastest(rows: Iterable[Row]) -> Row | None:
    return max(rows, key=lambda r: r.tokens_per_s, default=None)


def _ratio(auto: Row, other: Row | None) -> float | None:
    if other is None or other.tokens_per_s <= 0:
        return None
    return auto.tokens_per_s / other.tokens_per_s


def _x(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def _named(value: float | None, mode: str | None) -> str:
    return "—" if value is None else f"{value:.2f}× ({mode})"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
