"""Property-based fuzzing of the daemon's HTTP API from its own OpenAPI schema (schemathesis):
requests generated from every operation's schema, those it allows (positive) and those it
forbids (negative), must never get a 5xx, every refusal must be OpenAI's error envelope, and
the daemon must still be up. It runs the scripted fake engine, so this is about the HTTP layer,
not the model. Bounded: MAX_EXAMPLES per operation and mode.

schemathesis' strategies run under plain Hypothesis here (its pytest plugin did not load under
pytest 9)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

from tests.daemon_process import Daemon, fake_daemon

MAX_EXAMPLES = 30


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = fake_daemon(tmp_path_factory.mktemp("fuzz"), env={"HOMESPEC_FAKE_DECODE_S": "0"})
    yield d
    d.stop()


def operations(d: Daemon) -> list[Any]:
    schema = schemathesis.openapi.from_url(d.url + "/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def fuzz(op: Any, mode: schemathesis.GenerationMode, d: Daemon, seen: set[int]) -> None:
    """Up to MAX_EXAMPLES requests for one operation; the status codes go into `seen`."""

    @given(case=op.as_strategy(mode))
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    def check(case: Any) -> None:
        response = case.call(base_url=d.url, timeout=60)
        seen.add(response.status_code)
        assert response.status_code < 500, f"{op.label}: {response.text[:300]}"
        if response.status_code >= 400 and op.label.startswith("POST /v1/"):
            error = response.json()["error"]
            assert error["message"] and error["type"], response.text[:300]
        assert d.proc.poll() is None, "the daemon died"

    check()


@pytest.mark.parametrize("mode", list(schemathesis.GenerationMode), ids=str)
def test_no_request_the_schema_allows_or_forbids_gets_a_server_error(
    fuzzed: Daemon, mode: schemathesis.GenerationMode
) -> None:
    ops = operations(fuzzed)
    generating = {"POST /v1/chat/completions", "POST /v1/completions"}
    assert generating <= {op.label for op in ops}
    seen: dict[str, set[int]] = {}
    for op in ops:
        try:
            fuzz(op, mode, fuzzed, seen.setdefault(op.label, set()))
        except Unsatisfiable:  # nothing to negate: the operation takes no input
            assert mode == schemathesis.GenerationMode.NEGATIVE and op.label not in generating
    assert fuzzed.get("/health").json()["status"] == "ready"
    for label in generating:
        assert seen[label], f"{label} was never called"
    chat = seen["POST /v1/chat/completions"]
    if mode == schemathesis.GenerationMode.POSITIVE:  # not only refusals: answers too
        assert 200 in chat, seen
    else:  # and what the schema forbids is refused
        assert 400 in chat, seen
