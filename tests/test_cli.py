"""The CLI end to end: real models for ask/bench/derive, and every bad input from the issue."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from homespec.cli import cli
from homespec.manifest import Manifest

from .conftest import SHIPPED_MANIFEST, write_tiny_gguf


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def ask_demo(prompt: str, *args: str) -> tuple[int, str, str]:
    """`homespec ask PROMPT --config <shipped models.toml> ARGS…`"""
    return invoke("ask", prompt, "--config", str(SHIPPED_MANIFEST), *args)


def manifest_with(tmp_path: Path, target: Path, draft: str | Path, extra: str = "") -> Path:
    draft_line = f'draft = "{draft}"' if isinstance(draft, str) else 'draft = "d"'
    models = f'[models.t]\npath = "{target}"\n'
    if isinstance(draft, Path):
        models += f'[models.d]\npath = "{draft}"\n'
    p = tmp_path / "models.toml"
    p.write_text(f'{models}[pairs.p]\ntarget = "t"\n{draft_line}\n{extra}')
    return p


def assert_clean_error(code: int, out: str, err: str, *needles: str) -> None:
    assert code != 0
    assert "Traceback" not in out + err
    assert err.startswith("Error: ")
    for needle in needles:
        assert needle in err, err


def test_help_lists_commands() -> None:
    code, out, _ = invoke("--help")
    assert code == 0
    for command in ("ask", "bench", "setup", "models"):
        assert command in out


def test_ask_json_has_text_and_every_stat(demo_manifest: Manifest) -> None:
    code, out, _ = ask_demo(
        "Write a Dockerfile for a Flask app.",
        "--max-tokens",
        "48",
        "--json",
        "--drafter",  # forced: whether the governor drafts depends on this machine's timings
        "hybrid",
    )
    assert code == 0
    payload = json.loads(out)
    assert payload["text"]
    stats = payload["stats"]
    assert stats["mode"] == "speculative" and stats["drafter"] == "hybrid"
    assert 0 < stats["completion_tokens"] <= 48
    for key in (
        "proposed_tokens",
        "accepted_tokens",
        "accept_rate",
        "ttft_ms",
        "e2e_ms",
        "tokens_per_s",
        "verify_steps",
        "prompt_tokens",
        "reason",
    ):
        assert key in stats


def test_ask_streams_text_and_prints_one_stats_line(demo_manifest: Manifest) -> None:
    code, out, err = ask_demo("Say hello.", "--max-tokens", "8")
    assert code == 0 and out.strip()
    # One stats line; on a box where other processes took CPU lately, the thread adapter's
    # notice before it (engine/neighbours.py), which a busy machine adds and a quiet one does not.
    lines = [line for line in err.strip().splitlines() if not line.startswith("homespec: threads ")]
    assert len(lines) == 1, err
    assert "speculative (governor, at most 64 tokens/step" in err  # the reason, said
    assert "tok/s" in err


def test_ask_sampled_says_its_seed_and_the_seed_gives_the_answer_again(
    demo_manifest: Manifest,
) -> None:
    args = ("Name a colour and a fruit.", "--max-tokens", "12", "--temperature", "0.9")
    code, first, err = ask_demo(*args, "--no-spec")
    found = re.search(r" · seed (\d+) · ", err)
    assert code == 0 and first.strip() and found, err
    code, again, err = ask_demo(*args, "--no-spec", "--seed", found.group(1))
    assert code == 0 and again == first and f"seed {found.group(1)}" in err
    code, out, _ = ask_demo(*args, "--seed", found.group(1), "--json")
    assert code == 0 and json.loads(out)["stats"]["seed"] == int(found.group(1))


def test_ask_explain_marks_drafted_text(demo_manifest: Manifest) -> None:
    prompt = "alpha bravo charlie delta, " * 4
    code, out, _ = ask_demo(
        prompt, "--raw", "--max-tokens", "40", "--drafter", "ngram", "--spec", "--explain"
    )
    assert code == 0
    assert "[" in out and "]" in out


def plain_reason(reason: str) -> bool:
    """The reason of an answer asked without speculation: that, and on a box where other
    processes took CPU lately, the thread adapter's note (engine/neighbours.py), which a busy
    CI machine adds and a quiet one does not."""
    off = "request: speculation off"
    return reason == off or reason.startswith(f"{off}; threads ")


def test_ask_ngram_pair_and_no_spec(demo_manifest: Manifest) -> None:
    code, out, _ = ask_demo(
        "List three colors.",
        "--pair",
        "smollm2-ngram",
        "--max-tokens",
        "40",
        "--json",
        "--no-spec",
    )
    assert code == 0
    stats = json.loads(out)["stats"]
    assert (stats["mode"], stats["pair"]) == ("plain", "smollm2-ngram")
    assert plain_reason(stats["reason"]), stats["reason"]


def test_unknown_key(tmp_path: Path, target_path: Path) -> None:
    cfg = manifest_with(tmp_path, target_path, "ngram", "draft_tokenz = 4\n")
    code, _, _ = invoke("ask", "hi", "--config", str(cfg))
    assert code == 2  # bad input/config exits 2, other failures 1
    assert_clean_error(
        *invoke("ask", "hi", "--config", str(cfg)), "pairs.p.draft_tokenz", "unknown key"
    )


def test_wrong_type(tmp_path: Path, target_path: Path) -> None:
    cfg = manifest_with(tmp_path, target_path, "ngram", 'n_ctx = "big"\n')
    assert_clean_error(*invoke("ask", "hi", "--config", str(cfg)), "pairs.p.n_ctx", "'big'")


def test_missing_model(tmp_path: Path) -> None:
    cfg = manifest_with(tmp_path, tmp_path / "nope.gguf", "ngram")
    assert_clean_error(
        *invoke("ask", "hi", "--config", str(cfg)), "pair 'p' needs model 't'", "nope.gguf"
    )


def test_file_that_is_not_gguf(tmp_path: Path) -> None:
    fake = tmp_path / "notes.gguf"
    fake.write_text("just some text\n")
    cfg = manifest_with(tmp_path, fake, "ngram")
    assert_clean_error(*invoke("ask", "hi", "--config", str(cfg)), "not a GGUF file")


def test_truncated_gguf(tmp_path: Path, draft_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(draft_path.read_bytes()[:10_000_000])
    cfg = manifest_with(tmp_path, cut, "ngram")
    assert_clean_error(*invoke("ask", "hi", "--config", str(cfg)), "truncated GGUF")


def test_incompatible_pair(tmp_path: Path, target_path: Path) -> None:
    other = write_tiny_gguf(tmp_path / "other.gguf", tokens=[f"t{i}" for i in range(1000)])
    cfg = manifest_with(tmp_path, target_path, other)
    assert_clean_error(
        *invoke("ask", "hi", "--config", str(cfg)), "vocab sizes differ by 48,152 (limit 128)"
    )


def test_prompt_longer_than_context(tmp_path: Path, target_path: Path) -> None:
    cfg = manifest_with(tmp_path, target_path, "ngram", "n_ctx = 64\n")
    assert_clean_error(
        *invoke("ask", "word " * 200, "--config", str(cfg)), "64-token context", "n_ctx"
    )


def test_missing_config_file(tmp_path: Path) -> None:
    assert_clean_error(
        *invoke("ask", "hi", "--config", str(tmp_path / "none.toml")), "does not exist"
    )


def test_sha256_mismatch(tmp_path: Path, target_path: Path) -> None:
    cfg = tmp_path / "models.toml"
    cfg.write_text(
        f'[models.t]\npath = "{target_path}"\nsha256 = "{"0" * 64}"\n'
        '[pairs.p]\ntarget = "t"\ndraft = "ngram"\n'
    )
    assert_clean_error(*invoke("ask", "hi", "--config", str(cfg)), "has sha256")


def test_models_derive_writes_a_compatible_draft(tmp_path: Path, target_path: Path) -> None:
    dst = tmp_path / "draft-q8.gguf"
    code, _, err = invoke("models", "derive", str(target_path), str(dst), "--type", "Q8_0")
    assert code == 0, err
    assert "wrote" in err
    from homespec.gguf_meta import compatibility_problems, read_gguf

    assert compatibility_problems(read_gguf(target_path), read_gguf(dst)) == []
    assert dst.stat().st_size < target_path.stat().st_size / 3
    # Refuses to overwrite without --force, and refuses unknown types.
    assert_clean_error(
        *invoke("models", "derive", str(target_path), str(dst), "--type", "Q8_0"),
        "already exists",
        "--force",
    )
    assert_clean_error(
        *invoke("models", "derive", str(target_path), str(tmp_path / "x.gguf"), "--type", "Q9_9"),
        "unknown file type",
    )


def test_bench_json_reports_each_mode_per_task(demo_manifest: Manifest, tmp_path: Path) -> None:
    workload = tmp_path / "w.jsonl"
    lines = [
        {
            "task": "repeat",
            "messages": [{"role": "user", "content": "Count from 1 to 20."}],
            "max_tokens": 40,
        },
        {"task": "short", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 40},
    ]
    workload.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    code, out, err = invoke(
        "bench", "--config", str(SHIPPED_MANIFEST), "--workload", str(workload), "--json"
    )
    assert code == 0, err
    assert "[10/10]" in err  # progress: 2 prompts × 5 modes
    payload = json.loads(out)
    rows = {(r["task"], r["mode"]): r for r in payload["tasks"]}
    assert set(rows) == {
        (t, m)
        for t in ("repeat", "short", "all")
        for m in ("plain", "auto", "model", "ngram", "hybrid")
    }  # by default auto, what homespec does unless told otherwise, beside each forced mode
    for (_, mode), row in rows.items():
        if mode == "plain":
            assert row["speedup"] is None
            # one reason, or one per thread count the adapter noted on a busy machine
            assert row["reasons"] and all(map(plain_reason, row["reasons"])), row["reasons"]
        else:
            assert row["speedup"] > 0
            # a draft model always proposes; n-gram lookup only where the text repeats, and
            # the governor only where drafting pays
            assert row["accept_rate"] is not None or mode in ("ngram", "auto")
            # ratio of medians of two runs lies between the per-prompt ratios (the mediant)
            assert row["speedup_min"] <= row["speedup"] + 1e-9
            assert row["speedup"] <= row["speedup_max"] + 1e-9
    assert rows[("all", "model")]["runs"] == 2
    # where auto stands: its tok/s over plain's and over the fastest forced mode's, same run
    standing = {s["task"]: s for s in payload["auto_standing"]}
    assert set(standing) == {"repeat", "short", "all"}
    for task, s in standing.items():
        auto = rows[(task, "auto")]["tokens_per_s"]
        forced = {m: rows[(task, m)]["tokens_per_s"] for m in ("model", "ngram", "hybrid")}
        best = max(forced, key=lambda m: forced[m])
        assert s["best_forced"] == best
        assert s["vs_best_forced"] == pytest.approx(auto / forced[best], abs=2e-3)
        assert s["vs_plain"] == pytest.approx(auto / rows[(task, "plain")]["tokens_per_s"], 2e-3)
        assert s["best_other"] is None


def test_bench_rejects_bad_workload_line(tmp_path: Path, demo_manifest: Manifest) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text('{"task": "x", "messages": [], "max_tokens": 5}\n')
    assert_clean_error(
        *invoke("bench", "--config", str(SHIPPED_MANIFEST), "--workload", str(workload)),
        "w.jsonl:1",
        "messages",
    )


def test_bench_against_a_server_that_is_not_there_fails_before_the_pair_loads(
    tmp_path: Path,
) -> None:
    """Loading a real pair takes seconds to minutes: a wrong port is said first. (The model
    files here do not exist, so reaching the load would fail otherwise.)"""
    from tests.daemon_process import free_port

    cfg = manifest_with(tmp_path, tmp_path / "absent-target.gguf", tmp_path / "absent-draft.gguf")
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = invoke("bench", "--config", str(cfg), "--against", f"llama={url}")
    assert_clean_error(code, out, err, f"--against llama: {url} does not answer", "running")
    assert "loading the pair" not in err


@pytest.mark.parametrize("bad", ["plain,bogus", "model"])
def test_bench_rejects_unavailable_modes(bad: str, demo_manifest: Manifest) -> None:
    args = ["bench", "--config", str(SHIPPED_MANIFEST), "--modes", bad]
    if bad == "model":
        args += ["--pair", "smollm2-ngram"]
    assert_clean_error(*invoke(*args), "not available")


def test_setup_derives_declared_models_idempotently(tmp_path: Path, draft_path: Path) -> None:
    cfg = tmp_path / "models.toml"
    cfg.write_text(
        f'[models.src]\npath = "{draft_path}"\n'
        '[models.q8]\npath = "derived/q8.gguf"\nderive = { from = "src", type = "Q8_0" }\n'
        '[pairs.p]\ntarget = "q8"\ndraft = "src"\n'
    )
    code, _, err = invoke("setup", "--config", str(cfg))
    assert code == 0, err
    assert (tmp_path / "derived" / "q8.gguf").is_file()
    assert "deriving q8.gguf (Q8_0)" in err
    code, _, err = invoke("setup", "--config", str(cfg))
    assert code == 0 and "deriving" not in err and "q8: present" in err


def test_setup_without_a_recipe_says_how_to_fix(tmp_path: Path) -> None:
    cfg = manifest_with(tmp_path, tmp_path / "missing.gguf", "ngram")
    assert_clean_error(
        *invoke("setup", "--config", str(cfg)), "says no way to get it", "`pip`, `assemble` or"
    )


def test_cli_reference_is_up_to_date() -> None:
    from homespec.cli_docs import render

    current = (SHIPPED_MANIFEST.parent / "docs" / "CLI.md").read_text()
    assert current == render(), "run: python -m homespec.cli_docs > docs/CLI.md"


def test_valid_gguf_that_llama_cpp_cannot_load(tmp_path: Path) -> None:
    """Metadata passes, but the tensors a llama model needs are missing: llama.cpp refuses."""
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf")
    cfg = manifest_with(tmp_path, tiny, "ngram")
    assert_clean_error(*invoke("ask", "hi", "--config", str(cfg)), "llama.cpp could not load")


@pytest.mark.parametrize(
    ("args", "stdin", "needle"),
    [
        (("",), None, "PROMPT is empty"),
        (("  \n",), None, "PROMPT is empty"),
        (("-",), "", "standard input was empty"),
        (("-", "--raw"), " \n", "standard input was empty"),
    ],
)
def test_ask_refuses_an_empty_prompt_before_loading_anything(
    args: tuple[str, ...], stdin: str | None, needle: str
) -> None:
    """An unset shell variable or an empty pipe is a usage error, not a made-up question."""
    result = CliRunner().invoke(cli, ["ask", *args, "--local"], input=stdin)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert needle in result.stderr and "- to read it from standard input" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ("ask", "hi", "--local", "--temperature", "nan"),
        ("ask", "hi", "--local", "--min-p", "nan"),
        ("bench", "--temperature", "nan"),
    ],
)
def test_a_nan_where_a_number_goes_is_a_usage_error(args: tuple[str, ...]) -> None:
    """A NaN compares false with both bounds of a range: `--temperature nan` passed click's and
    sampled from NaN logits (an empty answer)."""
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "'nan' is not a finite number" in result.stderr and result.stdout == ""


@pytest.mark.parametrize(
    ("args", "stdin", "needle"),
    [
        (("-",), b"caf\xe9 au lait", "standard input is not UTF-8: byte 0xe9 at character 4"),
        (("caf\udce9",), None, "PROMPT is not UTF-8: byte 0xe9 at character 4"),
        (("hi", "--system", "\udcff"), None, "--system is not UTF-8: byte 0xff at character 1"),
        (("hi", "--stop", "x\udc80"), None, "--stop is not UTF-8: byte 0x80 at character 2"),
        (("-",), b"a\x00b", "standard input holds a NUL character (\\u0000) at character 2"),
    ],
    ids=["stdin", "argv", "system", "stop", "nul"],
)
def test_ask_names_input_that_is_no_text_before_loading_anything(
    args: tuple[str, ...], stdin: bytes | None, needle: str
) -> None:
    """Bytes that are not UTF-8 (a Latin-1 file piped in, an argument in another encoding)
    reached the tokenizer as surrogates and raised UnicodeEncodeError; a NUL cut the prompt
    short where llama.cpp's tokenizer stopped."""
    result = CliRunner().invoke(cli, ["ask", *args, "--local"], input=stdin)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert needle in result.stderr and result.stdout == ""
    if "UTF-8" in needle:
        assert "iconv" in result.stderr


def test_ask_names_a_prediction_file_that_is_not_utf8(tmp_path: Path) -> None:
    bad = tmp_path / "guess.txt"
    bad.write_bytes(b"na\xefve")
    result = CliRunner().invoke(cli, ["ask", "hi", "--local", "--prediction", str(bad)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert f"--prediction {bad} is not UTF-8: byte 0xef at character 3" in result.stderr


@pytest.mark.parametrize("stops", [("",), ("###", "")])
def test_ask_refuses_an_empty_stop_string_before_loading_anything(stops: tuple[str, ...]) -> None:
    """As the daemon does (a 400 naming it): an unset shell variable as --stop would end the
    answer at once, or be dropped in silence."""
    args = [arg for stop in stops for arg in ("--stop", stop)]
    result = CliRunner().invoke(cli, ["ask", "hi", "--local", *args])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--stop" in result.stderr and "a stop string is empty" in result.stderr
    assert result.stdout == ""
