"""`homespec doctor` and the fallback ladder on the real demo pair: plans, bad files, budgets."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from homespec.doctor import PairReport, catch_up_note, own_work, render_pair
from homespec.manifest import Manifest
from homespec.paths import cache_dir

from .conftest import SHIPPED_MANIFEST, write_tiny_gguf
from .test_cli import ask_demo, assert_clean_error, invoke, manifest_with

DEMO = ("--config", str(SHIPPED_MANIFEST), "--pair", "smollm2", "--pair", "smollm2-ngram")


def test_doctor_prints_machine_models_table_and_plan(demo_manifest: Manifest) -> None:
    code, out, _ = invoke("doctor", *DEMO)
    assert code == 0, out
    assert "llama.cpp backends  CPU" in out
    assert "RAM " in out and "cgroup limit" in out
    assert "smollm2-135m-f32: llama, 135M params, F32" in out
    assert "compatible (llama.cpp's draft rules)" in out
    assert "tgt weights" in out and "fits" in out
    assert "plan    co-load → speculative: as declared: target and draft in RAM" in out
    assert "plan    ngram → ngram: as declared" in out
    assert out.rstrip().endswith("doctor: ok")


def test_doctor_plan_json_is_the_loader_s_plan(demo_manifest: Manifest) -> None:
    code, out, _ = invoke("doctor", *DEMO, "--plan", "--json")
    assert code == 0
    pairs = {p["name"]: p for p in json.loads(out)["pairs"]}
    assert set(pairs) == {"smollm2", "smollm2-ngram"}
    p = pairs["smollm2"]
    assert (p["rung"], p["mode"], p["draft_loaded"], p["n_ctx"]) == (
        "co-load",
        "speculative",
        True,
        2048,
    )
    ram = p["devices"][0]
    assert ram["device"] == "ram" and ram["fits"]
    # The KV caches follow the metadata: 30 layers × 3 KV heads × 128 × 2 bytes × 2048 cells.
    assert ram["target_kv"] == ram["draft_kv"] == 30 * 3 * 128 * 2 * 2048


@pytest.fixture()
def unmeasured_flash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The budgets below are set against the plan a machine makes before it has measured
    flash attention (engine/flash.py; with it the compute buffers are smaller, and whether this
    CPU turns it on is the CPU's business): a cache dir without that verdict, but with the
    canary's, so the canary does not run again."""
    cache = tmp_path / "cache"
    cache.mkdir()
    if (known := cache_dir() / "canary.json").exists():
        shutil.copy(known, cache / "canary.json")
    monkeypatch.setenv("HOMESPEC_CACHE_DIR", str(cache))


@pytest.mark.usefixtures("unmeasured_flash")
def test_doctor_says_what_a_cpu_pair_runs_its_attention_with(
    demo_manifest: Manifest, target_path: Path
) -> None:
    """Flash attention and the batch size, as this machine measured them for the target, or
    that the first load will (engine/flash.py)."""
    from homespec.engine import flash
    from homespec.engine.repack import cache_key, remember

    code, out, _ = invoke("doctor", *DEMO)
    assert code == 0
    assert "  cpu     not measured yet: the first load times flash attention and batch sizes" in out
    entry = {
        "on": False,
        "why": "flash attention off: with it a request took 1.17× its time without",
        "n_batch": 128,
        "batch_why": "128-token batches: a prompt of 800 tokens took 0.83× the time",
    }
    key = flash.CACHE_PREFIX + cache_key(target_path, 0)
    remember(cache_dir() / flash.CACHE_NAME, key, entry, target_path)
    code, out, _ = invoke("doctor", *DEMO, "--json")
    (pair, _) = json.loads(out)["pairs"]
    assert pair["cpu_attention"] == f"{entry['why']}; {entry['batch_why']}"


