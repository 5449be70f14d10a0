"""The client's guess at the answer (OpenAI's Predicted Outputs), for n-gram lookup to draft from.

A client that knows most of an answer already (a file to return with a few lines changed, a
document to reformat, a reply regenerated after a small edit) sends it as `prediction`, and
homespec drafts from it as it drafts from the prompt: the answer's last tokens are looked up in
the prediction and what follows them there is proposed, so the target verifies a long run of
it in one decode; where the answer departs from it (a changed line), lookup finds its place
again a few tokens after the change. The target verifies every drafted token: a prediction
changes how fast the answer comes, never what it says, and a wrong one costs only the verify
steps it fails, which the governor prices from how predictions fared before (by task and
agreement length, in tables of their own: a client's guess is not the prompt's echo).

The prediction is aligned with the answer's start: an anchor before both makes an answer that
begins as the prediction does a match from its first token, and agreement counts back to the
anchor, so an answer that has followed the prediction from the start is priced as the long
match it is, and agrees one token longer than the prompt or the memory can: an answer that
repeats itself (a list, a refrain) had the prompt's place taken on a tie once 32 tokens in,
which proposed what followed the last repeat where the prediction knew what came next (45
of 80 tokens drafted from a prediction that was the answer). Where an n-gram occurs often in
the prediction (indentation, a repeated line),
the places nearest where the answer would be by now (where it was last found, moved on by the
tokens it has grown since) are tried: an answer goes through its prediction forwards.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

ANCHOR = -2  # before the prediction, and standing before the answer: both begin there


class Prediction:
    CANDIDATES = 4  # places tried per lookup, from where the answer was last found on
    MAX_MATCH = 32  # how far back agreement is measured (NgramDrafter's)

    def __init__(self, tokens: Sequence[int], answer_start: int, *, n_min: int = 2, n_max: int = 4):
        """`tokens`: the prediction, tokenized as answer text; `answer_start`: where the
        answer begins in the histories that `propose` will be given (the prompt's length)."""
        if n_min < 1 or n_max < n_min:
            raise ValueError("need 1 <= n_min <= n_max")
        self.tokens = [ANCHOR, *tokens]
        self.answer_start = answer_start
        self.n_min, self.n_max = n_min, n_max
        # Where in `tokens` the answer's end was last found, and the answer's length then
        self.cursor, self._then = 0, 0
        self._aligned = 0  # the answer's first tokens known to be the prediction's first
        self._index: dict[tuple[int, ...], list[int]] = {}  # n-gram -> places after it, ascending
        seq = self.tokens
        for n in range(n_min, n_max + 1):
            for follow in range(n, len(seq)):
                self._index.setdefault(tuple(seq[follow - n : follow]), []).append(follow)

    def __len__(self) -> int:
        """The prediction's tokens (the anchor not counted)."""
        return len(self.tokens) - 1

    def _view(self, history: Sequence[int], i: int) -> int:
        """Token i of the answer as lookup sees it: the anchor, then the answer."""
        return ANCHOR if i == 0 else history[self.answer_start + i - 1]

    def _agreement(self, history: Sequence[int], follow: int, n: int) -> int:
        """How many tokens before `follow` in the prediction equal the answer's last ones (n or
        more, the n-gram found), up to MAX_MATCH; the anchor agrees only with the anchor."""
        end, seq, length = len(history) - self.answer_start + 1, self.tokens, n
        while length < self.MAX_MATCH and follow - length > 0 and end - length > 0:
            if seq[follow - length - 1] != self._view(history, end - length - 1):
                break
            length += 1
        return length

    def _follow_prefix(self, history: Sequence[int]) -> int:
        """How many of the answer's first tokens are the prediction's first (kept from call
        to call: only the tokens since the last are compared)."""
        end = min(len(history) - self.answer_start, len(self))
        while self._aligned < end:
            if history[self.answer_start + self._aligned] != self.tokens[self._aligned + 1]:
                break
            self._aligned += 1
        return self._aligned

    def propose(self, history: Sequence[int], k: int) -> tuple[list[int], int]:
        """Up to k tokens of the prediction to follow `history` (the prompt and the answer so
        far), and their agreement length; ([], 0) where the answer's end is not found in it."""
        size = len(history) - self.answer_start + 1  # the view: anchor + answer
        aligned = self._follow_prefix(history)
        if aligned == size - 1 and aligned < len(self):  # the answer so far began as it does
            self.cursor, self._then = aligned + 1, size
            return self.tokens[aligned + 1 : aligned + 1 + k], min(aligned, self.MAX_MATCH) + 1
        expect = self.cursor + size - self._then  # where the answer's end would be by now
        for n in range(min(self.n_max, size), self.n_min - 1, -1):
            key = tuple(self._view(history, i) for i in range(size - n, size))
            places = self._index.get(key)
            if not places:
                continue
            at = bisect.bisect_left(places, expect)
            tried = places[max(0, at - 1) : at + self.CANDIDATES]
            # Longest agreement first; among equals, the place nearest where the answer would be
            # (of two as near, the earlier)
            agree, _, follow = max(
                (self._agreement(history, f, n), -abs(f - expect), -f) for f in tried
            )
            follow = -follow
            self.cursor, self._then = follow, size
            out = self.tokens[follow : follow + k]
            return (out, agree) if out else ([], 0)
        return [], 0
