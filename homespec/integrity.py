"""Optional sha256 checks of model files, done once per (path, size, mtime) and remembered."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from homespec.errors import ModelFileError
from homespec.paths import home_dir

LOG = logging.getLogger("homespec.integrity")
CACHE_NAME = "sha256-verified.json"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"


def verify_sha256(path: Path, expected: str | None, model: str) -> None:
    """Raise ModelFileError when `expected` is set and the file does not match it."""
    if not expected:
        return
    cache_path = home_dir() / CACHE_NAME
    try:
        cache: dict[str, str] = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    if not isinstance(cache, dict):  # damaged: checked again, and written anew below
        cache = {}
    key = _key(path)
    if cache.get(key) == expected.lower():
        return
    actual = file_sha256(path)
    if actual != expected.lower():
        raise ModelFileError(
            f"model {model!r}: {path} has sha256 {actual}, models.toml expects {expected}",
            "the file is corrupt or a different version: re-download it (`homespec setup`)",
        )
    cache[key] = actual
    tmp = cache_path.with_name(f"{CACHE_NAME}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(cache, indent=0))
        os.replace(tmp, cache_path)
    except OSError as exc:  # the check passed; not remembering it only costs a re-hash later
        LOG.warning("could not remember the sha256 check of %s in %s: %s", path, cache_path, exc)
        tmp.unlink(missing_ok=True)