@pytest.mark.usefixtures("unmeasured_flash")
def test_budget_makes_the_pair_fall_back_and_say_why(
    demo_manifest: Manifest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOMESPEC_MEMORY_BUDGET", "ram=900MiB")
    code, out, _ = invoke("doctor", *DEMO)
    assert code == 1
    assert "pair smollm2: degraded" in out
    assert "ngram → ngram: target and draft in RAM does not fit (ram needs" in out
    assert "900.0 MiB usable" in out
    assert "budget ram" in out
    # ask still answers, without the draft, and the stats say why.
    code, out, err = ask_demo(
        "Write a Python function that adds two numbers.", "--json", "--max-tokens", "40"
    )
    assert code == 0, err
    payload = json.loads(out)
    assert payload["text"]
    stats = payload["stats"]
    assert stats["plan"]["mode"] == "ngram"
    assert stats["drafter"] in ("auto", "none")  # the governor, with no draft model to pick
    assert "draft model" not in stats["reason"].split("steps:")[-1]
    assert "memory: draft not loaded (ram needs" in stats["reason"]
    assert "runs degraded" in err


@pytest.mark.usefixtures("unmeasured_flash")
def test_tighter_budget_runs_plain_with_a_smaller_context(
    demo_manifest: Manifest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOMESPEC_MEMORY_BUDGET", "ram=700MiB")
    code, out, err = ask_demo("Say hello.", "--json", "--max-tokens", "40", "--spec")
    assert code == 0, err
    stats = json.loads(out)["stats"]
    assert stats["plan"]["rung"] == "smaller-context"
    assert stats["plan"]["n_ctx"] < 2048
    assert stats["mode"] == "plain"  # even a forced request: the verify buffer is not there
    assert stats["reason"].startswith("memory: plain decoding only (ram needs")


def test_budget_too_small_refuses_saying_how_much_is_missing(
    demo_manifest: Manifest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOMESPEC_MEMORY_BUDGET", "ram=300MiB")
    code, out, _ = invoke("doctor", *DEMO, "--plan")
    assert code == 2
    assert "smollm2: cannot run: does not fit even as target in RAM" in out
    assert "MiB missing" in out
    code, out, err = ask_demo("Say hello.")
    assert code == 2
    assert_clean_error(code, out, err, "MiB missing", "homespec doctor --pair smollm2")


def test_bad_budget_is_a_clean_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOMESPEC_MEMORY_BUDGET", "ram=lots")
    code, out, err = invoke("doctor", *DEMO)
    assert_clean_error(code, out, err, "$HOMESPEC_MEMORY_BUDGET: ram: 'lots' is not a size")


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "not found"),
        (b"", "file is empty"),
        (b"GGUF\x03\x00\x00\x00\x05", "truncated or corrupt GGUF"),
        (os.urandom(4096), "not a GGUF file"),
        (b"# this is a README, not a model\n" * 10, "not a GGUF file (starts with b'# th'"),
    ],
    ids=["missing", "empty", "truncated", "random-bytes", "text-file"],
)
def test_doctor_names_each_bad_file(
    tmp_path: Path, draft_path: Path, content: bytes | None, needle: str
) -> None:
    bad = tmp_path / "bad.gguf"
    if content is not None:
        bad.write_bytes(content)
    config = manifest_with(tmp_path, bad, draft_path)
    code, out, _ = invoke("doctor", "--config", str(config))
    assert code == 2
    assert "pair p: cannot run" in out
    target_line = next(line for line in out.splitlines() if line.startswith("  target  t: "))
    assert str(bad) in target_line and needle in target_line
    assert "draft   d: llama, 135M params, Q4_1" in out  # the good file is still described
    assert "Traceback" not in out


def test_doctor_names_the_failing_compatibility_rule(tmp_path: Path, target_path: Path) -> None:
    other = write_tiny_gguf(tmp_path / "other.gguf", vocab_type="llama")
    code, out, _ = invoke("doctor", "--config", str(manifest_with(tmp_path, target_path, other)))
    assert code == 2
    assert "vocab types differ: target 'gpt2', draft 'llama'" in out


def test_doctor_unknown_pair_is_a_clean_error() -> None:
    code, out, err = invoke("doctor", "--config", str(SHIPPED_MANIFEST), "--pair", "nope")
    assert_clean_error(code, out, err, "no pair named 'nope'", "known pairs:")


def test_prediction_within_15_percent_of_measured_memory(demo_manifest: Manifest) -> None:
    """Load the demo pair in a fresh process, fill both contexts, compare RSS with the plan."""
    done = subprocess.run(
        [sys.executable, "-m", "homespec.memcheck", str(SHIPPED_MANIFEST), "smollm2"],
        capture_output=True,
        text=True,
        check=True,
    )
    found = json.loads(done.stdout)
    rows = {r["role"]: r for r in found["memory"] if r["device"] == "ram"}
    assert set(rows) == {"target", "draft"}
    for role, r in rows.items():
        assert r["measured"] > 50 * 2**20, role  # the load really happened in that process
        assert abs(r["error"]) <= 0.15, (role, r)
    # The governor's calibration comes with it: a decode of more tokens costs more.
    curve = {int(n): ms for n, ms in found["costs"]["verify_ms"].items()}
    assert set(curve) >= {1, 8} and curve[8] > curve[1] > 0
    assert found["costs"]["draft_ms_per_token"] > 0
    # and the draft model's, by tokens in a decode: a catch-up on history is one batch
    draft = {int(n): ms for n, ms in found["costs"]["draft_ms"].items()}
    assert set(draft) == {1, 8, 32} and draft[32] > draft[8] > draft[1] > 0
    # and how often the draft predicts the target's next token: the demo draft is the target's
    # own model quantized to 4 bits, so nearly always
    assert 0.8 <= found["costs"]["draft_agreement"] <= 1.0
    # and, being that, it reads the target's cache: its catch-ups are copies, their cost
    # a few hundredths of a ms a token moved (engine/cache_share.py)
    assert found["costs"]["draft_catch_up"].startswith("catches up by copying the target's")
    assert 0 < found["costs"]["copy_ms_per_token"] < 1.0
    # and homespec's own work a step, from a plain answer and one n-gram lookup drafts
    own = found["costs"]["step_overhead_ms"]
    assert own["plain"] > 0 and own["n-gram"] > 0


