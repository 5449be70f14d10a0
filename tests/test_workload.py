"""The workloads the repository ships: the bench's default one and the held-out ones under
scripts/workloads/ that docs/HELD_OUT.md and the README's "On prompts it had not seen" report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from homespec.errors import ConfigError
from homespec.workload import default_workload, load_workload

WORKLOADS = Path(__file__).resolve().parent.parent / "scripts" / "workloads"
HELD_OUT = sorted(WORKLOADS.glob("*.jsonl"), key=lambda p: int(p.stem.removeprefix("unseen-")))


def _prompts(path: Path) -> set[str]:
    return {"\n".join(m.content for m in item.messages) for item in load_workload(path)}


def test_the_held_out_workloads_are_there() -> None:
    assert [p.name for p in HELD_OUT] == [
        "unseen-1.jsonl",
        "unseen-2.jsonl",
        "unseen-3.jsonl",
        "unseen-4.jsonl",
        "unseen-5.jsonl",
        "unseen-6.jsonl",
        "unseen-7.jsonl",
        "unseen-8.jsonl",
        "unseen-9.jsonl",
        "unseen-10.jsonl",
        "unseen-11.jsonl",
        "unseen-12.jsonl",
        "unseen-13.jsonl",
        "unseen-14.jsonl",
        "unseen-15.jsonl",
        "unseen-16.jsonl",
        "unseen-17.jsonl",
        "unseen-18.jsonl",
        "unseen-19.jsonl",
    ]


@pytest.mark.parametrize("path", HELD_OUT, ids=lambda p: p.name)
def test_a_held_out_workload_loads_and_shares_no_prompt_with_the_default(path: Path) -> None:
    items = load_workload(path)
    assert len(items) >= 12
    assert all(item.max_tokens >= 1 and item.messages for item in items)
    assert not _prompts(path) & _prompts(default_workload())


def test_a_workload_with_a_bad_role_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    good = '{"task": "t", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}'
    bad = '{"task": "t", "messages": [{"role": "robot", "content": "hi"}]}'
    path.write_text(f"{good}\n\n{bad}\n")
    with pytest.raises(ConfigError, match=r"w\.jsonl:3: messages\.0\.role"):
        load_workload(path)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (r"a\ud800b", r"messages[0].content holds a lone UTF-16 surrogate (\ud800)"),
        (r"a\u0000b", r"messages[0].content holds a NUL character (\u0000) at character 2"),
    ],
    ids=["surrogate", "nul"],
)
def test_a_workload_string_that_is_no_text_names_its_line(
    tmp_path: Path, content: str, needle: str
) -> None:
    """A JSON escape can write what is no text: a lone surrogate raised UnicodeEncodeError in
    the tokenizer mid-bench, a NUL cut the prompt short."""
    path = tmp_path / "w.jsonl"
    good = '{"task": "t", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}'
    bad = good.replace('"hi"', f'"{content}"')
    path.write_text(f"{good}\n{bad}\n")
    with pytest.raises(ConfigError) as err:
        load_workload(path)
    assert str(err.value).startswith(f"{path}:2: {needle}")


def test_a_byte_order_mark_is_no_json_error(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    line = '{"task": "t", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}'
    path.write_bytes(b"\xef\xbb\xbf" + line.encode() + b"\n")
    assert [item.task for item in load_workload(path)] == ["t"]


def test_a_workload_line_may_carry_a_prediction_the_bench_sends(tmp_path: Path) -> None:
    """In-process as the request's prediction; to another server as OpenAI's field."""
    import httpx

    from homespec.bench import _request
    from homespec.bench_remote import Remote, run_remote

    path = tmp_path / "w.jsonl"
    ask = '"task": "t", "messages": [{"role": "user", "content": "hi"}]'
    path.write_text(f'{{{ask}, "prediction": "Hello!"}}\n{{{ask}}}\n')
    guessed, plain = load_workload(path)
    assert guessed.prediction == "Hello!" and plain.prediction is None
    assert _request(guessed, "auto", 0.0, None, remember=False).prediction == "Hello!"
    sent: list[dict[str, object]] = []

    def server(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, text="data: [DONE]\n\n")

    with httpx.Client(transport=httpx.MockTransport(server)) as client:
        for item in (guessed, plain):
            run_remote(client, Remote("x", "http://x.test"), item, temperature=0, max_tokens=4)
    assert sent[0]["prediction"] == {"type": "content", "content": "Hello!"}
    assert "prediction" not in sent[1]
