"""The canary: a model's first decode in a throwaway process decides whether it may load with
llama.cpp's repacked weights here (on CPUs with AMX they segfault: llama.cpp issue 20824)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from homespec.engine import repack
from homespec.engine.repack import CanaryRun, Verdict
from homespec.errors import EngineError
from homespec.manifest import Manifest

SEGV = CanaryRun(-signal.SIGSEGV, "")


class Runner:
    """Scripted canary outcomes: one per call, recorded."""

    def __init__(self, *runs: CanaryRun) -> None:
        self.runs = list(runs)
        self.calls: list[bool] = []

    def __call__(self, path: Path, gpu_layers: int, repack_on: bool) -> CanaryRun:
        self.calls.append(repack_on)
        return self.runs.pop(0)


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + bytes(60))
    return path


def decide(model: Path, runner: Runner, cache: Path, override: bool | None = None) -> Verdict:
    return repack.verdict(
        "m", model, gpu_layers=0, override=override, runner=runner, cache_file=cache
    )


def test_a_passing_canary_keeps_repacking_and_is_remembered(model: Path, tmp_path: Path) -> None:
    cache = tmp_path / "canary.json"
    runner = Runner(CanaryRun(0, ""))
    assert decide(model, runner, cache) == Verdict(True, "canary")
    assert decide(model, Runner(), cache) == Verdict(True, "remembered")  # no second canary
    assert runner.calls == [True]


def test_a_crash_with_repacking_and_none_without_turns_it_off_and_says_why(
    model: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "canary.json"
    runner = Runner(SEGV, CanaryRun(0, ""))
    v = decide(model, runner, cache)
    assert runner.calls == [True, False]
    assert not v.repack and v.source == "canary"
    assert "llama.cpp crashed (SIGSEGV) on m with repacked weights" in v.note
    again = decide(model, Runner(), cache)
    assert (again.repack, again.source, again.note) == (False, "remembered", v.note)


def test_a_crash_both_ways_is_an_error_naming_both_signals(model: Path, tmp_path: Path) -> None:
    cache = tmp_path / "canary.json"
    runner = Runner(SEGV, CanaryRun(-signal.SIGABRT, ""))
    with pytest.raises(EngineError, match="SIGSEGV with repacked weights and SIGABRT without"):
        decide(model, runner, cache)
    with pytest.raises(EngineError, match="crashes on m"):  # remembered: no canary runs
        decide(model, Runner(), cache)


def test_a_refusal_that_is_not_a_crash_leaves_the_load_to_report_it(
    model: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "canary.json"
    v = decide(model, Runner(CanaryRun(3, "canary: llama.cpp could not load m.gguf")), cache)
    assert v == Verdict(True, "unchecked: canary: llama.cpp could not load m.gguf")
    assert not cache.exists()


def test_models_toml_override_skips_the_canary(model: Path, tmp_path: Path) -> None:
    runner = Runner()
    assert decide(model, runner, tmp_path / "c.json", override=False) == Verdict(
        False, "models.toml"
    )
    assert runner.calls == []


def test_a_changed_file_is_checked_again(model: Path, tmp_path: Path) -> None:
    cache = tmp_path / "canary.json"
    decide(model, Runner(CanaryRun(0, "")), cache)
    model.write_bytes(b"GGUF" + bytes(61))
    runner = Runner(CanaryRun(0, ""))
    assert decide(model, runner, cache).source == "canary"


def test_verdicts_on_model_files_that_are_gone_are_dropped(model: Path, tmp_path: Path) -> None:
    """A deleted model (or a test's scratch copy) can never be asked about again: its entry
    goes the next time the cache is written, and the cache does not grow without end."""
    cache = tmp_path / "canary.json"
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF" + bytes(10))
    decide(other, Runner(CanaryRun(0, "")), cache)
    old_entry = {"repack": True, "model": "from before files were recorded"}
    data = json.loads(cache.read_text())
    data["older|key"] = old_entry
    cache.write_text(json.dumps(data))
    other.unlink()
    decide(model, Runner(CanaryRun(0, "")), cache)
    entries = json.loads(cache.read_text())
    assert [e.get("file") for e in entries.values()] == [None, str(model.resolve())]
    assert entries["older|key"] == old_entry


@pytest.mark.parametrize(
    "damage",
    [
        lambda key: ["a", "list"],
        lambda key: {key: "yes"},
        lambda key: {key: {"model": "m"}},
        lambda key: {key: {"repack": "maybe"}},
    ],
    ids=["list", "entry-not-object", "no-repack", "repack-not-bool"],
)
def test_a_damaged_cache_only_means_checking_again(
    model: Path, tmp_path: Path, damage: Any
) -> None:
    """Hand-edited or half-restored: an entry that is no verdict was a traceback at every
    load of the model (`'str' object has no attribute 'get'`, KeyError 'repack')."""
    cache = tmp_path / "canary.json"
    cache.write_text(json.dumps(damage(repack.cache_key(model, 0))))
    runner = Runner(CanaryRun(0, ""))
    assert decide(model, runner, cache) == Verdict(True, "canary") and runner.calls == [True]
    assert decide(model, Runner(), cache) == Verdict(True, "remembered")


def test_an_unwritable_cache_only_means_checking_again(model: Path, tmp_path: Path) -> None:
    cache = tmp_path / "no-such-dir" / "canary.json"
    assert decide(model, Runner(CanaryRun(0, "")), cache) == Verdict(True, "canary")


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "homespec", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
    )


def test_a_machine_where_repacking_crashes_still_answers_with_the_draft_model(
    demo_manifest: Manifest, repack_crash_shim: Path, tmp_path: Path
) -> None:
    """A real crash: with the shim preloaded, llama.cpp segfaults at the first compute after
    loading a model with repacked weights, as it does on CPUs with AMX. `ask` (in-process)
    must not die with exit 139: the canary crashes instead, and the models load without
    repacking. `doctor` then names the workaround, from memory."""
    env = {"LD_PRELOAD": str(repack_crash_shim), "HOMESPEC_CACHE_DIR": str(tmp_path / "cache")}
    config = str(demo_manifest.path)
    crashed = subprocess.run(
        [
            sys.executable,
            "-m",
            "homespec.engine.canary",
            str(demo_manifest.model_path("smollm2-135m-q4_1")),
            "--repack",
            "on",
        ],
        env={**os.environ, **env},
        capture_output=True,
        timeout=120,
    )
    assert crashed.returncode == -signal.SIGSEGV  # the shim really crashes llama.cpp
    r = run_cli(
        "ask",
        "--local",
        "--config",
        config,
        "--drafter",
        "model",
        "--spec",
        "--max-tokens",
        "40",
        "--json",
        "Write a story about a fox.",
        env=env,
    )
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)["stats"]
    assert (stats["mode"], stats["drafter"]) == ("speculative", "model")
    assert stats["proposed_tokens"] > 0
    assert "crashed (SIGSEGV) on smollm2-135m-q4_1 with repacked weights" in r.stderr
    cache = json.loads((tmp_path / "cache" / "canary.json").read_text())
    assert sorted(e["repack"] for e in cache.values()) == [False, False]
    d = run_cli("doctor", "--config", config, "--pair", "smollm2", env=env)
    assert d.returncode == 0, d.stdout + d.stderr
    assert "canary  draft: without repacking: llama.cpp crashed (SIGSEGV)" in d.stdout
    assert "(remembered)" in d.stdout
