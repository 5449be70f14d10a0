"""Predicted Outputs (engine/prediction.py): lookup in the client's guess at the answer, the
loop on the scripted fake target (the answer stays plain decoding's whatever the prediction
says), the governor's separate tables for it, and what an OpenAI client sends and gets back.
The real models' side (the same answer with and without a prediction) is in
tests/test_engine.py."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from homespec.cli import cli
from homespec.daemon.openai_api import ChatCompletionRequest, CompletionRequest
from homespec.daemon.openai_responses import usage
from homespec.engine import learned
from homespec.engine.drafters import ModelDrafter, NgramDrafter
from homespec.engine.generate import PairRuntime
from homespec.engine.ledger import Ledger
from homespec.engine.prediction import Prediction
from homespec.engine.sampling import Draws, SamplingParams
from homespec.engine.types import GenerationRequest, GenerationStats
from homespec.manifest import PairSpec

from .daemon_process import Daemon, read_log, user
from .fake_target import FakeTarget
from .test_verify import run, runtime

PROMPT = [900, 901, 902]  # what precedes the answer in the histories below
LINES = [1, 2, 3, 4, 5, 6, 7, 8, 9]
GREEDY = SamplingParams(temperature=0.0)


def test_an_answer_that_begins_as_the_prediction_is_a_match_from_its_first_token() -> None:
    p = Prediction(LINES, len(PROMPT))
    assert p.propose([*PROMPT, 1], 4) == ([2, 3, 4, 5], 2)  # the anchor and the first token
    assert p.propose([*PROMPT, 1, 2, 3, 4], 3) == ([5, 6, 7], 5)
    assert p.propose([*PROMPT, 7], 4) == ([], 0)  # a first token that is not the prediction's


def test_after_a_change_lookup_finds_its_place_again() -> None:
    p = Prediction(LINES, len(PROMPT))
    answer = [1, 2, 3, 40, 41, 5, 6]  # 4 became 40 41: found again at "5 6"
    assert p.propose([*PROMPT, *answer], 3) == ([7, 8, 9], 2)
    assert p.propose([*PROMPT, *answer, 7, 8, 9], 3) == ([], 0)  # the prediction's end


def test_a_repeated_line_goes_on_from_where_the_answer_is_not_from_its_first_occurrence() -> None:
    line = [10, 11, 12]
    p = Prediction([*line, 20, *line, 21, *line, 22], len(PROMPT))
    answer = [*line, 20, *line]
    assert p.propose([*PROMPT, *answer], 2) == ([21, 10], 8)  # back to the anchor
    # 21 became 5: of three places that agree as long, the one the answer has reached
    answer = [*line, 20, *line, 21, 5, *line]
    assert p.propose([*PROMPT, *answer], 1)[0] == [22]


def test_the_drafter_takes_the_prediction_where_it_agrees_longer_and_the_prompt_on_a_tie() -> None:
    d = NgramDrafter()
    history = [*PROMPT, 5, 6, 7, 8, 5, 6]  # the prompt's own "5 6" was followed by 7
    d.predict([5, 6, 70, 80], answer_start=len(PROMPT))
    assert d.propose(history, 2, GREEDY, Draws(0)).tokens == [7, 8]
    assert not d.from_prediction  # the prompt's 4-token agreement beats the prediction's 2
    d.reset()
    d.predict([5, 6, 7, 8, 5, 6, 70], answer_start=len(PROMPT))
    assert d.propose(history, 2, GREEDY, Draws(0)).tokens == [70]
    assert d.from_prediction and d.match_len == 7  # back to the anchor: the whole answer
    d.reset()  # a new generation forgets the prediction
    assert d.prediction is None


def test_an_answer_that_followed_the_prediction_from_the_start_goes_on_with_it_past_32() -> None:
    """Four laps of a refrain, then something else: the answer's own lookup agrees for 32
    tokens too (the cap) and would propose a fifth lap; the prediction knows what comes next."""
    refrain, then = list(range(10, 20)), [70, 71, 72]
    d = NgramDrafter()
    d.predict([*refrain * 4, *then], answer_start=len(PROMPT))
    history = [*PROMPT, *refrain * 4]
    assert d.propose(history, 3, GREEDY, Draws(0)).tokens == then
    assert d.from_prediction and d.match_len == 33  # one past any other source's agreement
    d.reset()
    d.predict([*refrain * 3, 5, *refrain, *then], answer_start=len(PROMPT))  # not from the start
    assert d.propose(history, 3, GREEDY, Draws(0)).tokens == refrain[:3]  # the answer agrees longer


ALPHABET = "yz abcdefghijklmnopqrstuvwxyz abcdefghijklmnopqrstuvwxyz abc"  # after "x", the fake's


def governed() -> PairRuntime:
    """A fake pair whose costs the governor reads the same under any load: every decode sleeps
    2 ms whatever its size (a flat curve, as on a GPU), and the draft model costs as much as
    the target (never worth drafting with). Costs of a few microseconds, as the fake's are
    by default, were noise: on a busy box the governor chose plain steps over a prediction."""
    spec = PairSpec(target="t", draft="d", draft_tokens=6)
    draft = ModelDrafter(FakeTarget(decode_s=0.002))
    return PairRuntime("p", spec, FakeTarget(decode_s=0.002), draft, NgramDrafter())


@pytest.mark.parametrize("drafter", ["ngram", "hybrid", None])
def test_a_right_prediction_is_drafted_and_the_answer_stays_plains(drafter: str | None) -> None:
    """The fake continues a raw prompt with the alphabet: nothing in the prompt repeats it for
    27 tokens, so without a prediction lookup has nothing to draft the first lap from."""
    rt = governed()
    req = GenerationRequest(prompt="x", max_tokens=50, speculative=False)
    plain_text, plain = run(rt, req)
    ask = dataclasses.replace(req, speculative=True if drafter else None, drafter=drafter)  # type: ignore[arg-type]
    text, s = run(rt, dataclasses.replace(ask, prediction=ALPHABET))
    assert text == plain_text and s.completion_tokens == plain.completion_tokens
    assert s.prediction_tokens == len(ALPHABET)  # the fake's tokens are bytes
    # forced lookup drafts 6 a step; the governor, pricing by timings, often fewer
    assert s.accepted_prediction_tokens >= 25 and s.verify_steps <= plain.verify_steps / 2
    assert s.accepted_prediction_tokens <= s.accepted_tokens
    if drafter is None:
        assert "matched in the prediction" in s.reason


def test_a_prediction_that_departs_from_the_answer_is_found_again_after_the_change() -> None:
    rt = runtime()
    changed = ALPHABET[:10] + "XYZ" + ALPHABET[13:]
    req = GenerationRequest(prompt="x", max_tokens=50, speculative=True, drafter="ngram")
    text, s = run(rt, dataclasses.replace(req, prediction=changed))
    assert text == run(rt, dataclasses.replace(req, speculative=False))[0]
    assert s.accepted_prediction_tokens >= 30


@pytest.mark.parametrize("prediction", ["qwerty uiop", "zzzzzzzzzzzzzzzzzzzz"])
def test_a_prediction_that_never_agrees_proposes_nothing_and_is_counted_rejected(
    prediction: str,
) -> None:
    """Forced lookup (the same steps every run): the same answer in the same steps as without."""
    req = GenerationRequest(prompt="x", max_tokens=50, speculative=True, drafter="ngram")
    text, without = run(runtime(), req)
    guessed, s = run(runtime(), dataclasses.replace(req, prediction=prediction))
    assert guessed == text and s.verify_steps == without.verify_steps
    assert s.accepted_prediction_tokens == 0 and s.prediction_tokens == len(prediction)
    assert usage(s)["completion_tokens_details"] == {
        "accepted_prediction_tokens": 0,
        "rejected_prediction_tokens": len(prediction),
    }


def test_a_misleading_prediction_teaches_its_own_tables_not_the_prompts() -> None:
    """Every 2-gram of the alphabet it holds is followed by the wrong letter: the governor
    learns so in the prediction's tables (the prompt's keep their own)."""
    rt = governed()
    misleading = "abX cdX efX ghX ijX klX mnX opX qrX stX uvX wxX"
    req = GenerationRequest(prompt="x", max_tokens=50, task="t")
    text, _ = run(rt, req)
    assert run(rt, dataclasses.replace(req, prediction=misleading))[0] == text
    table = rt.ledger.by_task["t"]["predicted@2"]
    assert table.tries[0] > 0 and table.kept[0] == 0


@pytest.mark.parametrize(
    ("extra", "why"),
    [({"speculative": False}, "speculation off"), ({"drafter": "model"}, "draft model")],
)
def test_a_mode_without_lookup_says_the_prediction_went_unused(
    extra: dict[str, Any], why: str
) -> None:
    req = GenerationRequest(prompt="x", max_tokens=20, prediction=ALPHABET, speculative=True)
    _, s = run(runtime(), dataclasses.replace(req, **extra))
    assert why in s.reason and "the prediction is not drafted from" in s.reason
    assert s.prediction_tokens == len(ALPHABET) and s.accepted_prediction_tokens == 0


def test_a_prediction_longer_than_the_answer_could_use_is_cut_and_says_so() -> None:
    """Read up to twice the answer's room (and 64 tokens): indexing it costs time the
    request waits, and an answer cannot use much more of its prediction than it is long."""
    req = GenerationRequest(prompt="x", max_tokens=30, prediction=ALPHABET * 3, task="t")
    text, s = run(governed(), req)
    assert text == ALPHABET[:30] and s.prediction_tokens == 3 * len(ALPHABET)
    assert "the prediction's first 124 of 180 tokens drafted from" in s.reason
    _, s = run(governed(), dataclasses.replace(req, max_tokens=60))
    assert "prediction" not in s.reason.replace("matched in the prediction", "")


def test_a_sampled_answer_is_plains_with_a_prediction() -> None:
    hot_ok = PairSpec(target="t", draft="d", draft_tokens=6, spec_max_temperature=2.0)
    rt = dataclasses.replace(governed(), spec=hot_ok)
    req = GenerationRequest(prompt="x", max_tokens=40, temperature=1.5, seed=11)
    plain_text, _ = run(rt, dataclasses.replace(req, speculative=False))
    assert plain_text != ALPHABET[:40]  # hot enough to stray from the script
    for drafter in ("ngram", None):
        ask = dataclasses.replace(req, prediction=ALPHABET, drafter=drafter)  # type: ignore[arg-type]
        text, s = run(rt, ask)
        assert text == plain_text and s.proposed_tokens > 0


def test_the_prediction_has_tables_of_its_own_that_survive_a_restart() -> None:
    ledger = Ledger()
    ledger.acceptance("edit", 8, predicted=True)["ngram"].record(6, 6)
    ledger.acceptance("edit", 8)["ngram"].record(6, 0)
    assert ledger.acceptance("edit", 8, predicted=True)["ngram"].kept[5] > 0
    assert ledger.acceptance("edit", 8)["ngram"].kept[0] == 0
    again = Ledger()
    assert learned.restore_state(again, learned.state(ledger)) == 1
    assert again.by_task["edit"]["predicted@8"].kept == ledger.by_task["edit"]["predicted@8"].kept


def test_the_chat_and_completion_bodies_take_openais_prediction() -> None:
    chat = ChatCompletionRequest.model_validate(
        {
            "messages": [{"role": "user", "content": "x"}],
            "prediction": {"type": "content", "content": [{"type": "text", "text": "a b"}]},
        }
    )
    assert chat.to_generation(default_max_tokens=8).prediction == "a b"
    text = CompletionRequest.model_validate(
        {"prompt": "x", "prediction": {"type": "content", "content": "yz"}}
    )
    assert text.to_generation(default_max_tokens=8).prediction == "yz"
    empty = {"type": "content", "content": ""}
    assert CompletionRequest.model_validate({"prompt": "x", "prediction": empty}).prediction
    assert (
        CompletionRequest.model_validate({"prompt": "x", "prediction": empty})
        .to_generation(default_max_tokens=8)
        .prediction
        is None
    )


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"prediction": {"type": "diff", "content": "x"}}, "prediction type 'diff'"),
        ({"prediction": {"type": "content"}}, "prediction.content"),
        ({"prediction": {"type": "content", "content": "a\x00b"}}, "prediction.content"),
        ({"prediction": "the answer"}, "prediction must be an object"),
        (
            {"prediction": {"type": "content", "content": [{"type": "image_url"}]}},
            "content[0] has type 'image_url': only text parts",
        ),
        ({"logprobs": 3}, "logprobs are not supported"),
    ],
    ids=["type", "no-content", "nul", "bare-string", "image-part", "int-logprobs"],
)
def test_a_prediction_homespec_cannot_read_is_refused_by_name(
    body: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValidationError, match=re.escape(named)):
        CompletionRequest.model_validate({"prompt": "x", **body})


def test_a_daemon_client_sees_how_much_of_its_prediction_was_kept(
    sdk: OpenAI, daemon: Daemon
) -> None:
    """The fake echoes the user's message: predicted right, the answer comes in a few steps,
    and usage, the stats and the request log say how much of the prediction it kept."""
    said = "the daemon drafts from what the client expects. "
    ask = user("forever " + said)
    got = sdk.chat.completions.create(  # type: ignore[call-overload]
        model="smollm2",
        messages=ask,
        max_tokens=60,
        prediction={"type": "content", "content": said * 2},
    )
    assert got.choices[0].message.content == (said * 2)[:60]
    details = got.usage.completion_tokens_details
    assert details.accepted_prediction_tokens >= 20  # of 60: the governor picks its steps
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens == 2 * len(said)
    extra = got.model_dump()["homespec"]
    assert extra["accepted_prediction_tokens"] == details.accepted_prediction_tokens
    assert read_log(daemon)[-1]["prediction_tokens"] == 2 * len(said)
    metrics = text_string_to_metric_families(httpx.get(daemon.url + "/metrics").text)
    kept = [
        s.value
        for family in metrics
        for s in family.samples
        if s.name == "homespec_tokens_total" and s.labels["kind"] == "prediction_accepted"
    ]
    assert kept and kept[0] >= details.accepted_prediction_tokens
    bad = httpx.post(
        daemon.url + "/v1/chat/completions",
        json={"messages": ask, "prediction": {"type": "image", "content": "x"}},
    )
    assert bad.status_code == 400 and "prediction type 'image'" in bad.json()["error"]["message"]


def test_ask_sends_a_prediction_file_to_the_daemon(daemon: Daemon, tmp_path: Path) -> None:
    said = "ask reads the prediction from a file. "
    guess = tmp_path / "guess.txt"
    guess.write_text(said * 2)
    args = ["ask", "forever " + said, "--max-tokens", "40", "--url", daemon.url]
    r = CliRunner().invoke(cli, [*args, "--json", "--prediction", str(guess)])
    assert r.exit_code == 0, r.output
    payload = json.loads(r.stdout)
    assert payload["via"] == daemon.url and payload["text"] == (said * 2)[:40]
    assert payload["stats"]["accepted_prediction_tokens"] >= 10
    r = CliRunner().invoke(cli, [*args, "--prediction", str(guess)])
    assert "prediction " in r.stderr and " kept" in r.stderr
    r = CliRunner().invoke(cli, [*args, "--prediction", str(tmp_path / "none.txt")])
    assert r.exit_code == 2 and "none.txt" in r.stderr


def test_stats_without_a_prediction_report_none() -> None:
    s = GenerationStats(mode="plain", reason="", drafter="none")
    assert usage(s)["completion_tokens_details"] == {
        "accepted_prediction_tokens": 0,
        "rejected_prediction_tokens": 0,
    }
