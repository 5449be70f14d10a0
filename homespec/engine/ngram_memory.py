"""What earlier requests said, for n-gram lookup across requests.

Prompt lookup only sees the request at hand. Much of what a homelab box is asked repeats
across requests: the same file edited again, the same unit file or JSON shape, an answer
quoted back in the next turn. The memory keeps the last `capacity` tokens of earlier prompts
and answers (oldest forgotten first) and indexes them by their n-grams, so the n-gram drafter
can propose what followed the same context last time, whichever request it was in.
(llama.cpp's `ngram-mod` keeps a hashed table of 24-grams for the same reason.)

It only ever proposes: the target verifies every drafted token, so a remembered continuation
changes how fast an answer comes, never what it says.
"""

from __future__ import annotations

from collections.abc import Sequence

SEP = -1  # between sequences: no n-gram and no agreement crosses it


def since_boundary(seq: Sequence[int], limit: int, boundaries: frozenset[int]) -> int:
    """How many of `seq`'s last tokens come after its last boundary token, looking back at
    most `limit` (`limit` when none is there): the most any agreement with its end may count.
    The same for every candidate place, so a lookup finds it once."""
    if boundaries:
        n = min(limit, len(seq))
        if boundaries.isdisjoint(seq[len(seq) - n :]):  # an answer's usual step: one C loop
            return limit
        for i in range(1, n + 1):
            if seq[-i] in boundaries:
                return i - 1
    return limit


def contested(next_tokens: Sequence[int], token: int) -> bool:
    """Whether at most half of the places an n-gram was seen at went on with `token` (the
    tokens that followed each: `next_tokens`): a proposal from such a match is the next token
    far less often than one all or most of them agree on (estimates.CONTESTED_PRIORS)."""
    return 2 * sum(1 for t in next_tokens if t == token) <= len(next_tokens)


class NgramMemory:
    CANDIDATES = 4  # places kept per n-gram
    MAX_MATCH = 32  # how far back agreement is measured

    def __init__(self, capacity: int, *, n: int = 4, boundaries: frozenset[int] = frozenset()):
        """`boundaries`: tokens agreement is not measured across (see NgramDrafter)."""
        if capacity < 1 or n < 1:
            raise ValueError("capacity and n must be positive")
        self.capacity = capacity
        self.n = n
        self.boundaries = boundaries
        self._corpus: list[int] = []
        self._index: dict[tuple[int, ...], list[int]] = {}

    def __len__(self) -> int:
        """Tokens remembered (separators not counted)."""
        return len(self._corpus) - self._corpus.count(SEP)

    def clear(self) -> None:
        self._corpus.clear()
        self._index.clear()

    def add(self, tokens: Sequence[int]) -> None:
        """Remember one finished request (its prompt and answer); forget the oldest when full."""
        tokens = list(tokens[-self.capacity :])
        if len(tokens) <= self.n:
            return
        if len(self._corpus) + len(tokens) + 1 > self.capacity:
            self._forget(len(tokens) + 1)
        start = len(self._corpus)
        self._corpus += tokens
        self._corpus.append(SEP)
        self._index_range(start, start + len(tokens))

    def _forget(self, room: int) -> None:
        """Drop whole sequences from the front until `room` fits with half the capacity free
        (so re-indexing, which this costs, happens once per capacity/2 tokens, not per add)."""
        keep_from, limit = 0, min(self.capacity, max(room, self.capacity // 2))
        while keep_from < len(self._corpus) and len(self._corpus) - keep_from + room > limit:
            keep_from = self._corpus.index(SEP, keep_from) + 1
        del self._corpus[:keep_from]
        self._index.clear()
        end = 0
        while end < len(self._corpus):
            stop = self._corpus.index(SEP, end)
            self._index_range(end, stop)
            end = stop + 1

    def _index_range(self, start: int, end: int) -> None:
        n, corpus, index = self.n, self._corpus, self._index
        for follow in range(start + n, end):
            places = index.setdefault(tuple(corpus[follow - n : follow]), [])
            places.append(follow)
            if len(places) > self.CANDIDATES:
                del places[0]

    def knows(self, ngram: tuple[int, ...]) -> bool:
        """Whether these n tokens were remembered followed by another."""
        return ngram in self._index

    def lookup(self, history: Sequence[int], cap: int | None = None) -> tuple[int, int] | None:
        """(agreement length, place) of the remembered context that agrees longest with the
        end of `history`; None when its last n-gram was never seen. Agreement counts at most
        `cap` tokens (default: back to the last boundary token)."""
        if len(history) < self.n:
            return None
        places = self._index.get(tuple(history[-self.n :]))
        if not places:
            return None
        if cap is None:
            cap = since_boundary(history, self.MAX_MATCH, self.boundaries)
        return max((self._agreement(history, f, cap), f) for f in places)

    def contested(self, history: Sequence[int], place: int) -> bool:
        """Whether `lookup`'s `place` for `history` is contested (module's `contested`)."""
        places = self._index.get(tuple(history[-self.n :]), [])
        return contested([self._corpus[f] for f in places], self._corpus[place])

    def _agreement(self, history: Sequence[int], follow: int, cap: int) -> int:
        """How many tokens before `follow` equal `history`'s last ones, up to `cap`; but
        MAX_MATCH where they agree for that long whatever `cap` is, or where they agree all the
        way back to where both begin: the same conversation again (a retry, a regenerated
        answer, a client asking what it asked before), whose answer went on as the remembered
        one did.

        Capped at the answer's start instead, every answer to a repeated question began as a
        1-token match, and the answers of a daemon sent "Say hello." between other prompts
        taught 1- and 2-token matches that they are kept 61% of the time at position 1 and
        75–86% beyond: an extraction answer then drafted 8 tokens on 2-token matches that
        failed step after step (1.10× plain at fixed costs, 1.22× without the greetings), and
        short answers drafted from other answers' openings (0.88× plain)."""
        corpus, end, length = self._corpus, len(history), self.n
        while length < self.MAX_MATCH and follow - length > 0 and end - length > 0:
            if corpus[follow - length - 1] != history[end - length - 1]:
                break  # a separator never equals a token
            length += 1
        began = follow - length == 0 or corpus[follow - length - 1] == SEP
        if length >= self.MAX_MATCH or (end - length == 0 and began):
            return self.MAX_MATCH
        return min(length, cap)

    def continuation(self, place: int, k: int) -> list[int]:
        """Up to k tokens remembered from `place` on, stopping at the end of their request."""
        out = self._corpus[place : place + k]
        return out[: out.index(SEP)] if SEP in out else out
