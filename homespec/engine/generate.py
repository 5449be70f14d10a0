"""The draft -> verify loop.

One target `llama_decode` per step carries [last committed token] + k drafts, with logits only at
those k + 1 positions. Drafts are checked left to right: at temperature 0 a draft is kept while
it equals the target's argmax; at temperature > 0 by speculative sampling (accept with
min(1, p/q), else resample from the residual). The first rejection emits the target's own token
instead; if every draft is kept, the target's next token comes free ("bonus"). Either way the
output is exactly what the target alone would produce (at temperature > 0: in distribution).

Plain decoding is the same loop with k = 0, so A/B comparisons measure speculation and nothing
else.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator
from dataclasses import dataclass

import numpy as np

from homespec.engine.drafters import Drafter, HybridDrafter, ModelDrafter, NgramDrafter, Proposal
from homespec.engine.policy import decide, effective_temperature, step_tokens
from homespec.engine.sampling import SamplingParams, pick, verify
from homespec.engine.target import Target
from homespec.engine.textstream import TextStream
from homespec.engine.types import Chunk, GenerationRequest, GenerationStats
from homespec.errors import RequestError
from homespec.manifest import PairSpec

LOG = logging.getLogger("homespec.engine")


@dataclass
class PairRuntime:
    """What the loop runs on: the target's context and whatever drafters the pair has."""

    name: str
    spec: PairSpec
    target: Target
    draft: ModelDrafter | None
    ngram: NgramDrafter
    draft_unavailable_reason: str = ""
    plain_only_reason: str = ""  # the target cannot speculate at all (e.g. recurrent state)
    draft_failed: bool = False  # the draft model failed to load: the pair runs degraded

    def clear_caches(self) -> None:
        """Drop cached prompt prefixes (the bench does this so every run pays its prompt)."""
        self.target.clear()
        if self.draft is not None:
            self.draft.ctx.clear()

    def drafter(self, kind: str) -> Drafter:
        if kind == "ngram":
            return self.ngram
        assert self.draft is not None  # decide() only picks model drafters when one is loaded
        return self.draft if kind == "model" else HybridDrafter(self.draft, self.ngram)


def sampling_params(pair: PairSpec, req: GenerationRequest) -> SamplingParams:
    s = pair.sampling
    return SamplingParams(
        temperature=effective_temperature(pair, req),
        top_p=req.top_p if req.top_p is not None else s.top_p,
        top_k=req.top_k if req.top_k is not None else s.top_k,
        seed=req.seed if req.seed is not None else s.seed,
    )


PROMPT_FORMATS = {
    "chat": "chat template",
    "transcript": "plain transcript (the target has no chat template)",
    "raw": "raw prompt",
}


def prompt_tokens(rt: PairRuntime, req: GenerationRequest) -> tuple[list[int], str]:
    """The prompt's tokens and how it was rendered (one of PROMPT_FORMATS' values)."""
    model = rt.target.model
    if req.messages is not None:
        text = model.chat_prompt(req.messages)
        how = PROMPT_FORMATS["chat" if model.has_chat_template() else "transcript"]
    elif req.prompt is not None:
        text, how = req.prompt, PROMPT_FORMATS["raw"]
    else:
        raise RequestError("request has neither messages nor a prompt", "send one of them")
    tokens = model.tokenize(text, special=True)
    if not tokens:
        raise RequestError("the prompt is empty", "send some text")
    if len(tokens) >= rt.target.n_ctx:
        raise RequestError(
            f"the prompt is {len(tokens)} tokens but pair {rt.name!r} has a "
            f"{rt.target.n_ctx}-token context (room is needed for at least one answer token)",
            "shorten the prompt or raise n_ctx in models.toml",
        )
    return tokens, how


def generate(
    rt: PairRuntime, req: GenerationRequest
) -> Generator[Chunk | GenerationStats, None, None]:
    """Stream Chunks as tokens are committed; the last item is the request's GenerationStats."""
    for item in generate_steps(rt, req):
        if isinstance(item, GenerationStats):
            yield item
        else:
            yield from item


def generate_steps(
    rt: PairRuntime, req: GenerationRequest
) -> Generator[list[Chunk] | GenerationStats, None, None]:
    """The same, one list of Chunks per target decode (what the engine child sends across)."""
    t_start = time.perf_counter()
    decision = decide(
        rt.name,
        rt.spec,
        req,
        draft_available=rt.draft is not None,
        unavailable_reason=rt.draft_unavailable_reason,
        plain_only_reason=rt.plain_only_reason,
    )
    drafter: Drafter | None = None
    if decision.mode == "speculative":
        drafter = rt.drafter(decision.drafter)
        drafter.reset()
    params = sampling_params(rt.spec, req)
    rng = np.random.default_rng(params.seed)
    history, how = prompt_tokens(rt, req)
    n_prompt = len(history)
    max_new = min(req.max_tokens, rt.target.n_ctx - n_prompt)
    stats = GenerationStats(
        mode=decision.mode,
        reason=decision.reason,
        drafter=decision.drafter,
        prompt_tokens=n_prompt,
        prompt_format=how,
        accepted_per_position=[0] * decision.draft_tokens,
    )
    if stats.prompt_format == PROMPT_FORMATS["transcript"]:
        LOG.warning("pair %s: %s", rt.name, stats.prompt_format)
    text = TextStream(req.stop)
    model = rt.target.model
    done = False

    def commit(token: int, drafted: bool) -> Chunk | None:
        """Append one token to the answer; sets `done` at EOS, a stop string or the cap."""
        nonlocal done
        history.append(token)
        stats.completion_tokens += 1
        if model.is_eog(token):
            done, stats.finish_reason = True, "stop"
            return None
        out = text.feed(model.piece(token))
        if text.stopped:
            done, stats.finish_reason = True, "stop"
        elif stats.completion_tokens >= max_new:
            done = True
            out += text.flush()
        return Chunk(out, drafted) if out else None

    # Prompt: one pass (chunked by n_batch inside extend), logits for the last position only.
    first = pick(rt.target.extend(history, 1)[0], params, rng)
    stats.ttft_ms = (time.perf_counter() - t_start) * 1000.0
    chunk = commit(first, False)
    if chunk:
        yield [chunk]

    while not done:
        room = min(max_new - stats.completion_tokens, rt.target.n_ctx - len(history)) - 1
        k = step_tokens(decision, room=room, max_outputs=rt.target.n_outputs_max)
        proposal = drafter.propose(history, k, params, rng) if drafter and k > 0 else Proposal([])
        drafts = proposal.tokens
        logits = rt.target.extend(history + drafts, len(drafts) + 1)
        stats.verify_steps += 1
        if drafts:
            stats.draft_steps += 1
            stats.proposed_tokens += len(drafts)
        n_kept, following = verify(drafts, proposal.probs, logits, params, rng)
        emitted: list[Chunk] = []
        for i, token in enumerate([*drafts[:n_kept], following]):
            kept = i < n_kept
            if kept:
                stats.accepted_tokens += 1
                stats.accepted_per_position[i] += 1
            chunk = commit(token, kept)
            if chunk:
                emitted.append(chunk)
            if done:  # EOS or a stop string inside the step: the rest is not the answer
                break
        if emitted:
            yield emitted

    tail = text.flush()
    if tail:
        yield [Chunk(tail, False)]
    stats.e2e_ms = (time.perf_counter() - t_start) * 1000.0
    yield stats
