"""The daemon with the real demo pair (llama.cpp in its engine processes): what the fake engine
cannot stand for, i.e. memory plans across pairs and the real speculative answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai import OpenAI

from homespec.manifest import Manifest

from .daemon_process import demo_manifest_file, start_daemon, wait_until

pytestmark = pytest.mark.models
CHAT = "/v1/chat/completions"


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_the_demo_pair_answers_speculatively_through_the_sdk_and_status_counts_the_draft(
    demo_manifest: Manifest, tmp_path: Path
) -> None:
    d = start_daemon(demo_manifest_file(demo_manifest, tmp_path), tmp_path)
    try:
        with OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0) as sdk:
            r = sdk.chat.completions.create(
                model="smollm2",
                messages=user("Write a Dockerfile for a Flask app."),
                max_tokens=48,
                extra_body={"drafter": "model"},  # forced: the choice depends on timings
            )  # type: ignore[call-overload]
        stats = r.model_dump()["homespec"]
        assert r.choices[0].message.content and stats["mode"] == "speculative"
        assert stats["proposed_tokens"] > 0 and stats["accepted_tokens"] > 0
        pair = d.get("/homespec/status").json()["pairs"][0]
        assert pair["memory_planned"]["ram"]["draft"] > 0 and pair["models"]["draft_loaded"]
        assert pair["engine"]["memory"]["ram"] > 400 * 2**20  # the F32 target alone is 513 MiB
        # Huge pages (engine/pages.py): what the engine got, or the plan's note on why not.
        if pair["plan"]["huge_pages"]:
            huge = pair["huge_pages"]  # settled before the draft was handed over
            assert set(huge) == {"target", "draft"}
            assert huge["target"]["bytes"] > 500 * 2**20
        else:
            assert pair["huge_pages"] == {}
        assert json.loads((d.state_dir / "requests.jsonl").read_text())["outcome"] == "ok"
    finally:
        d.stop()


def test_two_pairs_that_do_not_fit_together_leave_the_first_serving(
    demo_manifest: Manifest, tmp_path: Path
) -> None:
    """Pairs load one after another, each planned on what the earlier ones left: under a
    1400 MiB budget the co-loaded demo pair (~880 MiB) fits and the second pair (~680 MiB)
    cannot, so it is refused with the reason while the daemon stays up. Flash attention is
    pinned off: with "auto" the contexts take the batch size this machine measured, and a
    smaller batch shrinks both pairs enough that the second fits as plain with a shorter
    context (seen in CI on a machine that had measured 64-token batches)."""
    d = start_daemon(
        demo_manifest_file(demo_manifest, tmp_path, flash_attn="off"),
        tmp_path,
        "--pair",
        "smollm2",
        "--pair",
        "smollm2-ngram",
        env={"HOMESPEC_MEMORY_BUDGET": "ram=1400MiB"},
        wait=False,
    )
    try:
        h = wait_until(
            d,
            lambda h: (
                h["pairs"]["smollm2"]["mode"] == "speculative"
                and h["pairs"]["smollm2-ngram"]["state"] == "failed"
            ),
        )
        assert h["status"] == "degraded"
        (reason,) = h["reasons"]
        assert reason.startswith("smollm2-ngram: pair 'smollm2-ngram' does not fit even as")
        assert "MiB missing" in reason
        ok = d.post(CHAT, {"model": "smollm2", "messages": user("Hi"), "max_tokens": 8})
        assert ok.status_code == 200
        refused = d.post(CHAT, {"model": "smollm2-ngram", "messages": user("Hi")})
        assert refused.status_code == 503
        assert refused.json()["error"]["type"] == "pair_unavailable"
        # The refused pair's engine exits after saying why: an expected exit, not a crash.
        assert "Traceback" not in d.log() and h["pairs"]["smollm2-ngram"]["state"] == "failed"
    finally:
        d.stop()