def test_a_pair_never_set_up_is_one_line_not_a_failure(
    demo_manifest: Manifest, tmp_path: Path
) -> None:
    """Right after the quick start an optional pair has no files yet: one line, exit 0, unless
    it is asked for (--pair), the default pair, or one the daemon serves."""
    target = demo_manifest.model_path("smollm2-135m-f32")
    draft = demo_manifest.model_path("smollm2-135m-q4_1")
    config = tmp_path / "models.toml"
    config.write_text(
        'default_pair = "p"\n'
        f'[models.t]\npath = "{target}"\n[models.d]\npath = "{draft}"\n'
        '[models.later]\npath = "models/later.gguf"\nderive = { from = "d", type = "F32" }\n'
        '[pairs.p]\ntarget = "t"\ndraft = "d"\n'
        '[pairs.later]\ntarget = "later"\ndraft = "ngram"\n'
    )
    code, out, _ = invoke("doctor", "--config", str(config))
    assert code == 0, out
    assert [line for line in out.splitlines() if "later" in line] == [
        "pair later: not set up — homespec setup --pair later"
    ]
    assert "pair p: ok" in out
    code, out, _ = invoke("doctor", "--config", str(config), "--pair", "later")
    assert code == 2, out
    assert "pair later: not set up — homespec setup --pair later" in out
    # Served by the daemon: its absence is an error again.
    text = config.read_text() + '[server]\npairs = ["p", "later"]\n'

    config.write_text(text)
    code, out, _ = invoke("doctor", "--config", str(config))
    assert code == 2, out


def test_a_draft_that_catches_up_dearly_is_said_so_with_its_figures() -> None:
    """The demo pair on the 2-core CPU: the Q4_1 draft decodes 32 tokens slower than the F32
    target does, so a catch-up on a prompt costs it more than plain decoding would save on a
    short answer, and doctor says why the governor leaves it out there."""
    cpu = {"verify_ms": {"1": 20.0, "8": 40.8, "32": 94.0}, "draft_ms": {"1": 7.5, "32": 101.9}}
    note = catch_up_note(cpu, "Q4_1")
    assert note is not None
    assert "3.2 ms a token, 1.08× the target's (32-token decodes)" in note
    assert "Its Q4_1 weights" in note and "catches up dearly" in note
    # A GPU, or a draft type with fast batch kernels: a catch-up is cheap, nothing to say.
    gpu = {"verify_ms": {"1": 2.1, "32": 3.0}, "draft_ms": {"1": 1.1, "32": 1.2}}
    assert catch_up_note(gpu, "Q4_K_M") is None
    # Nothing measured for the draft model (an n-gram pair), or only one-token decodes.
    assert catch_up_note({"verify_ms": {"1": 20.0, "8": 40.0}}, "") is None
    assert catch_up_note({"verify_ms": {"1": 20.0}, "draft_ms": {"1": 7.5}}, "Q4_1") is None
    # A draft that copies the target's cache catches up without decoding: nothing to say.
    assert catch_up_note({**cpu, "copy_ms_per_token": 0.02}, "Q4_1") is None


def test_doctor_says_homespecs_own_work_a_step_and_a_plain_steps_share_of_a_decode() -> None:
    costs = {"verify_ms": {"1": 1.2}, "step_overhead_ms": {"plain": 0.24, "n-gram": 1.0}}
    assert own_work(costs) == "plain 0.24 ms (20% of a one-token decode), n-gram 1.00 ms"
    report = PairReport(name="p", status=0)
    report.costs = costs
    assert (
        "          homespec's own work a step beyond its decodes: plain 0.24 ms (20%"
        in "\n".join(render_pair(report))
    )


def test_doctor_renders_the_catch_up_note_under_the_costs() -> None:
    report = PairReport(name="p", status=0)
    facts = {"architecture": "llama", "params": 135e6, "size": 2**20, "trained_context": 8192}
    report.models = {"draft": {"model": "d", "quantization": "Q4_1", **facts}}
    report.costs = {"verify_ms": {"8": 40.0}, "draft_ms": {"8": 30.0}}
    lines = render_pair(report)
    costs_at = next(i for i, line in enumerate(lines) if line.startswith("  costs"))
    assert lines[-1].startswith("  note    the draft model catches up at 3.8 ms a token")
    assert len(lines) - 1 > costs_at
