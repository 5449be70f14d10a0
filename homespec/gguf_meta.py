"""GGUF metadata, read by a small mmap parser (the `gguf` package gives the type constants; its
reader was too slow on large vocabularies), and llama.cpp's pair-compatibility rules.

Reading metadata never loads weights, so `ask`, `doctor` and `setup` can refuse a bad file or an
incompatible pair before llama.cpp allocates anything.
"""

from __future__ import annotations

import math
import mmap
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from homespec.errors import IncompatiblePairError, ModelFileError

GGUF_MAGIC = b"GGUF"
# Architectures whose state cannot be rolled back to an earlier position (no partial KV removal).
RECURRENT_ARCHS = frozenset(
    {
        "mamba",
        "mamba2",
        "rwkv6",
        "rwkv6qwen2",
        "rwkv7",
        "arwkv7",
        "jamba",
        "falcon-h1",
        "granitehybrid",
        "plamo2",
        "nemotron_h",
        "lfm2",
        "qwen3next",
    }
)
# llama.cpp's common/speculative.cpp: vocab sizes may differ this much, token text is compared
# from this id up (the first ids are special tokens that differ harmlessly between sizes).
VOCAB_SIZE_MAX_DIFF = 128
VOCAB_CHECK_START_ID = 5


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    architecture: str
    name: str
    file_type: int | None
    block_count: int
    context_length: int
    embedding_length: int
    vocab_type: str
    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    add_bos: bool | None
    add_eos: bool | None
    tokens: Sequence[str] = field(repr=False)
    tensor_bytes: int = 0
    n_params: int = 0
    # What the memory planner needs (docs/ARCHITECTURE.md, "Memory").
    n_head: int = 0
    n_head_kv: tuple[int, ...] = ()  # per layer (GGUF allows a scalar or an array)
    key_length: int = 0
    value_length: int = 0
    n_ff: int = 0
    sliding_window: int = 0
    layer_bytes: tuple[int, ...] = ()  # tensor bytes of blk.N.*, by N
    embd_bytes: int = 0  # token_embd.weight: stays on the CPU
    output_bytes: int = 0  # output.weight; 0 when tied to the token embedding
    other_bytes: int = 0  # output_norm and the rest, outside the layers

    @property
    def recurrent(self) -> bool:
        return self.architecture in RECURRENT_ARCHS


_U64 = struct.Struct("<Q")


class TokenTable(Sequence[str]):
    """A GGUF string array kept as raw bytes: a 150k+ token vocabulary is counted and compared
    without building a Python string per token; `table[i]` decodes one on demand."""

    def __init__(self, raw: bytes, offsets: list[int]) -> None:
        self._raw = raw
        self._offsets = offsets  # start of item i; item i ends at offsets[i + 1] - 8

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def span(self, start: int, end: int) -> bytes:
        """Items start..end-1 as stored (length-prefixed): equal spans mean equal items."""
        return self._raw[self._offsets[start] - 8 : self._offsets[end] - 8]

    def raw(self, i: int) -> bytes:
        return self._raw[self._offsets[i] : self._offsets[i + 1] - 8]

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        return self.raw(i % len(self)).decode("utf-8", "replace")


class _Cursor:
    """Sequential little-endian reads over a mapped file; IndexError/struct.error on truncation."""

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf = buf
        self.pos = 0

    def unpack(self, fmt: str) -> Any:
        value = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return value[0] if len(value) == 1 else value

    def string(self) -> str:
        n = self.unpack("Q")
        if self.pos + n > len(self.buf):
            raise IndexError("string runs past the end of the file")
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", "replace")

    def string_table(self, count: int) -> TokenTable:
        """`count` strings, located in one pass and decoded only when asked for."""
        unpack = _U64.unpack_from
        buf, pos, size = self.buf, self.pos, len(self.buf)
        start = pos
        offsets = [0] * (count + 1)
        for i in range(count):
            (n,) = unpack(buf, pos)
            offsets[i] = pos + 8 - start
            pos += 8 + n
            if pos > size:
                raise IndexError("string array runs past the end of the file")
        offsets[count] = pos + 8 - start  # so item i ends 8 bytes before offsets[i + 1]
        self.pos = pos
        return TokenTable(bytes(buf[start:pos]), offsets)

    def value(self, vtype: int) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            itype, count = self.unpack("I"), self.unpack("Q")
            if itype == GGUFValueType.STRING:
                return self.string_table(count)
            if itype in _SCALAR_FORMATS:
                fmt = _SCALAR_FORMATS[itype]
                size = struct.calcsize(fmt) * count
                if self.pos + size > len(self.buf):
                    raise IndexError("array runs past the end of the file")
                # Numeric arrays (token types, scores) are read in one numpy call, not per item.
                arr = np.frombuffer(self.buf, dtype="<" + fmt, count=count, offset=self.pos).copy()
                self.pos += size
                return arr
            return [self.value(itype) for _ in range(count)]
        if vtype in _SCALAR_FORMATS:
            return self.unpack(_SCALAR_FORMATS[vtype])
        raise ValueError(f"unknown GGUF value type {vtype}")


