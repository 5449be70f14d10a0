"""The API key as the daemon reads it (--api-key-file, $HOMESPEC_API_KEY) and as the CLI's
client sends it: one line of printable ASCII, since clients carry it in an HTTP header."""

from __future__ import annotations

from pathlib import Path

import pytest

from homespec.client import DaemonClient
from homespec.daemon.serve import read_api_key
from homespec.errors import ConfigError


def test_a_key_file_is_read_stripped_and_the_environment_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = tmp_path / "key"
    key.write_text("  s3cret-KEY_1 \r\n")
    assert read_api_key(key) == "s3cret-KEY_1"
    key.write_bytes(b"\xef\xbb\xbfs3cret\r\n")  # as Notepad saves it, byte order mark first
    assert read_api_key(key) == "s3cret"
    monkeypatch.setenv("HOMESPEC_API_KEY", "abc \n")
    assert read_api_key(None) == "abc"
    assert DaemonClient("http://x").headers == {"Authorization": "Bearer abc"}
    monkeypatch.setenv("HOMESPEC_API_KEY", "")
    assert read_api_key(None) is None and DaemonClient("http://x").headers == {}


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"k3y\n# rotated 2026-12\n", "holds a line break"),
        ("caf\u00e9".encode(), "holds the character '\u00e9'"),
        (b"a\tb", r"holds the character '\t'"),
        (b"caf\xe9", "is not text"),
        (b" \n", "is empty"),
    ],
    ids=["two-lines", "non-ascii", "tab", "not-utf8", "empty"],
)
def test_a_key_no_client_can_send_is_refused_at_start(
    tmp_path: Path, content: bytes, needle: str
) -> None:
    """Such a key started a daemon that refused every request with 401."""
    key = tmp_path / "key"
    key.write_bytes(content)
    with pytest.raises(ConfigError, match=f"--api-key-file {key}"):
        read_api_key(key)
    with pytest.raises(ConfigError) as err:
        read_api_key(key)
    assert needle in str(err.value)


def test_the_client_names_a_key_it_cannot_send(monkeypatch: pytest.MonkeyPatch) -> None:
    """It was a UnicodeEncodeError traceback from httpx at the first request."""
    monkeypatch.setenv("HOMESPEC_API_KEY", "caf\u00e9")
    with pytest.raises(ConfigError, match="HOMESPEC_API_KEY: the API key holds the character"):
        DaemonClient("http://x")
    with pytest.raises(ConfigError, match="HOMESPEC_API_KEY: the API key holds the character"):
        read_api_key(None)
