"""The request log: one JSON line per request in `requests.jsonl`, and `homespec report` over it.

Each line is written with a single `write(2)` on a file opened with O_APPEND, so a `kill -9`
leaves whole lines only: the kernel either appended the line or did not. A short write (disk
full) is truncated back off. Readers still skip a line that does not parse, and count it.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

LOG_NAME = "requests.jsonl"
# A pair's acceptance "dropped" when the window is this far below its own history.
DROP_POINTS = 0.15
MIN_HISTORY, MIN_WINDOW = 20, 5


class RequestLog:
    """Appends records to `path`; safe to call from several threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def check(self) -> None:
        """Open the log for appending, as every request will (the daemon does this at start:
        a log it cannot write is an error then, not a silent loss later)."""
        os.close(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640))

    def append(self, record: dict[str, Any]) -> None:
        text = json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=str)
        # A lone surrogate from a client's JSON ("\ud800") has no UTF-8 form: written as the
        # same JSON escape, so the line stays valid JSON and says what was sent.
        line = (text + "\n").encode("utf-8", "backslashreplace")
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            try:
                size = os.fstat(fd).st_size
                written = os.write(fd, line)
                if written != len(line):
                    os.ftruncate(fd, size)
                    raise OSError(f"short write to {self.path} ({written} of {len(line)} bytes)")
            finally:
                os.close(fd)


class _Record(BaseModel):
    """The fields `report` reads, typed: a line whose values are not (edited by hand, or from
    another program) is unreadable and counted, where `"time": "nope"` was a traceback."""

    model_config = ConfigDict(extra="allow")
    time: float = 0.0
    pair: str | None = None
    task: str | None = None
    outcome: str | None = None
    mode: str | None = None
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    queue_ms: float | None = None
    tokens_per_s: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    proposed_tokens: int | None = None
    accepted_tokens: int | None = None
    prediction_tokens: int | None = None
    accepted_prediction_tokens: int | None = None


def _readable(rec: dict[str, Any]) -> bool:
    try:
        _Record.model_validate(rec)
    except ValidationError:
        return False
    return True


def read(path: Path) -> tuple[list[dict[str, Any]], int]:
    """(records, number of unreadable lines). A missing log is empty."""
    records, bad = [], 0
    try:
        with path.open("rb") as fh:
            for raw in fh:
                try:
                    rec = json.loads(raw)
                except ValueError:
                    bad += 1
                    continue
                if isinstance(rec, dict) and raw.endswith(b"\n") and _readable(rec):
                    records.append(rec)
                else:
                    bad += 1
    except FileNotFoundError:
        pass
    return records, bad


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str) -> float:
    """'90s', '15m', '1h', '2d', '1w' → seconds; ValueError with a usable message."""
    m = _DURATION.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a duration (write e.g. 15m, 1h, 2d)")
    return float(m.group(1)) * _SECONDS[m.group(2)]


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


@dataclass(frozen=True)
class ReportRow:
    key: str
    requests: int
    errors: int
    ttft_p50: float | None
    ttft_p95: float | None
    e2e_p50: float | None
    e2e_p95: float | None
    queue_p95: float | None  # waiting for the engine, in the ttft and e2e above
    tokens_per_s: float | None
    accept_rate: float | None
    speculative_share: float
    cached_share: float | None = None  # of the prompt tokens, those a cache held
    # of the answer tokens of requests that sent a prediction, those drafted from it and kept
    predicted_share: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _row(key: str, recs: list[dict[str, Any]]) -> ReportRow:
    ok = [r for r in recs if r.get("outcome") == "ok"]
    ttft = [float(r["ttft_ms"]) for r in ok if r.get("ttft_ms") is not None]
    e2e = [float(r["e2e_ms"]) for r in ok if r.get("e2e_ms") is not None]
    queue = [float(r.get("queue_ms") or 0.0) for r in ok]  # none in logs older than the field
    tps = [float(r["tokens_per_s"]) for r in ok if r.get("tokens_per_s")]
    proposed = sum(int(r.get("proposed_tokens") or 0) for r in ok)
    accepted = sum(int(r.get("accepted_tokens") or 0) for r in ok)
    spec = sum(1 for r in ok if r.get("mode") == "speculative")
    prompt = sum(int(r.get("prompt_tokens") or 0) for r in ok)
    cached = sum(int(r.get("cached_tokens") or 0) for r in ok)  # none in older logs
    guessed = [r for r in ok if r.get("prediction_tokens")]
    from_guess = sum(int(r.get("accepted_prediction_tokens") or 0) for r in guessed)
    guessed_answers = sum(int(r.get("completion_tokens") or 0) for r in guessed)
    return ReportRow(
        key=key,
        requests=len(recs),
        errors=len(recs) - len(ok),
        ttft_p50=_pct(ttft, 50),
        ttft_p95=_pct(ttft, 95),
        e2e_p50=_pct(e2e, 50),
        e2e_p95=_pct(e2e, 95),
        queue_p95=_pct(queue, 95),
        tokens_per_s=statistics.median(tps) if tps else None,
        accept_rate=accepted / proposed if proposed else None,
        speculative_share=spec / len(ok) if ok else 0.0,
        cached_share=cached / prompt if prompt else None,
        predicted_share=from_guess / guessed_answers if guessed_answers else None,
    )


