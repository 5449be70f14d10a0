"""The one module that imports `llama_cpp`: models, contexts, tokens, chat templates, quantizing.

Written on llama-cpp-python's low-level API (0.3.x) rather than `Llama`, because the speculative
loop needs what `Llama` hides: logits at chosen batch positions only, and removal of rejected
positions from the KV cache (see docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import llama_cpp as lc
import numpy as np

from homespec.engine import chat_template
from homespec.engine.crashsite import CrashSite, Site
from homespec.engine.ggml_devices import Ggml
from homespec.engine.target import shared_prefix
from homespec.engine.types import PLAIN_CHAT, ChatFormat, Message
from homespec.errors import EngineError, RequestError

LOG = logging.getLogger("homespec.llama")
# Template pieces kept tokenized per model (LlamaModel.tokenize): texts up to this long, this
# many of them (a chat template has a handful; raw prompts with control tokens come and go).
MARKUP_MAX_CHARS = 512
MARKUP_KEPT = 64

# llama.cpp file types `homespec models derive --type` accepts (llama_ftype in llama.h).
FILE_TYPES: dict[str, int] = {
    "F32": lc.LLAMA_FTYPE_ALL_F32,
    "F16": lc.LLAMA_FTYPE_MOSTLY_F16,
    "BF16": lc.LLAMA_FTYPE_MOSTLY_BF16,
    "Q8_0": lc.LLAMA_FTYPE_MOSTLY_Q8_0,
    "Q6_K": lc.LLAMA_FTYPE_MOSTLY_Q6_K,
    "Q5_K_M": lc.LLAMA_FTYPE_MOSTLY_Q5_K_M,
    "Q5_0": lc.LLAMA_FTYPE_MOSTLY_Q5_0,
    "Q4_K_M": lc.LLAMA_FTYPE_MOSTLY_Q4_K_M,
    "Q4_K_S": lc.LLAMA_FTYPE_MOSTLY_Q4_K_S,
    "Q4_1": lc.LLAMA_FTYPE_MOSTLY_Q4_1,
    "Q4_0": lc.LLAMA_FTYPE_MOSTLY_Q4_0,
    "Q3_K_M": lc.LLAMA_FTYPE_MOSTLY_Q3_K_M,
    "Q2_K": lc.LLAMA_FTYPE_MOSTLY_Q2_K,
}


@lc.llama_log_callback  # type: ignore[untyped-decorator]
def _forward_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """Route llama.cpp's (very chatty) log into Python logging at DEBUG (`--verbose` shows it)."""
    if LOG.isEnabledFor(logging.DEBUG):
        LOG.debug(text.decode("utf-8", "replace").rstrip())


def init_backend() -> None:
    """Idempotent: quiet llama.cpp's log and initialise its backends."""
    lc.llama_log_set(_forward_log, ctypes.c_void_p(0))
    lc.llama_backend_init()


def system_info() -> str:
    init_backend()
    return bytes(lc.llama_print_system_info()).decode("utf-8", "replace").strip()


def supports_gpu_offload() -> bool:
    init_backend()
    return bool(lc.llama_supports_gpu_offload())


@functools.cache
def ggml() -> Ggml:
    """The ggml library of the loaded llama.cpp (one per process, like the library itself)."""
    init_backend()
    return Ggml(Path(lc.llama_cpp._lib._name))


