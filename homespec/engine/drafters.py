"""Drafters: who proposes the next k tokens for the target to verify.

- `ModelDrafter`: a small same-vocabulary model with its own KV cache. Its cache follows the
  committed history through `LlamaContext.extend`, so after a verify step it rolls back to the
  accepted prefix instead of re-evaluating the prompt.
- `NgramDrafter`: prompt lookup. Finds the most recent earlier occurrence of the last n tokens
  (longest n first) in prompt + output and proposes what followed it. No model to run, so free;
  wins when the answer repeats the prompt (edits, extraction, structured output). With an
  `NgramMemory` it also looks in earlier requests' prompts and answers, and in the client's
  guess at the answer where a request brings one (`Prediction`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from homespec.engine.ngram_memory import NgramMemory, contested, since_boundary
from homespec.engine.prediction import Prediction
from homespec.engine.sampling import Draws, SamplingParams, log_weights, top_probability
from homespec.engine.target import Target, shared_prefix


@dataclass(frozen=True)
class Proposal:
    tokens: list[int]
    # The last `handed_over` tokens came from n-gram lookup, part-way through a draft-model
    # proposal (ModelDrafter.propose's `hand_over`), after a match `handover_match` long
    # (`handover_contested`: see NgramDrafter.contested).
    handed_over: int = 0
    handover_match: int = 0
    handover_contested: bool = False


# Given a draft model's tokens so far in a proposal: the n-gram tokens to finish it with (as
# many as the caller allows), their match length and whether it is contested; ([], 0, False):
# draft on.
HandOver = Callable[[list[int]], tuple[list[int], int, bool]]


class Drafter(Protocol):
    kind: str

    def reset(self) -> None: ...

    def propose(
        self, history: list[int], k: int, params: SamplingParams, draws: Draws
    ) -> Proposal: ...


class ModelDrafter:
    kind = "model"

    def __init__(self, ctx: Target, *, p_min: float = 0.0) -> None:
        self.ctx = ctx
        # Stop drafting once the draft's own top probability drops below p_min: a token it is
        # unsure of is unlikely to be accepted, and every rejected draft costs target compute.
        self.p_min = p_min
        self._decodes: list[tuple[int, float]] = []
        # Asked before a proposal that starts behind the history, with the history and the
        # lag: catches the draft up some other way than decoding (a copy of the target's
        # cache, PairRuntime.catch_up_by_copy) and says whether it did; None: it decodes.
        self.catch_up: Callable[[list[int], int], bool] | None = None

    def reset(self) -> None:
        """Nothing to do: the cache is matched against each new history by prefix."""

    def lag(self, history: list[int]) -> int:
        """Tokens of `history` this draft has not decoded (its next proposal decodes them
        first, in one batch)."""
        return len(history) - shared_prefix(self.ctx.tokens, history)

    def take_decodes(self) -> list[tuple[int, float]]:
        """(tokens, ms) of each decode since the last call: what the governor prices the draft
        model by (the first decode of a proposal also catches up on the history)."""
        out, self._decodes = self._decodes, []
        return out

    def propose(
        self,
        history: list[int],
        k: int,
        params: SamplingParams,
        draws: Draws,
        *,
        lag: int | None = None,
        hand_over: HandOver | None = None,
    ) -> Proposal:
        """`lag`: `self.lag(history)`, when the caller has it already (the governor does).
        `hand_over`: asked after each drafted token for n-gram tokens to finish the proposal
        with instead (none: draft on). Sampling, each token is drawn with the noise its
        position has in `draws`, the target's at that position (sampling.py)."""
        tokens: list[int] = []
        first = max(1, self.lag(history) if lag is None else lag)
        if self.catch_up is not None and first > 1 and self.catch_up(history, first):
            first = max(1, self.lag(history))
        for _ in range(k):
            t0 = time.perf_counter()
            logits = self.ctx.extend(history + tokens, 1)[0]
            self._decodes.append((1 if tokens else first, (time.perf_counter() - t0) * 1000.0))
            if params.greedy:
                token = int(np.argmax(logits))
                if self.p_min > 0.0 and tokens and top_probability(logits) < self.p_min:
                    break
            else:
                z = log_weights(logits, params)
                token = int(np.argmax(z + draws.gumbel(len(history) + len(tokens), z.size)))
                if self.p_min > 0.0 and tokens and top_probability(z) < self.p_min:
                    break
            tokens.append(token)
            if self.ctx.model.is_eog(token):
                break
            if hand_over is not None and len(tokens) < k:
                found, match_len, disputed = hand_over(tokens)
                if found:
                    return Proposal(
                        tokens + found,
                        handed_over=len(found),
                        handover_match=match_len,
                        handover_contested=disputed,
                    )
        return Proposal(tokens)


