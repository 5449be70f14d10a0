"""What the generation loop needs from a model: the `Target` protocol.

`LlamaContext` (llama_backend.py) satisfies it, and so does the scripted fake in the tests
(tests/fake_target.py), which is how the loop, the daemon's HTTP contracts and the CLI are
tested without model files. A draft model is a `Target` too: the loop only ever extends a
history and reads logits.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from homespec.engine.types import Message


class Vocabulary(Protocol):
    def tokenize(self, text: str, *, special: bool, add_bos: bool | None = None) -> list[int]:
        """`special`: parse control tokens in `text` and (unless `add_bos` says otherwise) add
        BOS when the model wants one."""
        ...

    def piece(self, token: int) -> bytes: ...

    def is_eog(self, token: int) -> bool: ...

    def has_chat_template(self) -> bool: ...

    def template_problem(self) -> str: ...

    def chat_prompt(self, messages: list[Message]) -> str: ...


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

    def extend(self, history: list[int], n_logits: int = 1) -> npt.NDArray[np.float32]:
        """Make the cache hold exactly `history`; the logits of its last `n_logits` positions,
        valid until the next extend or clear (a view of llama.cpp's buffer, not a copy)."""
        ...

    def clear(self) -> None: ...

    def set_threads(self, n: int) -> None:
        """CPU threads for the next decodes."""
        ...
