"""How long answers run: the answer tokens still expected at a step (the governor's `horizon`),
over which a draft model's catch-up on the prompt is spread (governor.best_k).

A catch-up is paid once and up front; it pays back over the rest of the answer. So what the
governor needs is not a task's typical length but how much more an answer that has already run
`generated` tokens is likely to run: the mean of what the task's recent answers ran past that
point, among those that got that far (their mean residual length). A typical length less what
is generated says an answer past it has nothing more to come, where answer lengths are long-
tailed and one that has run long tends to run longer.

A past answer is read as this one's by its share of the room it had: one that used 78% of
its max_tokens is read as this one using 78% of its own. Where clients size max_tokens to the
answer they expect, that tells a JSON object asked with 200 tokens from a chat reply asked with
96 in the table that task-less requests share (read by length, the chat replies before it had a
181-token JSON answer expected at 45 more tokens at its 8th, and the draft model that drafted
it at 1.4x plain was never caught up on its prompt: 1.04x plain, 1.38x read by share, in fixed-
cost replay). Where clients send one max_tokens for all, or none (the daemon's default), every
room is the same and a share is a length. An answer that ran out of room is read as running
out of this one's: it would have run longer.

Pure: no clock, no llama.cpp. Kept across restarts with the acceptance tables
(engine/learned.py, through learned.state).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from homespec.engine.estimates import MAX_TASKS, keep_recent

SAMPLES = 16  # recent answers kept per task
# A task never seen reads the answers of the tasks used most recently, this many or a few more
# (whole tasks): the governor reads them at every step it is asked, and all of them, up to
# MAX_TASKS x SAMPLES, took 0.17 ms a reading on the 2-core box (0.012 ms for these).
POOLED = 4 * SAMPLES
MAX_ANSWER = 1 << 20  # tokens; a restored length beyond it is damage, not a length


@dataclass(frozen=True)
class Answer:
    """One finished answer: its length, the room it had at its start (max_tokens within the
    context; 0: not known, as in a file from before rooms were kept) and whether it ran out
    of room (`cut`: it would have run longer)."""

    tokens: int
    room: int
    cut: bool

    def as_this(self, room: int) -> float:
        """This answer's length read as one with `room` tokens of room: the same share of it
        (all of it, where this one was cut), or its length where its room is not known."""
        if self.room > 0:
            share = 1.0 if self.cut else self.tokens / self.room
            return share * room
        return float(min(self.tokens, room))


@dataclass
class Lengths:
    """Recent answers by task (None: requests that name none)."""

    answers: dict[str | None, list[Answer]] = field(default_factory=dict)

    def observe(self, task: str | None, tokens: int, room: int, *, cut: bool) -> None:
        """A finished answer of `tokens`, which had `room` tokens of room at its start: it
        joins the task's recent ones, the oldest beyond SAMPLES going."""
        if tokens <= 0:
            return
        past = self.answers.get(task, [])
        keep_recent(self.answers, task, [*past, Answer(tokens, max(0, room), cut)][-SAMPLES:])

    def known(self, task: str | None) -> bool:
        """Whether the task has answers of its own."""
        return bool(self.answers.get(task))

    def residual(self, task: str | None, generated: int, room: int) -> float | None:
        """Answer tokens still expected after `generated`, in an answer with `room` tokens of
        room at its start: the mean of how far the task's recent answers, read as this one's,
        ran past `generated`, among those that did (0 where none did). A task with none is
        read from the recent answers of the tasks used last (POOLED); None: the pair has seen
        no answer."""
        past = self.answers.get(task) or self._pooled()
        if not past:
            return None
        ahead = [n for n in (a.as_this(room) - generated for a in past) if n > 0]
        return sum(ahead) / len(ahead) if ahead else 0.0

    def _pooled(self) -> list[Answer]:
        """The recent answers of the tasks used most recently (POOLED or a few more), oldest
        task first."""
        recent: list[list[Answer]] = []
        count = 0
        for rows in reversed(self.answers.values()):
            recent.append(rows)
            count += len(rows)
            if count >= POOLED:
                break
        return [a for rows in reversed(recent) for a in rows]

    def state(self) -> dict[str, Any]:
        """As JSON-able data (learned.state)."""
        return {
            "" if task is None else task: [[a.tokens, a.room, a.cut] for a in answers]
            for task, answers in self.answers.items()
        }

    def restore(self, state: Any, typical: Any = None) -> None:
        """Take back what `state` gave (a task this process already saw wins; anything
        malformed is skipped, never trusted). `typical`: a file's older form, a typical
        length by task, restored as one answer of that length whose room is not known."""
        rows: dict[str, Any] = {}
        if isinstance(typical, dict):
            rows.update({k: [[v, 0, False]] for k, v in typical.items()})
        if isinstance(state, dict):
            rows.update(state)
        for name, raw in rows.items():
            task = name or None
            if task in self.answers or len(self.answers) >= MAX_TASKS:
                continue
            answers = [a for a in map(_answer, raw if isinstance(raw, list) else []) if a]
            if answers:
                self.answers[task] = answers[-SAMPLES:]


def _answer(raw: Any) -> Answer | None:
    """One stored answer, or None where it is not a plausible one."""
    if not isinstance(raw, list) or len(raw) != 3:
        return None
    tokens, room, cut = raw
    numbers = (tokens, room)
    if any(isinstance(n, bool) or not isinstance(n, int | float) for n in numbers):
        return None
    if not isinstance(cut, bool) or not 0 < tokens <= MAX_ANSWER or not 0 <= room <= MAX_ANSWER:
        return None
    return Answer(int(tokens), int(room), cut)
