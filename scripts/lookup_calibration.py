"""Lookup's drafts as the governor priced them and as they came out: the tally behind
`scripts/governor_replay.py --calibration` (pure; the replay feeds it one draft at a time)."""

from __future__ import annotations

from collections import defaultdict

SPEEDUP_EDGES = (1.0, 1.05, 1.1, 1.2, 1.5, 2.0, 3.0)


class LookupCalibration:
    """Lookup's drafts, each as the governor priced it and as it came out (see --calibration)."""

    def __init__(self) -> None:
        # (position 1-4, the estimate's tenth) -> [drafts, sum of estimates, kept]
        self.by_estimate: defaultdict[tuple[int, int], list[float]] = defaultdict(
            lambda: [0, 0.0, 0]
        )
        # (where the match was found, bucket) -> [drafts, sum of position-1 estimates, kept
        # at position 1, step ms, ms that plain steps would have taken for its tokens]
        self.by_kind: defaultdict[tuple[str, int], list[float]] = defaultdict(
            lambda: [0, 0.0, 0, 0.0, 0.0]
        )
        # the step's estimated speedup over plain, binned -> [drafts, sum of estimates, step ms,
        # ms that plain steps would have taken for its tokens]: do the marginal bets pay?
        self.by_speedup: defaultdict[float, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])

    def record(
        self,
        kind: str,
        bucket: int,
        estimates: list[float],
        proposed: int,
        kept: int,
        step_ms: float,
        plain: float,
        speedup: float,
    ) -> None:
        for i, est in enumerate(estimates[:proposed]):
            if i > kept:  # a position after the first rejected one was not tried
                break
            row = self.by_estimate[(i + 1, round(est * 10))]
            row[0] += 1
            row[1] += est
            row[2] += i < kept
        row = self.by_kind[(kind, bucket)]
        row[0] += 1
        row[1] += estimates[0]
        row[2] += kept > 0
        row[3] += step_ms
        row[4] += (kept + 1) * plain
        edge = max((e for e in SPEEDUP_EDGES if e <= speedup), default=0.0)
        row = self.by_speedup[edge]
        row[0] += 1
        row[1] += speedup
        row[2] += step_ms
        row[3] += (kept + 1) * plain

    def render(self) -> str:
        out = ["lookup drafts past an answer's first step: position, estimate -> kept"]
        for (pos, tenth), (n, est, hit) in sorted(self.by_estimate.items()):
            out.append(
                f"  pos {pos} est ~{tenth / 10:.1f}: {int(n):5d} drafts, est {est / n:.2f}"
                f" kept {hit / n:.2f}"
            )
        out.append("by where the match was found and its bucket (position 1; gain over plain)")
        total = 0.0
        for (kind, bucket), (n, est, hit, ms, plain) in sorted(self.by_kind.items()):
            total += plain - ms
            out.append(
                f"  {kind:10s} {bucket:2d}: {int(n):5d} drafts, est {est / n:.2f} kept"
                f" {hit / n:.2f}, gained {(plain - ms) / 1000:+8.2f} s"
            )
        out.append(f"  all drafts gained {total / 1000:+.2f} s over plain steps")
        out.append(
            "by the step's estimated speedup over plain (realized: plain's ms for its tokens / ms)"
        )
        for edge, (n, est, ms, plain) in sorted(self.by_speedup.items()):
            out.append(
                f"  est >= {edge:4.2f}: {int(n):5d} drafts, est {est / n:.2f}x, realized"
                f" {plain / ms:.2f}x, gained {(plain - ms) / 1000:+8.2f} s"
            )
        return "\n".join(out)


def conditional_rates(estimates: list[float]) -> list[float]:
    """Position i's chance of being kept given i-1 were, from expected tokens by length."""
    rates: list[float] = []
    survive, before = 1.0, 1.0
    for total in estimates:
        now = total - before
        rates.append(now / survive if survive else 0.0)
        survive, before = now, total
    return rates