class NgramDrafter:
    """Prompt lookup with the longest match. The index maps each n-gram (n_min … n_max) to the
    last few places it was followed; of those, the one whose preceding tokens agree with the
    history's end for longest wins, and `match_len` says how long that agreement is (up to
    MAX_MATCH). A long match predicts a long continuation: the governor keeps acceptance by
    match length, so it drafts long after a 20-token match and short after a 2-token one.
    The index grows incrementally with the history and is reset per generation; the memory
    (`memory_tokens` > 0) holds earlier requests, and a match there that agrees for longer
    wins.

    Agreement is measured back to the last control token (`boundaries`: a chat template's turn
    markers, like <|im_start|>) and no further: every conversation shares the template, so
    agreeing on it says nothing about what follows. (Counted through it, the opening of any
    answer that began with "The" agreed with every earlier one for 8 tokens; priced as an
    8-token match, an earlier request's first sentence was drafted 8 tokens long, and a
    one-word answer came 10% slower than plain.)"""

    kind = "ngram"
    CANDIDATES = 4  # places kept per n-gram
    MAX_MATCH = 32  # how far back a match is measured

    def __init__(
        self,
        *,
        n_min: int = 2,
        n_max: int = 4,
        memory_tokens: int = 0,
        boundaries: frozenset[int] = frozenset(),
    ) -> None:
        self.n_min = n_min
        self.n_max = n_max
        self.boundaries = boundaries
        self.memory = (
            NgramMemory(memory_tokens, n=n_max, boundaries=boundaries) if memory_tokens else None
        )
        self._seen = 0
        # For each n: n-gram -> positions of the tokens that followed its last occurrences.
        self._index: dict[int, dict[tuple[int, ...], list[int]]] = {}
        self.match_len = 0  # of the last proposal (0: none)
        self.from_memory = False  # the last proposal came from an earlier request
        self.from_prediction = False  # ... from the request's prediction (see predict)
        # ... at most half of the places its n-gram was seen at went on as it does (the
        # governor prices it from tables of its own: estimates.CONTESTED_PRIORS)
        self.contested = False
        self.answer_start = 0  # see reset
        self.prediction: Prediction | None = None
        self.reset()

    def reset(self) -> None:
        """Called at the start of each generation: the history only grows until the next one.

        The generation then sets `answer_start` to where its answer begins when the prompt is
        a rendered chat (0: a raw prompt, which the answer continues). Agreement is not
        measured back across it: what precedes an answer's first tokens is the template's
        role header ("assistant" and a newline after the turn marker), the same before every
        answer. Counted, an answer's first token agreed for 3 or 4 tokens with the opening of
        any earlier answer that began with it, and an 8-token answer drafted 5 tokens from
        another answer's opening at a 4-token match's price and kept none (0.88× plain)."""
        self._seen = 0
        self._index = {n: {} for n in range(self.n_min, self.n_max + 1)}
        self.match_len = 0
        self.from_memory = False
        self.from_prediction = False
        self.contested = False
        self.answer_start = 0
        self.prediction = None

    def predict(self, tokens: list[int], answer_start: int) -> None:
        """This generation's answer is expected to read like `tokens` (the client's guess, after
        reset): lookup drafts from it too, where it agrees with the answer's end for longer
        than the prompt and the memory do. Its anchor makes an answer that began as it does
        agree one token longer there; on a tie (a file to edit is in the prompt and in the
        prediction) the prompt's place is taken, priced by the tables that know the task."""
        self.prediction = Prediction(tokens, answer_start, n_min=self.n_min, n_max=self.n_max)

    def remember(self, tokens: list[int]) -> None:
        """A finished request's prompt and answer, for the requests after it (with a memory)."""
        if self.memory is not None:
            self.memory.add(tokens)

    def _update(self, history: list[int]) -> None:
        for pos in range(max(self._seen, 1), len(history)):
            for n, table in self._index.items():
                if pos >= n:
                    places = table.setdefault(tuple(history[pos - n : pos]), [])
                    places.append(pos)
                    if len(places) > self.CANDIDATES:
                        del places[0]
        self._seen = len(history)

    def _agreement(self, seq: list[int], follow: int, n: int, cap: int) -> int:
        """How many tokens before `follow` equal `seq`'s last ones (n or more), up to `cap`:
        back to the last boundary token (fewer than n when the n-gram holds one)."""
        end, length = len(seq), n
        while length < cap and follow - length > 0:
            if seq[follow - length - 1] != seq[end - length - 1]:
                break
            length += 1
        return min(length, cap)

    def propose(self, history: list[int], k: int, params: SamplingParams, draws: Draws) -> Proposal:
        self._update(history)
        proposal, self.match_len, origin, self.contested = self._continue(history, k)
        self.from_memory, self.from_prediction = origin == "memory", origin == "prediction"
        return proposal

    def glance(self, history: list[int]) -> bool:
        """Whether a lookup now might find a match of n_max tokens or more: the history's last
        n_max tokens were seen before (in it or in the memory), or there is a prediction. One
        table, no agreement measured, nothing proposed: 15 us in the loop on the 2-core box to
        `propose`'s 27-39. Each step while a plain choice stands (governor.standing) glances,
        and looks up before it decides only where this says a long match can be there (the
        others look up while the target decodes, only to learn from: generate.look_up)."""
        if self.prediction is not None:
            return True
        self._update(history)
        key = tuple(history[-self.n_max :])
        if key in self._index[self.n_max]:
            return True
        return self.memory is not None and self.memory.knows(key)

    def lookahead(
        self, history: list[int], extra: list[int], k: int
    ) -> tuple[list[int], int, bool]:
        """What lookup would propose after `history` + `extra` (a draft model's tokens not
        verified yet), its agreement length and whether it is contested; ([], 0, False) for
        no match. Only `history` is indexed: a draft that the target rejects must never become
        something to match. Call after `propose(history, …)` (which indexes it); changes
        nothing. The prediction is not looked in: its proposals are priced by tables of their
        own (see Ledger)."""
        proposal, match_len, _, disputed = self._continue(history + extra, k, predicted=False)
        return proposal.tokens, match_len, disputed

    def _continue(
        self, seq: list[int], k: int, *, predicted: bool = True
    ) -> tuple[Proposal, int, str, bool]:
        """(proposal, agreement length, where it came from: "prompt", "memory", "prediction"
        or "" for none, whether it is contested) for what follows `seq`."""
        # How far back any agreement with seq's end may count: to its last control token
        # (a turn marker) and, in a chat's answer, to the answer's start (see reset).
        cap = since_boundary(seq, self.MAX_MATCH, self.boundaries)
        if 0 < self.answer_start < len(seq):
            cap = min(cap, len(seq) - self.answer_start)
        n, places = self._places(seq)
        # Longest agreement first; among equals, the most recent place.
        found = max((self._agreement(seq, f, n, cap), f) for f in places) if places else None
        earlier = self.memory.lookup(seq, cap) if self.memory is not None else None
        if predicted and self.prediction is not None:
            guess, agree = self.prediction.propose(seq, k)
            best = max(found[0] if found else 0, earlier[0] if earlier else 0)
            if guess and agree > best:
                return Proposal(guess), agree, "prediction", False
        if earlier is not None and (found is None or earlier[0] > found[0]):
            assert self.memory is not None
            disputed = self.memory.contested(seq, earlier[1])
            return Proposal(self.memory.continuation(earlier[1], k)), earlier[0], "memory", disputed
        if found is None:
            return Proposal([]), 0, "", False
        match_len, follow = found
        disputed = contested([seq[f] for f in places], seq[follow])
        out = seq[follow : follow + k]
        # A continuation that runs into the present (a repeating answer: the match is the
        # last period) goes on by looking up its own end again, as llama.cpp's ngram-mod
        # chains its table: a loop of any period is proposed k tokens at a time.
        while 0 < len(out) < k and follow + len(out) >= len(seq):
            tail = (seq[-self.n_max :] + out)[-self.n_max :]
            again = self._places(tail)[1]
            if not again:
                break
            follow = again[-1]
            out += seq[follow : follow + k - len(out)]
        return Proposal(out), match_len, "prompt", disputed

    def _places(self, context: list[int]) -> tuple[int, list[int]]:
        """(n, places) for the longest n-gram (n_max … n_min) that ends `context` and was seen
        before: where, as the positions of the tokens that followed it (the last CANDIDATES);
        (0, []) where none was. `context` is the history, or a tail to chain a loop by."""
        for n in range(self.n_max, self.n_min - 1, -1):
            if len(context) >= n:
                places = self._index[n].get(tuple(context[-n:]))
                if places:
                    return n, places
        return 0, []


class HybridDrafter:
    """N-gram lookup when it finds a match (free to make), else the draft model.

    Which proposal a step makes changes what the target is asked to check, never what it
    keeps: a draft is kept only where it is the target's own pick (sampling.verify).
    """

    kind = "hybrid"

    def __init__(self, model: ModelDrafter, ngram: NgramDrafter) -> None:
        self.model = model
        self.ngram = ngram

    def reset(self) -> None:
        self.model.reset()
        self.ngram.reset()

    def propose(self, history: list[int], k: int, params: SamplingParams, draws: Draws) -> Proposal:
        found = self.ngram.propose(history, k, params, draws)
        return found if found.tokens else self.model.propose(history, k, params, draws)
