"""Whether a model may load with llama.cpp's repacked weights on this machine: the canary's verdict.

On some CPUs with AMX, llama.cpp repacks quantized weights into its AMX buffer type and the first
matrix multiply there segfaults (llama.cpp issue 20824, unfixed); the same file works when loaded
with `use_extra_bufts = false`. Whether a box is affected depends on the CPU and the llama.cpp
build, so homespec asks the box: it runs the model's first decode in a throwaway process
(engine/canary.py) with repacking on, and if that dies by a signal, once more with it off.

- passes with repacking: keep it (machines where it works keep the speed it gives);
- crashes with it and passes without: load this model without repacking, and say so;
- crashes both ways: the model cannot run on this machine and build (an EngineError);
- fails without crashing (llama.cpp refuses the file): no verdict; the real load reports it.

The verdict is remembered per (llama.cpp build, CPU, file, GPU layers) in the cache directory, so
only the first load on a machine pays for the canary. A model's `repack = true | false` in
models.toml skips the canary. This module never imports llama_cpp.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata, util
from pathlib import Path

from homespec.errors import EngineError
from homespec.paths import cache_dir

LOG = logging.getLogger("homespec.canary")
CACHE_NAME = "canary.json"
CANARY_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Verdict:
    repack: bool
    source: str  # "models.toml", "canary", "remembered", or "unchecked: <why>"
    # Set when the repacked canary crashed: what a user should read once.
    note: str = ""


@dataclass(frozen=True)
class CanaryRun:
    """One canary process: its exit status (negative: the signal that killed it) and stderr."""

    returncode: int
    stderr: str

    @property
    def crashed(self) -> bool:
        return self.returncode < 0

    @property
    def signal_name(self) -> str:
        return signal_name(self.returncode)


def signal_name(returncode: int) -> str:
    """`-11` → `SIGSEGV`; a non-negative code → `exit N`."""
    if returncode >= 0:
        return f"exit {returncode}"
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def run_canary(path: Path, gpu_layers: int, repack: bool) -> CanaryRun:
    cmd = [
        sys.executable,
        "-m",
        "homespec.engine.canary",
        str(path),
        "--gpu-layers",
        str(gpu_layers),
        "--repack",
        "on" if repack else "off",
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=CANARY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return CanaryRun(1, f"the canary did not finish in {CANARY_TIMEOUT_S:.0f} s")
    return CanaryRun(done.returncode, done.stderr.strip())


def _lib_dir() -> Path | None:
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    if override:
        return Path(override)
    spec = util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def build_id() -> str:
    """llama-cpp-python's version and its shared libraries' sizes and times."""
    try:
        version = metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        version = "unknown"
    libs = []
    lib_dir = _lib_dir()
    if lib_dir is not None and lib_dir.is_dir():
        for lib in sorted(lib_dir.iterdir()):
            if ".so" in lib.name or lib.suffix == ".dylib":
                st = lib.stat()
                libs.append(f"{lib.name}:{st.st_size}:{st.st_mtime_ns}")
    return version + "|" + hashlib.sha256("|".join(libs).encode()).hexdigest()[:16]


def cpu_id() -> str:
    """The CPU model and feature flags (what decides which kernels llama.cpp picks)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    break  # the first processor is enough
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "flags", "Features", "CPU part"):
                    fields[key.strip()] = value.strip()
    except OSError:
        pass
    text = json.dumps(fields or {"machine": platform.machine(), "cpu": platform.processor()})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_key(path: Path, gpu_layers: int) -> str:
    st = path.stat()
    return f"{build_id()}|{cpu_id()}|{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|gpu{gpu_layers}"


def read_cache(file: Path) -> dict[str, dict[str, object]]:
    """The remembered verdicts by key; a damaged file or entry is none (measured again), where
    an entry that was no object was a traceback at every load."""
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)}


def remember(file: Path, key: str, entry: dict[str, object], model_file: Path) -> None:
    """Best effort: a read-only cache only means the canary (or flash attention's measurement,
    engine/flash.py) runs again next time. Verdicts on model files that are gone are dropped
    as the cache is written (a model deleted or moved, a test's scratch copy): they can never
    be asked for again, and the cache is read at every load."""
    cache = {k: v for k, v in read_cache(file).items() if not _gone(v)}
    cache[key] = {**entry, "file": str(model_file.resolve())}
    tmp = file.with_name(f"{file.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(cache, indent=1))
        os.replace(tmp, file)
    except OSError as exc:
        LOG.warning("could not remember a verdict in %s: %s", file, exc)


def _gone(entry: object) -> bool:
    """An entry about a model file that no longer exists (entries from before the file was
    recorded in them stay)."""
    name = entry.get("file") if isinstance(entry, dict) else None
    return isinstance(name, str) and not Path(name).exists()


Runner = Callable[[Path, int, bool], CanaryRun]


def verdict(
    model: str,
    path: Path,
    *,
    gpu_layers: int,
    override: bool | None = None,
    runner: Runner = run_canary,
    cache_file: Path | None = None,
) -> Verdict:
    """The verdict for `model` (its manifest name) at `path`; may run one or two canaries."""
    if override is not None:
        return Verdict(override, "models.toml")
    cache_file = cache_file or cache_dir() / CACHE_NAME
    key = cache_key(path, gpu_layers)
    known = read_cache(cache_file).get(key) or {}
    if known.get("broken"):
        raise EngineError(str(known["broken"]), _BROKEN_HINT)
    if isinstance(known.get("repack"), bool):
        return Verdict(bool(known["repack"]), "remembered", str(known.get("note", "")))
    LOG.info("canary: first decode of %s in a separate process…", model)
    first = runner(path, gpu_layers, True)
    if first.returncode == 0:
        remember(cache_file, key, {"repack": True, "model": model}, path)
        return Verdict(True, "canary")
    if not first.crashed:  # llama.cpp refused the file, or the logits were bad: not ours to judge
        why = first.stderr.splitlines()[-1] if first.stderr else first.signal_name
        return Verdict(True, f"unchecked: {why}")
    second = runner(path, gpu_layers, False)
    if second.returncode == 0:
        note = (
            f"llama.cpp crashed ({first.signal_name}) on {model} with repacked weights on this "
            "CPU (llama.cpp issue 20824: AMX); it loads without repacking here"
        )
        LOG.warning("%s", note)
        remember(cache_file, key, {"repack": False, "model": model, "note": note}, path)
        return Verdict(False, "canary", note)
    broken = (
        f"llama.cpp crashes on {model} on this machine: {first.signal_name} with repacked "
        f"weights and {second.signal_name} without ({path})"
    )
    if second.crashed:
        remember(cache_file, key, {"broken": broken, "model": model}, path)
    raise EngineError(broken, _BROKEN_HINT)


_BROKEN_HINT = (
    "try another quantization of the model or another llama.cpp build; "
    f"delete the {CACHE_NAME} cache file to test again"
)
