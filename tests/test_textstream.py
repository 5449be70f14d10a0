from __future__ import annotations

from homespec.engine.textstream import TextStream


def _feed_all(ts: TextStream, pieces: list[bytes]) -> str:
    out = "".join(ts.feed(p) for p in pieces)
    return out + ts.flush()


def test_utf8_split_across_tokens_is_reassembled() -> None:
    raw = "héllo → 🙂".encode()
    pieces = [raw[i : i + 1] for i in range(len(raw))]  # one byte per "token"
    assert _feed_all(TextStream(), pieces) == "héllo → 🙂"


def test_stop_string_split_across_tokens_is_cut_and_never_released() -> None:
    ts = TextStream(stop=["END"])
    released = [ts.feed(b"abc E"), ts.feed(b"N"), ts.feed(b"D tail")]
    assert "".join(released) == "abc "
    assert ts.stopped
    assert ts.flush() == ""
    assert ts.text == "abc "


def test_false_stop_prefix_is_released_later() -> None:
    ts = TextStream(stop=["END"])
    assert ts.feed(b"x E") == "x "
    assert ts.feed(b"nd") == "End"
    assert not ts.stopped


def test_unfinished_stop_prefix_is_text_at_the_end() -> None:
    ts = TextStream(stop=["</s>"])
    assert _feed_all(ts, [b"a </"]) == "a </"