def _accept(recs: Iterable[dict[str, Any]]) -> tuple[int, float | None]:
    spec = [r for r in recs if r.get("outcome") == "ok" and r.get("proposed_tokens")]
    proposed = sum(int(r["proposed_tokens"]) for r in spec)
    accepted = sum(int(r.get("accepted_tokens") or 0) for r in spec)
    return len(spec), (accepted / proposed if proposed else None)


def report(
    records: list[dict[str, Any]], *, since_s: float | None, by: str, now: float | None = None
) -> tuple[list[ReportRow], list[str]]:
    """Rows grouped `by` ("pair" or "task") for records newer than `since_s`, and warnings
    for pairs whose acceptance in the window dropped against their own earlier history."""
    now = time.time() if now is None else now
    cutoff = now - since_s if since_s is not None else float("-inf")
    window = [r for r in records if float(r.get("time", 0)) >= cutoff]
    history = [r for r in records if float(r.get("time", 0)) < cutoff]
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in window:
        groups.setdefault(str(r.get(by) or "-"), []).append(r)
    rows = [_row(k, v) for k, v in sorted(groups.items())]
    warnings = []
    for pair in sorted({str(r.get("pair")) for r in window}):
        n_hist, hist = _accept(r for r in history if r.get("pair") == pair)
        n_win, win = _accept(r for r in window if r.get("pair") == pair)
        if (
            hist is not None
            and win is not None
            and n_hist >= MIN_HISTORY
            and n_win >= MIN_WINDOW
            and win < hist - DROP_POINTS
        ):
            warnings.append(
                f"pair {pair}: accept rate {win:.0%} over {n_win} speculative requests, down "
                f"from {hist:.0%} over the {n_hist} before: the draft fits this traffic worse "
                "(check the tasks, or turn speculation off for them)"
            )
    return rows, warnings


def render(rows: list[ReportRow], by: str) -> Iterator[str]:
    def ms(v: float | None) -> str:
        return "—" if v is None else f"{v:.0f}"

    yield (
        f"{by:<14} {'reqs':>5} {'err':>4} {'ttft p50':>9} {'p95':>6} {'e2e p50':>8} {'p95':>6} "
        f"{'queue p95':>9} {'tok/s':>6} {'accept':>7} {'spec':>5} {'cached':>6} {'predicted':>9}"
    )
    for r in rows:
        accept = "—" if r.accept_rate is None else f"{r.accept_rate:.0%}"
        tps = "—" if r.tokens_per_s is None else f"{r.tokens_per_s:.1f}"
        cached = "—" if r.cached_share is None else f"{r.cached_share:.0%}"
        predicted = "—" if r.predicted_share is None else f"{r.predicted_share:.0%}"
        yield (
            f"{r.key:<14} {r.requests:>5} {r.errors:>4} {ms(r.ttft_p50):>9} {ms(r.ttft_p95):>6} "
            f"{ms(r.e2e_p50):>8} {ms(r.e2e_p95):>6} {ms(r.queue_p95):>9} {tps:>6} {accept:>7} "
            f"{r.speculative_share:>5.0%} {cached:>6} {predicted:>9}"
        )
