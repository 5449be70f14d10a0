"""What the generation loop needs from a model: the `Target` protocol.

`LlamaContext` (llama_backend.py) satisfies it, and so does the scripted fake in the tests
(tests/fake_target.py), which is how the loop, the daemon's HTTP contracts and the CLI are
tested without model files. A draft model is a `Target` too: the loop only ever extends a
history and reads logits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import numpy.typing as npt

from homespec.engine.types import ChatFormat, Message


class Vocabulary(Protocol):
    def tokenize(self, text: str, *, special: bool, add_bos: bool | None = None) -> list[int]:
        """`special`: parse control tokens in `text` and (unless `add_bos` says otherwise) add
        BOS when the model wants one."""
        ...

    def piece(self, token: int) -> bytes: ...

    def is_eog(self, token: int) -> bool: ...

    def has_chat_template(self) -> bool: ...

    def template_problem(self) -> str: ...

    def chat_prompt(self, messages: list[Message], fmt: ChatFormat = ...) -> str:
        """The chat rendered as one string, as `fmt` asks (chat_template.chat_prompt)."""
        ...

    def cache_shape(self) -> tuple[int, ...] | None:
        """What decides whether another model's cache can stand for this one's: equal shapes
        hold the same keys and values per token (None: unknown, never shared;
        engine/cache_share.py)."""
        ...


class Target(Protocol):
    @property
    def model(self) -> Vocabulary: ...

    @property
    def n_ctx(self) -> int: ...

    @property
    def n_outputs_max(self) -> int: ...

    @property
    def tokens(self) -> list[int]:
        """What the cache holds, position by position."""
        ...

    def extend(
        self,
        history: list[int],
        n_logits: int = 1,
        while_waiting: Callable[[], None] | None = None,
    ) -> npt.NDArray[np.float32]:
        """Make the cache hold exactly `history`; the logits of its last `n_logits` positions,
        valid until the next extend or clear (a view of llama.cpp's buffer, not a copy).
        `while_waiting`, if given, runs once the decodes are queued and before their logits
        are read: on a GPU, where llama_decode only queues the work, while the card computes
        (the first H100 run, timing llama_decode alone, found about a millisecond of a plain
        step's GPU time after it returned); on a CPU, whose decode is over when llama_decode
        returns, after it."""
        ...

    def clear(self) -> None: ...

    # Conversations put aside (engine/prompt_cache.py):
    def snapshot_size(self) -> int:
        """The bytes snapshot() would take now."""
        ...

    def snapshot(self) -> bytearray:
        """The cache as bytes (llama.cpp's sequence state); empty where it cannot be copied."""
        ...

    def restore(self, tokens: list[int], data: bytearray) -> bool:
        """Make the cache hold `tokens` again, from what snapshot() gave when it held them (or
        what another context's gave, engine/cache_share.py); False where it could not (the
        cache is empty then)."""
        ...

    def set_threads(self, n: int) -> None:
        """CPU threads for the next decodes."""
        ...


def shared_prefix(cached: list[int], history: list[int], limit: int | None = None) -> int:
    """How much of `history` a context already holds: the length of their common prefix (at
    most `limit`). LlamaContext.extend keeps that much of its cache, and a draft model's lag
    is the rest of the history.

    Both ask it every step, and a cache then usually holds drafts the target did not keep:
    the two part near the end. Halving with slice compares (C loops) finds where: 9 us at
    1,900 tokens and 32 at 8,000 here, where a Python loop from the start took 37 and 159, a
    GPU's whole step being 2-3 ms."""
    n = min(len(cached), len(history))
    if limit is not None:
        n = min(n, limit)
    if cached[:n] == history[:n]:
        return n
    lo, hi = 0, n  # cached[:lo] == history[:lo]; they differ within [lo, hi)
    while hi - lo > 16:
        mid = (lo + hi) // 2
        if cached[lo:mid] == history[lo:mid]:
            lo = mid
        else:
            hi = mid
    return next(i for i in range(lo, hi) if cached[i] != history[i])