_SCALAR_FORMATS: dict[int, str] = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}


def _parse(buf: mmap.mmap) -> tuple[dict[str, Any], list[tuple[str, int, int, int]]]:
    """(metadata, [(tensor name, absolute data offset, n_bytes, n_elements)])."""
    cur = _Cursor(buf)
    cur.pos = 4
    version = cur.unpack("I")
    if version not in (2, 3):
        raise ValueError(f"unsupported GGUF version {version}")
    n_tensors, n_kv = cur.unpack("Q"), cur.unpack("Q")
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        meta[key] = cur.value(cur.unpack("I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.unpack("I")
        dims = [cur.unpack("Q") for _ in range(n_dims)]
        ggml_type, offset = cur.unpack("I"), cur.unpack("Q")
        n_elements = math.prod(dims)
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        infos.append((name, offset, n_elements * type_size // block, n_elements))
    align = int(meta.get("general.alignment", 32))
    data_start = (cur.pos + align - 1) // align * align
    return meta, [(n, data_start + off, nb, ne) for n, off, nb, ne in infos]


_LAYER_TENSOR = re.compile(r"^blk\.(\d+)\.")


def _int_key(meta: dict[str, Any], key: str) -> int | None:
    v = meta.get(key)
    return int(v) if isinstance(v, int | float) else None


def _max_int(v: Any) -> int:
    """A scalar, or the largest entry of a per-layer array (0 when absent)."""
    if isinstance(v, int | float):
        return int(v)
    if isinstance(v, np.ndarray | list) and len(v):
        return int(max(v))
    return 0


def _per_layer(v: Any, default: int, n_layers: int) -> tuple[int, ...]:
    if isinstance(v, np.ndarray | list) and len(v) == n_layers:
        return tuple(int(x) for x in v)
    value = int(v) if isinstance(v, int | float) else default
    return (value,) * n_layers


def read_gguf(path: Path) -> GGUFInfo:
    """Metadata of one GGUF file, or a ModelFileError that says what is wrong with it."""
    hint = "re-download or re-derive the file (`homespec setup`)"
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            magic = fh.read(4)
            if size == 0:
                raise ModelFileError(f"{path}: file is empty", hint)
            if magic != GGUF_MAGIC:
                raise ModelFileError(
                    f"{path}: not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})",
                    "point models.toml at a .gguf model file",
                )
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                meta, tensors = _parse(buf)
    except FileNotFoundError:
        raise ModelFileError(f"{path}: not found", "check the path in models.toml") from None
    except IsADirectoryError:
        raise ModelFileError(f"{path}: is a directory", "point at a .gguf file") from None
    except (IndexError, struct.error, ValueError, KeyError, OverflowError) as exc:
        raise ModelFileError(f"{path}: truncated or corrupt GGUF ({exc})", hint) from None
    except PermissionError as exc:
        raise ModelFileError(f"{path}: cannot read: {exc}", "check permissions") from None

    tensor_bytes = 0
    n_params = 0
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelFileError(f"{path}: GGUF has no general.architecture", hint)
    block_count = _int_key(meta, f"{arch}.block_count") or 0
    layer_bytes = [0] * block_count
    named: dict[str, int] = {}
    for name, offset, n_bytes, n_elements in tensors:
        if offset + n_bytes > size:
            raise ModelFileError(
                f"{path}: truncated GGUF: tensor {name!r} ends at byte {offset + n_bytes:,} "
                f"but the file has {size:,}",
                hint,
            )
        tensor_bytes += n_bytes
        n_params += n_elements
        m = _LAYER_TENSOR.match(name)
        if m and int(m.group(1)) < block_count:
            layer_bytes[int(m.group(1))] += n_bytes
        else:
            named[name] = named.get(name, 0) + n_bytes
    embd_bytes = named.pop("token_embd.weight", 0)
    output_bytes = named.pop("output.weight", 0)
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, TokenTable) or not len(tokens):
        found = "has none" if tokens is None else "is not a list of strings"
        raise ModelFileError(
            f"{path}: malformed tokenizer: tokenizer.ggml.tokens {found}",
            "this file cannot generate text: re-download or re-derive it",
        )

    def _int(key: str) -> int | None:
        return _int_key(meta, key)

    def _bool(key: str) -> bool | None:
        v = meta.get(key)
        return bool(v) if isinstance(v, bool | int) else None

    embedding_length = _int(f"{arch}.embedding_length") or 0
    n_head = _max_int(meta.get(f"{arch}.attention.head_count"))
    head_dim = embedding_length // n_head if n_head else 0
    return GGUFInfo(
        path=path,
        architecture=arch,
        name=str(meta.get("general.name") or path.stem),
        file_type=_int("general.file_type"),
        block_count=block_count,
        context_length=_int(f"{arch}.context_length") or 0,
        embedding_length=embedding_length,
        vocab_type=str(meta.get("tokenizer.ggml.model") or "none"),
        vocab_size=len(tokens),
        bos_id=_int("tokenizer.ggml.bos_token_id"),
        eos_id=_int("tokenizer.ggml.eos_token_id"),
        add_bos=_bool("tokenizer.ggml.add_bos_token"),
        add_eos=_bool("tokenizer.ggml.add_eos_token"),
        tokens=tokens,
        tensor_bytes=tensor_bytes,
        n_params=n_params,
        n_head=n_head,
        n_head_kv=_per_layer(meta.get(f"{arch}.attention.head_count_kv"), n_head, block_count),
        key_length=_int(f"{arch}.attention.key_length") or head_dim,
        value_length=_int(f"{arch}.attention.value_length") or head_dim,
        n_ff=_max_int(meta.get(f"{arch}.feed_forward_length")),
        sliding_window=_int(f"{arch}.attention.sliding_window") or 0,
        layer_bytes=tuple(layer_bytes),
        embd_bytes=embd_bytes,
        output_bytes=output_bytes,
        other_bytes=sum(named.values()),
    )


def compatibility_problems(target: GGUFInfo, draft: GGUFInfo) -> list[str]:
    """llama.cpp's rules for a draft model (common/speculative.cpp); empty when compatible."""
    problems = []
    if target.vocab_type != draft.vocab_type:
        problems.append(
            f"vocab types differ: target {target.vocab_type!r}, draft {draft.vocab_type!r}"
        )
    for what, t, d in (
        ("add_bos", target.add_bos, draft.add_bos),
        ("BOS id", target.bos_id, draft.bos_id),
        ("add_eos", target.add_eos, draft.add_eos),
        ("EOS id", target.eos_id, draft.eos_id),
    ):
        if t != d:
            problems.append(f"{what} differs: target {t}, draft {d}")
    diff = abs(target.vocab_size - draft.vocab_size)
    if diff > VOCAB_SIZE_MAX_DIFF:
        problems.append(
            f"vocab sizes differ by {diff:,} (limit {VOCAB_SIZE_MAX_DIFF}): "
            f"target {target.vocab_size:,}, draft {draft.vocab_size:,}"
        )
    else:
        n = min(target.vocab_size, draft.vocab_size)
        tt, dt = target.tokens, draft.tokens
        same_bytes = (  # one comparison of the stored bytes before walking token by token
            isinstance(tt, TokenTable)
            and isinstance(dt, TokenTable)
            and tt.span(VOCAB_CHECK_START_ID, n) == dt.span(VOCAB_CHECK_START_ID, n)
        )
        for i in range(VOCAB_CHECK_START_ID, 0 if same_bytes else n):
            if _raw_token(target, i) != _raw_token(draft, i):
                problems.append(
                    f"token {i} differs: target {target.tokens[i]!r}, draft {draft.tokens[i]!r}"
                )
                break
    return problems


def _raw_token(info: GGUFInfo, i: int) -> bytes:
    t = info.tokens
    return t.raw(i) if isinstance(t, TokenTable) else t[i].encode()


def check_pair(pair: str, target: GGUFInfo, draft: GGUFInfo) -> None:
    problems = compatibility_problems(target, draft)
    if problems:
        raise IncompatiblePairError(
            f"pair {pair!r}: draft {draft.path.name} cannot draft for target {target.path.name}: "
            + "; ".join(problems),
            "pick a draft from the target's family, derive one (`homespec models derive`), "
            'or set draft = "ngram"',
        )
