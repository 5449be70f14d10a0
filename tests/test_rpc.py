"""A target spread over RPC workers (`homespec worker` processes on 127.0.0.1 ports standing
in for other boxes, each with its own budget), on the real demo pair: the same greedy answer
as the pair loaded here alone, per-worker memory as planned, a worker lost mid-request, and a
worker too small for its share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from homespec.manifest import Manifest
from homespec.workers import probe

from .daemon_process import REPO, free_port, start_daemon, wait_until

# This box may plan 900 MiB of RAM: the demo pair (about 1 GiB with its draft) must spread.
RAM_BUDGET = {"HOMESPEC_MEMORY_BUDGET": "ram=900MiB"}
PROMPTS = ["Name three colors.", "Write a Python function that reverses a string."]


class Worker:
    def __init__(self, port: int, log: Path) -> None:
        self.port = port
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        cmd = [sys.executable, "-m", "homespec", "worker", "--port", str(self.port), "--no-cache"]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not probe("w", self.endpoint, 2.0).reachable:
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "worker did not come up"
            time.sleep(0.2)

    def rss(self) -> int:
        assert self.proc is not None
        return int(psutil.Process(self.proc.pid).memory_info().rss)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[dict[str, Worker]]:
    ws = {name: Worker(free_port(), tmp_path / f"worker-{name}.log") for name in ("a", "b")}
    try:
        for w in ws.values():
            w.start()
        yield ws
    finally:
        for w in ws.values():
            w.kill()


def manifest_file(
    demo: Manifest, directory: Path, ws: dict[str, Worker], budgets: dict[str, str]
) -> Path:
    target = demo.model_path("smollm2-135m-f32")
    draft = demo.model_path("smollm2-135m-q4_1")
    path = directory / "models.toml"
    tables = "".join(
        f'[workers.{n}]\nendpoint = "{w.endpoint}"\nbudget = "{budgets[n]}"\n'
        for n, w in ws.items()
    )
    path.write_text(
        'default_pair = "split"\n[memory]\nwatch_interval_s = 1\n'
        f'[models.t]\npath = "{target}"\n[models.d]\npath = "{draft}"\n{tables}'
        '[pairs.split]\ntarget = "t"\ndraft = "d"\nn_ctx = 1024\ntarget_workers = ["a", "b"]\n'
        '[pairs.local]\ntarget = "t"\ndraft = "d"\nn_ctx = 1024\n'
    )
    return path


def homespec(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "homespec", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def ask(config: Path, pair: str, prompt: str, *flags: str) -> dict[str, object]:
    done = homespec(
        "ask", "--config", str(config), "--pair", pair, "--local", "--json",
        "--max-tokens", "48", *flags, prompt, env=RAM_BUDGET,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out: dict[str, object] = json.loads(done.stdout)
    return out


def test_a_target_spread_over_workers_answers_token_for_token_as_it_does_alone(
    demo_manifest: Manifest, workers: dict[str, Worker], tmp_path: Path
) -> None:
    config = manifest_file(demo_manifest, tmp_path, workers, {"a": "200MiB", "b": "1GiB"})
    plan = homespec("doctor", "--config", str(config), "--plan", "--json", "--pair", "split",
                    env=RAM_BUDGET)  # fmt: skip
    split = json.loads(plan.stdout)["pairs"][0]
    assert split["rung"] == "split" and not split["degraded"], split["reason"]
    layers = split["remote_layers"]
    assert layers["rpc:a:0"] > 0 and layers["rpc:b:0"] > layers["rpc:a:0"]
    for prompt in PROMPTS:
        for flags in [("--no-spec",), ()]:
            here = ask(config, "split", prompt, *flags)
            alone = ask(config, "local", prompt, *flags)
            assert here["text"] == alone["text"], (prompt, flags)


def test_each_worker_holds_what_the_plan_gives_it(
    demo_manifest: Manifest, workers: dict[str, Worker], tmp_path: Path
) -> None:
    config = manifest_file(demo_manifest, tmp_path, workers, {"a": "200MiB", "b": "1GiB"})
    before = {n: w.rss() for n, w in workers.items()}
    with subprocess.Popen(
        [sys.executable, "-m", "tests.rpc_load", str(config), "split"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
        env={**os.environ, **RAM_BUDGET, "PYTHONPATH": str(REPO)},
    ) as proc:  # fmt: skip
        assert proc.stdout is not None and proc.stdin is not None
        plan = json.loads(proc.stdout.readline())
        time.sleep(0.5)
        held = {n: w.rss() - before[n] for n, w in workers.items()}
        proc.stdin.close()
        proc.wait(timeout=60)
    uses = {d["device"]: d for d in plan["devices"]}
    for name in ("a", "b"):
        u = uses[f"rpc:{name}:0"]
        predicted = u["need"] - u["margin"]
        error = (predicted - held[name]) / held[name]
        assert abs(error) <= 0.15, (name, predicted, held[name])
        assert u["need"] <= u["free"]  # and within the worker's budget


def test_a_worker_too_small_for_its_share_is_named_with_the_missing_memory(
    demo_manifest: Manifest, workers: dict[str, Worker], tmp_path: Path
) -> None:
    config = manifest_file(demo_manifest, tmp_path, workers, {"a": "40MiB", "b": "60MiB"})
    done = homespec("doctor", "--config", str(config), "--plan", "--pair", "split",
                    env={"HOMESPEC_MEMORY_BUDGET": "ram=300MiB"})  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "split: cannot run" in done.stdout
    for device in ("rpc:a:0", "rpc:b:0"):
        assert f"{device} needs" in done.stdout
    assert "short" in done.stdout and "nor on this box alone" in done.stdout


def test_a_worker_lost_mid_request_fails_that_request_and_the_pair_comes_back_with_it(
    demo_manifest: Manifest, workers: dict[str, Worker], tmp_path: Path
) -> None:
    config = manifest_file(demo_manifest, tmp_path, workers, {"a": "200MiB", "b": "1GiB"})
    d = start_daemon(config, tmp_path, "--pair", "split", env=RAM_BUDGET)
    try:
        status = d.get("/homespec/status").json()["pairs"][0]
        assert status["plan"]["remote_layers"]["rpc:b:0"] > 0
        body = {"messages": [{"role": "user", "content": PROMPTS[1]}], "max_tokens": 400}
        url = d.url + "/v1/chat/completions"
        with httpx.stream("POST", url, json={**body, "stream": True}, timeout=120) as stream:
            lines = stream.iter_lines()
            next(line for line in lines if line.startswith("data: {"))  # it is answering
            workers["b"].kill()
            rest = list(lines)
        assert any("engine_crashed" in line for line in rest), rest[-3:]
        assert d.proc.poll() is None  # the daemon stays up
        health = wait_until(
            d, lambda h: h["pairs"]["split"]["mode"] in ("speculative", "ngram", "plain")
        )
        st = d.get("/homespec/status").json()["pairs"][0]
        assert st["plan"]["workers_down"] == ["b"], st["plan"]
        assert "worker b" in st["plan"]["reason"]
        assert health["status"] == "degraded"
        assert health["pairs"]["split"]["workers"]["down"] == ["b"]
        assert any("RPC worker b unreachable" in r for r in health["reasons"])
        assert 'homespec_workers_down{pair="split"} 1.0' in d.get("/metrics").text
        workers["b"].start()
        wait_until(
            d,
            lambda h: (
                h["status"] == "ready"
                and d.get("/homespec/status")
                .json()["pairs"][0]["plan"]
                .get("remote_layers", {})
                .get("rpc:b:0")
            ),
        )
        ok = d.post("/v1/chat/completions", {**body, "max_tokens": 20})
        assert ok.status_code == 200
        assert "worker b answers again: re-planning the pair" in d.log()
    finally:
        d.stop()


def test_ask_says_what_happened_when_a_worker_is_lost_mid_answer(
    demo_manifest: Manifest, workers: dict[str, Worker], tmp_path: Path
) -> None:
    config = manifest_file(demo_manifest, tmp_path, workers, {"a": "200MiB", "b": "1GiB"})
    cmd = [sys.executable, "-m", "homespec", "ask", "--config", str(config), "--local"]
    cmd += ["--max-tokens", "400", "--no-spec", PROMPTS[1]]
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **RAM_BUDGET}
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.read(8)  # it is answering, with layers on both workers
        workers["b"].kill()
        proc.wait(timeout=120)
        err = proc.stderr.read().decode()
    assert proc.returncode == 1, err
    assert "llama.cpp died (SIGABRT) while answering with pair 'split'" in err
    assert "RPC workers: one of them may have stopped" in err and "homespec doctor" in err
