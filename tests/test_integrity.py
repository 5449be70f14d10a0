"""The optional sha256 check of model files: remembered once it passed, and a cache that cannot
be written only means checking again, never a traceback."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from homespec.errors import ModelFileError
from homespec.integrity import CACHE_NAME, verify_sha256


@pytest.fixture()
def model(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + bytes(100))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_matching_file_passes_and_is_remembered(model: tuple[Path, str], tmp_path: Path) -> None:
    path, digest = model
    verify_sha256(path, digest.upper(), "m")
    assert digest in (tmp_path / "home" / CACHE_NAME).read_text()


def test_a_mismatch_names_the_model_the_file_and_both_digests(model: tuple[Path, str]) -> None:
    path, digest = model
    with pytest.raises(ModelFileError, match=rf"model 'm': {path} has sha256 {digest}"):
        verify_sha256(path, "0" * 64, "m")


def test_an_unwritable_cache_still_passes_the_check(
    model: tuple[Path, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "home" / CACHE_NAME).mkdir(parents=True)  # not a file: every write fails
    path, digest = model
    verify_sha256(path, digest, "m")
    assert "could not remember the sha256 check" in caplog.text


@pytest.mark.parametrize("damaged", ["[1, 2]", '"text"', "{not json"])
def test_a_damaged_cache_only_means_checking_again(
    model: tuple[Path, str], tmp_path: Path, damaged: str
) -> None:
    """A cache that is JSON but no object was a traceback at every load (`list.get`)."""
    cache = tmp_path / "home" / CACHE_NAME
    cache.parent.mkdir(parents=True)
    cache.write_text(damaged)
    path, digest = model
    verify_sha256(path, digest, "m")
    assert digest in cache.read_text()