class LlamaModel:
    """Weights and vocabulary of one GGUF file.

    `repack`: let llama.cpp repack quantized weights into its CPU extra buffer types (AMX,
    AArch64 layouts). On some CPUs with AMX the repacked matrix multiply segfaults (llama.cpp
    issue 20824); the canary (engine/canary.py) finds out and turns it off for that model.
    `crash_site` records that this process is inside llama.cpp's loader (see crashsite.py).
    """

    def __init__(
        self,
        path: Path,
        *,
        gpu_layers: int = 0,
        repack: bool = True,
        crash_site: CrashSite | None = None,
        load_site: Site = Site.LOAD_TARGET,
        devices: Sequence[int] | None = None,
        split: Sequence[float] | None = None,
        mmap: bool = True,
    ) -> None:
        """`devices`: the ggml devices (handles) its offloaded layers may use, in llama.cpp's
        order (None: llama.cpp picks; empty: none, all in RAM); `split`: the share of the
        offloaded layers each of them takes (the output layer counts as one). `mmap`: map the
        file (llama.cpp's "auto"), else read the weights into memory of their own, which can
        then be backed by huge pages (engine/pages.py)."""
        init_backend()
        params = lc.llama_model_default_params()
        # llama.h: "a negative value means all layers" (llama_model::n_gpu_layers()).
        params.n_gpu_layers = -1 if gpu_layers < 0 else gpu_layers
        params.use_extra_bufts = repack
        params.load_mode = lc.LLAMA_LOAD_MODE_AUTO if mmap else lc.LLAMA_LOAD_MODE_NONE
        # Both arrays only need to live through the load: llama.cpp copies them.
        dev_array = None
        if devices is not None:
            dev_array = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
            params.devices = ctypes.addressof(dev_array)
        split_array = None
        if split is not None:
            n_max = lc.llama_max_devices()
            if len(split) > n_max:
                raise EngineError(f"{len(split)} devices: llama.cpp takes at most {n_max}", "")
            split_array = (ctypes.c_float * n_max)(*split)
            params.tensor_split = split_array
        self.path = path
        self.repack = repack
        site = crash_site or CrashSite()
        site.mark(load_site)
        self._model = lc.llama_model_load_from_file(str(path).encode(), params)
        site.mark(Site.IDLE)
        if not self._model:
            raise EngineError(
                f"llama.cpp could not load {path}",
                "check the file (`homespec doctor`) and run with --verbose for llama.cpp's log",
            )
        self._vocab = lc.llama_model_get_vocab(self._model)
        self.n_vocab: int = lc.llama_vocab_n_tokens(self._vocab)
        self.add_bos: bool = bool(lc.llama_vocab_get_add_bos(self._vocab))
        # An ordinary token to fill a context with when measuring memory.
        self.filler_token: int = self.tokenize(" the", special=False)[-1]
        self._pieces: dict[int, bytes] = {}
        self._markup: dict[tuple[str, bool], list[int]] = {}  # see tokenize
        self._template_problem: str | None = None

    def tokenize(self, text: str, *, special: bool, add_bos: bool | None = None) -> list[int]:
        """`special`: parse special tokens like <|im_end|> and, unless `add_bos` says
        otherwise, add BOS if the model wants it.

        Short texts with special tokens are kept tokenized: a chat's template pieces (the
        header with the default system prompt, the turn markers) are the same in every
        request, and tokenizing them came to 0.4 ms of each request's 0.55 ms of prompt work
        here, on caches a decode had just cold (llama.cpp's tokenizer scans every control
        token for them)."""
        bos = special if add_bos is None else add_bos
        if not special or len(text) > MARKUP_MAX_CHARS:
            return self._tokenize(text, special=special, bos=bos)
        tokens = self._markup.get((text, bos))
        if tokens is None:
            tokens = self._tokenize(text, special=special, bos=bos)
            if len(self._markup) >= MARKUP_KEPT:  # a raw-prompt client: start over
                self._markup.clear()
            self._markup[(text, bos)] = tokens
        return list(tokens)  # the caller's to change

    def _tokenize(self, text: str, *, special: bool, bos: bool) -> list[int]:
        raw = text.encode("utf-8")
        n_max = len(raw) + 8
        buf = (lc.llama_token * n_max)()
        n = lc.llama_tokenize(self._vocab, raw, len(raw), buf, n_max, bos, special)
        if n < 0:  # buffer too small: -n is the size needed
            n_max = -n
            buf = (lc.llama_token * n_max)()
            n = lc.llama_tokenize(self._vocab, raw, len(raw), buf, n_max, bos, special)
        if n < 0:
            raise EngineError(f"tokenization failed ({n})", "report this as a bug")
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes one token contributes to the text (special tokens render as nothing)."""
        cached = self._pieces.get(token)
        if cached is None:
            buf = ctypes.create_string_buffer(64)
            n = lc.llama_token_to_piece(self._vocab, token, buf, 64, 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = lc.llama_token_to_piece(self._vocab, token, buf, -n, 0, False)
            cached = self._pieces[token] = buf.raw[:n]
        return cached

    def is_eog(self, token: int) -> bool:
        return bool(lc.llama_vocab_is_eog(self._vocab, token))

    def control_tokens(self) -> frozenset[int]:
        """The vocabulary's control tokens (a chat template's turn markers, like <|im_start|>):
        one pass over the vocabulary, 20 ms for 49k tokens here."""
        vocab = self._vocab
        return frozenset(t for t in range(self.n_vocab) if lc.llama_vocab_is_control(vocab, t))

    def has_chat_template(self) -> bool:
        return bool(lc.llama_model_chat_template(self._model, None))

    def template_problem(self) -> str:
        """Why the GGUF's chat template is rendered by llama.cpp's built-in look-alike instead
        of as the Jinja it is ("" when it is not): every request and status say so."""
        if self._template_problem is None:
            tmpl = lc.llama_model_chat_template(self._model, None)
            source = tmpl.decode("utf-8", "replace") if tmpl else ""
            self._template_problem = chat_template.problem(source) if source else ""
        return self._template_problem

    def chat_prompt(self, messages: list[Message], fmt: ChatFormat = PLAIN_CHAT) -> str:
        """Render messages with the model's own chat template (chat_template.chat_prompt)."""
        tmpl = lc.llama_model_chat_template(self._model, None)
        return chat_template.chat_prompt(
            tmpl.decode("utf-8", "replace") if tmpl else "",
            messages,
            model=self.path.name,
            bos_token=self._special_text(lc.llama_vocab_bos(self._vocab)),
            eos_token=self._special_text(lc.llama_vocab_eos(self._vocab)),
            add_bos=self.add_bos,
            builtin=lambda head, opened: self._builtin_chat_prompt(tmpl, head, opened),
            fmt=fmt,
        )

    def _special_text(self, token: int) -> str:
        if token < 0:
            return ""
        raw = lc.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", "replace") if raw else ""

    def _builtin_chat_prompt(self, tmpl: bytes, messages: list[Message], opened: bool) -> str:
        keep = [(m.role.encode(), m.content.encode()) for m in messages]
        chat = (lc.llama_chat_message * len(keep))()
        for i, (role, content) in enumerate(keep):
            chat[i].role = role
            chat[i].content = content
        size = sum(len(r) + len(c) for r, c in keep) * 2 + 256
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = lc.llama_chat_apply_template(tmpl, chat, len(keep), opened, buf, size)
            if n < 0:
                raise RequestError(
                    f"{self.path.name}: llama.cpp does not support this model's chat template",
                    "send a raw prompt instead (`homespec ask --raw`)",
                )
            if n <= size:
                return buf.raw[:n].decode("utf-8", "replace")
            size = n + 1
        raise EngineError("chat template output kept growing", "report this as a bug")

    def cache_shape(self) -> tuple[int, ...]:
        """Layers, embedding width, attention heads, key/value heads, sliding window, rope
        type, recurrent, hybrid: two models alike in all of these keep caches llama.cpp can
        copy from one context to the other (it checks the key and value types itself)."""
        m = self._model
        return (
            lc.llama_model_n_layer(m),
            lc.llama_model_n_embd(m),
            lc.llama_model_n_head(m),
            lc.llama_model_n_head_kv(m),
            lc.llama_model_n_swa(m),
            int(lc.llama_model_rope_type(m)),
            int(lc.llama_model_is_recurrent(m)),
            int(lc.llama_model_is_hybrid(m)),
        )

    def close(self) -> None:
        if self._model:
            lc.llama_model_free(self._model)
            self._model = None


