"""A scripted `Target` (homespec/engine/target.py) for tests that need no model files.

Its vocabulary is the 256 bytes plus three specials (EOS, BOS, and an assistant marker that
its chat template puts at the end of every prompt). Its "model" answers a chat by echoing the
last user message, byte by byte, then EOS; a message that starts with `forever ` is echoed over
and over instead, so a test can make a long generation. A raw prompt is continued with the
alphabet from its last letter, without end. Every position's logits
peak at the scripted next token, so greedy decoding follows the script exactly and sampling
nearly always does.

A draft is the same fake with `wrong_every = k`: every k-th token of the answer it predicts a
different byte, so the target rejects it there. Each decode sleeps `decode_s` (+ `token_s` per
token) to stand for the compute, marking the crash site meanwhile like llama_backend does.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from homespec.engine.crashsite import CrashSite, Site
from homespec.engine.types import PLAIN_CHAT, ChatFormat, Message

EOS, BOS, MARK = 256, 257, 258
N_VOCAB = 259
MARKER = "<|assistant|>"
FOREVER = b"forever "
CYCLE = b"abcdefghijklmnopqrstuvwxyz "


class FakeVocab:
    # None: a cache nothing else can stand for (the default); a test of catching up by copy
    # gives target and draft the same shape (engine/cache_share.py)
    shape: tuple[int, ...] | None = None

    def cache_shape(self) -> tuple[int, ...] | None:
        return self.shape

    def tokenize(self, text: str, *, special: bool, add_bos: bool | None = None) -> list[int]:
        bos = [BOS] if (special if add_bos is None else add_bos) else []
        if not special:
            return [*bos, *text.encode()]
        out = [*bos]
        for i, piece in enumerate(text.split(MARKER)):
            out += [MARK, *piece.encode()] if i else piece.encode()
        return out

    def piece(self, token: int) -> bytes:
        return bytes([token]) if token < 256 else b""

    def is_eog(self, token: int) -> bool:
        return token == EOS

    def has_chat_template(self) -> bool:
        return True

    def template_problem(self) -> str:
        return ""

    def chat_prompt(self, messages: list[Message], fmt: ChatFormat = PLAIN_CHAT) -> str:
        head = messages[:-1] if fmt.continue_last else messages
        text = "".join(f"{m.role}: {m.content}\n" for m in head)
        if fmt.continue_last:
            return text + MARKER + messages[-1].content
        return text + MARKER if fmt.generation_prompt else text


def answer(prompt: list[int]) -> tuple[bytes, bool]:
    """The scripted reply to a prompt's tokens, and whether it repeats forever."""
    raw = bytes(t for t in prompt if t < 256)
    text = raw.rsplit(b"user: ", 1)[-1].rstrip(b"\n") if MARK in prompt else raw
    if text.startswith(FOREVER):
        return text[len(FOREVER) :] or b"x", True
    return text, False


class FakeTarget:
    def __init__(
        self,
        *,
        n_ctx: int = 1024,
        n_outputs_max: int = 65,
        wrong_every: int = 0,
        decode_s: float = 0.002,
        token_s: float = 0.0,
        site: CrashSite | None = None,
        role: Site = Site.TARGET,
        fault: bool = False,
    ) -> None:
        self.model = FakeVocab()
        self.n_ctx = n_ctx
        self.n_outputs_max = n_outputs_max
        self.wrong_every = wrong_every
        self.decode_s = decode_s
        self.token_s = token_s
        self.site = site or CrashSite()
        self.role = role
        self.fault = fault  # die by SIGSEGV at the first decode, as a native crash would
        self.tokens: list[int] = []
        self.decodes = 0
        self.restores = 0
        # One buffer that every decode overwrites, handed out as a read-only view: the real
        # context's contract, so a caller that keeps logits past the next decode, or writes
        # to them, fails here too.
        self._logits = np.zeros((n_outputs_max, N_VOCAB), dtype=np.float32)

    def next_token(self, history: list[int]) -> int:
        if MARK in history:  # a chat prompt: echo the last user message
            start = len(history) - history[::-1].index(MARK)
            reply, forever = answer(history[:start])
            k = len(history) - start  # answer tokens so far
            if k >= len(reply) and not forever:
                return EOS
            token = reply[k % len(reply)]
        else:  # a raw prompt: continue the alphabet from the last byte, never ending
            k = len(history)
            token = CYCLE[(CYCLE.find(bytes([history[-1] % 256])) + 1) % len(CYCLE)]
        if self.wrong_every and k % self.wrong_every == self.wrong_every - 1:
            token = (token + 1) % 256
        return token

    def extend(
        self,
        history: list[int],
        n_logits: int = 1,
        while_waiting: Callable[[], None] | None = None,
    ) -> npt.NDArray[np.float32]:
        if len(history) > self.n_ctx:
            raise ValueError(f"{len(history)} tokens over the {self.n_ctx}-token context")
        if not 1 <= n_logits <= min(len(history), self.n_outputs_max):
            raise ValueError(f"n_logits={n_logits} out of range")
        common = 0
        while (
            common < min(len(self.tokens), len(history)) and self.tokens[common] == history[common]
        ):
            common += 1
        self.site.mark(self.role)
        if self.fault:
            # To this thread, as a real segfault is: a signal to the process may be handled by
            # another thread after this one has already cleared the crash site (seen under load).
            signal.pthread_kill(threading.get_ident(), signal.SIGSEGV)
        time.sleep(self.decode_s + self.token_s * (len(history) - common))
        self.site.mark(Site.IDLE)
        self.tokens = list(history)
        self.decodes += 1
        if while_waiting is not None:
            while_waiting()
        self._logits.fill(0.0)
        for row, end in enumerate(range(len(history) - n_logits + 1, len(history) + 1)):
            self._logits[row, self.next_token(history[:end])] = 12.0
        out = self._logits[:n_logits]
        out.flags.writeable = False  # a view: the buffer itself stays writable for the next decode
        return out

    def set_threads(self, n: int) -> None:
        self.threads = n

    def clear(self) -> None:
        self.tokens = []

    def snapshot_size(self) -> int:
        return len(self.snapshot())

    def snapshot(self) -> bytearray:
        return bytearray(np.asarray(self.tokens, dtype=np.int32).tobytes())

    def restore(self, tokens: list[int], data: bytearray) -> bool:
        held = np.frombuffer(bytes(data), dtype=np.int32).tolist()
        if held != tokens:  # a snapshot restored under another conversation's tokens
            raise AssertionError(f"snapshot of {len(held)} tokens restored as {len(tokens)}")
        self.tokens = list(tokens)
        self.restores += 1
        return True
