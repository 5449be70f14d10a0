from __future__ import annotations

from pathlib import Path

import pytest

from homespec import gguf_meta
from homespec.errors import IncompatiblePairError, ModelFileError
from homespec.gguf_meta import check_pair, compatibility_problems, read_gguf

from .conftest import write_tiny_gguf


def test_reads_real_model_metadata(draft_path: Path) -> None:
    info = read_gguf(draft_path)
    assert info.architecture == "llama"
    assert info.vocab_size == 49152
    assert info.block_count == 30
    assert (info.bos_id, info.eos_id) == (1, 2)
    assert info.tokens[2] == "<|im_end|>"
    assert 130e6 < info.n_params < 140e6
    assert not info.recurrent


def test_demo_pair_is_compatible(draft_path: Path, target_path: Path) -> None:
    assert compatibility_problems(read_gguf(target_path), read_gguf(draft_path)) == []


@pytest.mark.parametrize(
    ("kw", "rule"),
    [
        ({"vocab_type": "llama"}, "vocab types differ"),
        ({"bos": 7}, "BOS id differs"),
        ({"eos": 9}, "EOS id differs"),
        ({"add_bos": True}, "add_bos differs"),
        ({"tokens": [f"t{i}" for i in range(600)]}, "vocab sizes differ by 300 (limit 128)"),
        (
            {"tokens": [f"t{i}" for i in range(42)] + ["X"] + [f"t{i}" for i in range(43, 300)]},
            "token 42 differs",
        ),
    ],
)
def test_each_compatibility_rule_is_named(tmp_path: Path, kw: dict, rule: str) -> None:  # type: ignore[type-arg]
    target = read_gguf(write_tiny_gguf(tmp_path / "t.gguf"))
    draft = read_gguf(write_tiny_gguf(tmp_path / "d.gguf", **kw))
    with pytest.raises(IncompatiblePairError) as e:
        check_pair("p", target, draft)
    assert rule in str(e.value)
    assert "ngram" in str(e.value)  # says what to do


def test_small_vocab_difference_within_limit_is_fine(tmp_path: Path) -> None:
    target = read_gguf(write_tiny_gguf(tmp_path / "t.gguf"))
    draft = read_gguf(write_tiny_gguf(tmp_path / "d.gguf", tokens=[f"t{i}" for i in range(400)]))
    assert compatibility_problems(target, draft) == []


def test_special_tokens_below_id_5_may_differ(tmp_path: Path) -> None:
    target = read_gguf(write_tiny_gguf(tmp_path / "t.gguf"))
    toks = ["<s>", "x", "y", "z", "w"] + [f"t{i}" for i in range(5, 300)]
    draft = read_gguf(write_tiny_gguf(tmp_path / "d.gguf", tokens=toks))
    assert compatibility_problems(target, draft) == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "file is empty"),
        (b"hello, I am a text file\n", "not a GGUF file"),
        (b"GGUF\x03\x00\x00\x00\xff", "truncated or corrupt"),
        (bytes(range(256)) * 10, "not a GGUF file"),
    ],
)
def test_bad_files_get_clear_errors(tmp_path: Path, content: bytes, message: str) -> None:
    p = tmp_path / "bad.gguf"
    p.write_bytes(content)
    with pytest.raises(ModelFileError, match=message):
        read_gguf(p)


def test_truncated_real_model_is_detected(tmp_path: Path, draft_path: Path) -> None:
    p = tmp_path / "cut.gguf"
    with draft_path.open("rb") as src:
        p.write_bytes(src.read(draft_path.stat().st_size // 2))
    with pytest.raises(ModelFileError, match="truncated GGUF: tensor"):
        read_gguf(p)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="not found"):
        read_gguf(tmp_path / "nope.gguf")


def test_large_vocab_is_read_and_compared_without_a_string_per_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 200k-token vocabulary (Gemma 3 has 262k) is counted and compared as raw bytes: no
    Python string is built per token (gguf.GGUFReader, which does, took ~4.5 s on 150k tokens;
    this reads it in ~0.06 s). Checked by counting the strings decoded, not by a clock.

    Metadata only: the file's size does not matter, tensors are never read (mmap).
    """
    tokens = [f"tok{i}" for i in range(200_000)]
    p = write_tiny_gguf(tmp_path / "big.gguf", tokens=tokens)
    decoded = 0
    string, item = gguf_meta._Cursor.string, gguf_meta.TokenTable.raw

    def counted_string(self: gguf_meta._Cursor) -> str:
        nonlocal decoded
        decoded += 1
        return string(self)

    def counted_item(self: gguf_meta.TokenTable, i: int) -> bytes:
        nonlocal decoded
        decoded += 1
        return item(self, i)

    monkeypatch.setattr(gguf_meta._Cursor, "string", counted_string)
    monkeypatch.setattr(gguf_meta.TokenTable, "raw", counted_item)
    info = read_gguf(p)
    assert info.vocab_size == 200_000
    assert compatibility_problems(info, info) == []
    assert decoded < 100  # the metadata keys and a few string values, not the vocabulary
    assert info.tokens[199_999] == "tok199999" and info.tokens[-1] == "tok199999"


def test_recurrent_target_is_planned_plain_before_loading(tmp_path: Path) -> None:
    from homespec.manifest import parse_manifest
    from homespec.pairs import inspect_pair

    write_tiny_gguf(tmp_path / "mamba.gguf", arch="mamba")
    write_tiny_gguf(tmp_path / "draft.gguf")
    manifest = parse_manifest(
        '[models.t]\npath = "mamba.gguf"\n[models.d]\npath = "draft.gguf"\n'
        '[pairs.p]\ntarget = "t"\ndraft = "d"\n',
        tmp_path / "models.toml",
    )
    files = inspect_pair(manifest, "p")
    assert files.draft is None
    assert "'mamba' is recurrent" in files.plain_only_reason