class LlamaContext:
    """One KV cache over a model, with a record of which token sits at each position.

    `extend(history, n)` makes the cache hold exactly `history` and returns the logits of its
    last `n` positions. Whatever prefix the cache already shares with `history` is reused, and
    anything after it (rejected drafts, an older request) is removed first; so rolling back after
    a verify step, and prompt-prefix reuse across requests, are the same operation.
    """

    def __init__(
        self,
        model: LlamaModel,
        *,
        n_ctx: int,
        n_batch: int,
        threads: int,
        flash_attn: bool | None = None,
        n_outputs_max: int = 1,
        crash_site: CrashSite | None = None,
        decode_site: Site = Site.TARGET,
    ) -> None:
        """`flash_attn`: None leaves it to llama.cpp ("auto"), else forces it on or off.

        `n_outputs_max`: the most positions one decode may ask logits for (a verify step asks
        draft_tokens + 1). llama.cpp sizes its compute buffer for this many rows of logits
        (n_batch by default: 512 × vocabulary × 4 bytes, 512 MiB for a 262k vocabulary), and
        aborts the process when a batch asks for more, so extend() checks it first.
        """
        params = lc.llama_context_default_params()
        params.flash_attn_type = {
            None: lc.LLAMA_FLASH_ATTN_TYPE_AUTO,
            False: lc.LLAMA_FLASH_ATTN_TYPE_DISABLED,
            True: lc.LLAMA_FLASH_ATTN_TYPE_ENABLED,
        }[flash_attn]
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_threads = threads
        params.n_threads_batch = threads
        params.no_perf = True
        params.n_outputs_max = min(n_outputs_max, n_batch)
        self.n_outputs_max = params.n_outputs_max
        self.model = model
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.flash_attn = flash_attn  # as asked (None: llama.cpp's choice)
        self._site = crash_site or CrashSite()
        self._decode_site = decode_site
        self._site.mark(Site.LOAD_DRAFT if decode_site == Site.DRAFT else Site.LOAD_TARGET)
        self._ctx = lc.llama_init_from_model(model._model, params)
        self._site.mark(Site.IDLE)
        if not self._ctx:
            raise EngineError(
                f"llama.cpp could not create a {n_ctx}-token context for {model.path.name}",
                "lower n_ctx in models.toml or free memory",
            )
        self._mem = lc.llama_get_memory(self._ctx)
        self._batch = b = lc.llama_batch_init(n_batch, 0, 1)
        # The batch's arrays as numpy views, filled with one slice assignment per decode (per
        # token through ctypes, a 2,000-token prompt spent milliseconds in Python). Every token
        # is in sequence 0: set once.
        self._b_token = np.ctypeslib.as_array(b.token, shape=(n_batch,))
        self._b_pos = np.ctypeslib.as_array(b.pos, shape=(n_batch,))
        self._b_logits = np.ctypeslib.as_array(b.logits, shape=(n_batch,))
        np.ctypeslib.as_array(b.n_seq_id, shape=(n_batch,))[:] = 1
        for i in range(n_batch):
            b.seq_id[i][0] = 0
        self.tokens: list[int] = []
        self.decode_seconds = 0.0  # in llama_decode and awaiting its results (step_overhead.py)

    def _keep(self, n: int) -> None:
        if n < len(self.tokens):
            if not lc.llama_memory_seq_rm(self._mem, 0, n, -1):
                # Recurrent state cannot drop a suffix: start over (the engine avoids this path).
                LOG.warning(
                    "%s: llama.cpp could not drop positions %d.. from the cache; "
                    "clearing it (the next decode re-reads the whole history)",
                    self.model.path.name,
                    n,
                )
                lc.llama_memory_clear(self._mem, True)
                n = 0
            del self.tokens[n:]

    def extend(
        self,
        history: list[int],
        n_logits: int = 1,
        while_waiting: Callable[[], None] | None = None,
    ) -> np.ndarray:
        """Logits (n_logits × n_vocab, float32) for the last n_logits positions of `history`:
        a read-only view of llama.cpp's buffer, valid until this context's next extend or
        clear (copy what must outlive it). A verify step reads only the rows up to its first
        rejection; copying all of them cost 2 ms a step for 20 drafts here (fresh pages for
        4 MB), more than a whole 64-token verify on a GPU. `while_waiting`: see Target.extend."""
        if len(history) > self.n_ctx:
            raise RequestError(
                f"{len(history)} tokens do not fit the {self.n_ctx}-token context",
                "shorten the prompt or raise n_ctx in models.toml",
            )
        if not 1 <= n_logits <= min(len(history), self.n_outputs_max):
            raise ValueError(
                f"n_logits={n_logits} out of range (n_outputs_max {self.n_outputs_max})"
            )
        # The last n_logits positions are decoded again even when cached: their logits.
        common = shared_prefix(self.tokens, history, len(history) - n_logits)
        self._keep(common)
        # Chunk so that the last chunk holds every position whose logits are wanted.
        split = len(history) - min(len(history) - common, self.n_batch)
        first_logit = len(history) - n_logits
        for start in range(common, split, self.n_batch):
            self._decode(history, start, min(start + self.n_batch, split), first_logit)
        self._decode(history, split, len(history), first_logit)
        if while_waiting is not None:
            try:
                while_waiting()
            except BaseException:
                lc.llama_synchronize(self._ctx)  # nothing of this context left in flight
                raise
        # Reading the logits waits for the decode (on a GPU llama_decode only queues it)
        t0 = time.perf_counter()
        address = ctypes.cast(lc.llama_get_logits(self._ctx), ctypes.c_void_p).value
        self.decode_seconds += time.perf_counter() - t0
        if not address:
            raise EngineError("llama.cpp returned no logits after a decode", "report this bug")
        rows = (ctypes.c_float * (n_logits * self.model.n_vocab)).from_address(address)
        flat = np.frombuffer(memoryview(rows), dtype=np.float32)
        logits = flat.reshape(n_logits, self.model.n_vocab)
        logits.flags.writeable = False
        return logits

    def _decode(self, history: list[int], start: int, end: int, first_logit: int) -> None:
        b, n = self._batch, end - start
        self._b_token[:n] = history[start:end]
        self._b_pos[:n] = np.arange(start, end)
        self._b_logits[:n] = 0
        self._b_logits[max(0, first_logit - start) : n] = 1
        b.n_tokens = n
        self._site.mark(self._decode_site)
        t0 = time.perf_counter()
        rc = lc.llama_decode(self._ctx, b)
        self.decode_seconds += time.perf_counter() - t0
        self._site.mark(Site.IDLE)
        if rc != 0:
            self._keep(start)
            raise EngineError(
                f"llama_decode failed with code {rc} at positions {start}..{end}",
                "the context may be full or out of memory; lower n_ctx or max_tokens",
            )
        self.tokens.extend(history[start:end])

    def touch_peak(self) -> None:
        """Fill the whole context once, the last batch asking for n_outputs_max logits, then
        clear it: afterwards the process has touched every buffer a request can grow into, so
        a memory measurement taken now is the worst case, not the idle case."""
        filler = [self.model.filler_token] * self.n_ctx
        self.clear()
        self.extend(filler, min(self.n_outputs_max, self.n_ctx))
        self.clear()

    def warm_up(self) -> None:
        """The model's first decode (a few tokens), then an empty cache: the first native
        compute happens now, not inside a request."""
        n = min(4, self.n_ctx, self.n_outputs_max)
        self.extend([self.model.filler_token] * n, n)
        self.clear()

    def set_threads(self, n: int) -> None:
        """CPU threads for the next decodes (llama.cpp allows a change between two decodes)."""
        lc.llama_set_n_threads(self._ctx, n, n)

    def snapshot_size(self) -> int:
        """The bytes snapshot() takes now (llama.cpp sizes the state without copying it)."""
        return int(lc.llama_state_seq_get_size(self._ctx, 0))

    def snapshot(self) -> bytearray:
        """A copy of the cache (llama.cpp's state of sequence 0: its cells, K and V) for
        restore(); engine/prompt_cache.py keeps them. Empty where llama.cpp could not copy
        it all (nothing is kept then: a cache is an optimisation, the request goes on)."""
        size = self.snapshot_size()
        data = bytearray(size)
        got = lc.llama_state_seq_get_data(
            self._ctx, (ctypes.c_uint8 * size).from_buffer(data), size, 0
        )
        if got != size:
            LOG.warning(
                "%s: llama.cpp copied %d of %d bytes of the cache; not kept",
                self.model.path.name,
                got,
                size,
            )
            return bytearray()
        return data

    def restore(self, tokens: list[int], data: bytearray) -> bool:
        """Make the cache hold `tokens` again from the snapshot() taken when it held them (or
        from another context's of a model of the same cache_shape: engine/cache_share.py);
        False and an empty cache where llama.cpp cannot take it (the next extend re-reads
        them)."""
        self.clear()
        buf = (ctypes.c_uint8 * len(data)).from_buffer(data)
        if lc.llama_state_seq_set_data(self._ctx, buf, len(data), 0) != len(data):
            LOG.warning(
                "%s: llama.cpp could not take a %d-token cache copy; re-reading it",
                self.model.path.name,
                len(tokens),
            )
            self.clear()
            return False
        self.tokens = list(tokens)
        return True

    def clear(self) -> None:
        """Forget everything cached (the next extend() evaluates its whole history)."""
        lc.llama_memory_clear(self._mem, True)
        self.tokens.clear()

    def close(self) -> None:
        if self._ctx:
            lc.llama_batch_free(self._batch)
            lc.llama_free(self._ctx)
            self._ctx = None


def quantize(src: Path, dst: Path, file_type: str, *, threads: int = 0) -> None:
    """llama.cpp's quantizer (requantizing allowed): writes `dst` atomically."""
    init_backend()
    params = lc.llama_model_quantize_default_params()
    params.ftype = FILE_TYPES[file_type]
    params.allow_requantize = True
    params.nthread = threads
    tmp = dst.with_name(dst.name + ".partial")
    rc = lc.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise EngineError(
            f"llama.cpp could not convert {src} to {file_type} (code {rc})",
            "check that the source is a valid GGUF and the disk has room",
        )
    os.replace(tmp, dst)
