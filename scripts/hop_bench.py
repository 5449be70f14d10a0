#!/usr/bin/env python3
"""What the engine process costs: plain decoding in-process vs through the daemon (HTTP + the
engine child), same pair, prompts and settings, interleaved in one run.

    .venv/bin/python scripts/hop_bench.py [--pair NAME] [--repeat 3] [--json OUT.json]

Three ways, same prompts, interleaved: in-process (`generate()` here), the engine child driven
directly over its socket (the hop alone: its messages batched as the daemon asks for a stream,
`server.stream_interval_ms`), and the daemon (HTTP, streamed by default: every batch also
crosses the SSE stream). tok/s is measured by the caller in each case: completion tokens over
the wall time from sending the request to its end. The target is ≥ 0.97× of in-process.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import homespec.engine.llama_backend  # noqa: F401  (llama.cpp's library before numpy's)

# isort: split
import httpx

from homespec.engine.crashsite import CrashSite
from homespec.engine.generate import generate
from homespec.engine.loader import load_pair
from homespec.engine.protocol import (
    AttachDraft,
    DraftAttached,
    Finished,
    Generate,
    Load,
    Loaded,
    Stop,
)
from homespec.engine.types import GenerationRequest, GenerationStats, Message
from homespec.manifest import load_manifest
from homespec.workload import default_workload, load_workload


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def in_process(loaded: Any, messages: list[Message], max_tokens: int) -> float:
    req = GenerationRequest(
        messages=messages,
        max_tokens=max_tokens,
        speculative=False,
    )
    t0 = time.perf_counter()
    stats = next(s for s in generate(loaded.runtime, req) if isinstance(s, GenerationStats))
    return stats.completion_tokens / (time.perf_counter() - t0)


def via_daemon(
    client: httpx.Client,
    url: str,
    pair: str,
    messages: list[Message],
    max_tokens: int,
    stream: bool = True,
) -> float:
    """One request over a kept-alive connection, as an OpenAI client sends it. (A client made
    per request, `httpx.post`, costs 16 ms here to build: 12% of a short answer, charged to
    the daemon.)"""
    chat = [{"role": m.role, "content": m.content} for m in messages]
    body = {
        "model": pair,
        "messages": chat,
        "max_tokens": max_tokens,
        "stream": stream,
        "speculative": False,
    }
    tokens = 0
    t0 = time.perf_counter()
    if not stream:
        r = client.post(url + "/v1/chat/completions", json=body)
        r.raise_for_status()
        completion: int = r.json()["usage"]["completion_tokens"]
        return completion / (time.perf_counter() - t0)
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {") and '"homespec"' in line:
                tokens = json.loads(line[6:])["homespec"]["completion_tokens"]
    return tokens / (time.perf_counter() - t0)


class Engine:
    """The pair's engine child, driven over its socket like the daemon does, without HTTP."""

    def __init__(self, manifest: Any, pair: str) -> None:
        self.site, site_fd = CrashSite.shared()
        ours, theirs = socket.socketpair()
        cmd = [
            sys.executable,
            "-m",
            "homespec.engine.child",
            "--fd",
            str(theirs.fileno()),
            "--site-fd",
            str(site_fd),
            "--pair",
            pair,
            "--log-level",
            "WARNING",
        ]
        self.proc = subprocess.Popen(cmd, pass_fds=(theirs.fileno(), site_fd))
        theirs.close()
        os.close(site_fd)
        self.conn = Connection(ours.detach())
        self.conn.send(Load(manifest, pair, None, without_draft="plain bench"))
        self.batch_s = manifest.spec.server.stream_interval_ms / 1000.0
        loaded = self.conn.recv()
        assert isinstance(loaded, Loaded), loaded
        # As the daemon does: its weights into huge pages, then its costs (no draft here).
        self.conn.send(AttachDraft())
        attached = self.conn.recv()
        assert isinstance(attached, DraftAttached), attached
        self.n = 0

    def run(self, messages: list[Message], max_tokens: int) -> float:
        self.n += 1
        req = GenerationRequest(messages=messages, max_tokens=max_tokens, speculative=False)
        t0 = time.perf_counter()
        self.conn.send(Generate(str(self.n), req, self.batch_s))
        while True:
            msg = self.conn.recv()
            if isinstance(msg, Finished):
                assert msg.stats is not None, msg
                return msg.stats.completion_tokens / (time.perf_counter() - t0)

    def close(self) -> None:
        self.conn.send(Stop())
        self.proc.wait(timeout=60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=None)
    ap.add_argument("--pair", default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workload", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    ap.add_argument("--no-stream", action="store_true", help="one response per request")
    args = ap.parse_args()
    manifest = load_manifest(args.config)
    pair = args.pair or manifest.default_pair
    items = load_workload(args.workload or default_workload())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    state = tempfile.mkdtemp(prefix="homespec-hop-")
    cmd = [
        sys.executable,
        "-m",
        "homespec",
        "serve",
        "--config",
        str(manifest.path),
        "--pair",
        pair,
        "--port",
        str(port),
        "--state-dir",
        state,
    ]
    daemon = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, env=os.environ.copy())
    rows: dict[str, dict[str, list[float]]] = {}
    # One at a time, as the daemon starts its own pairs (daemon/settling.py): the daemon ready
    # with its after-load work done (huge pages, costs measured), then the engine child, then
    # the in-process pair; loading beside another's calibration skews it.
    deadline = time.monotonic() + 300
    while True:
        try:
            st = httpx.get(url + "/homespec/status", timeout=1).json()
            if st["status"] == "ready" and (st["pairs"][0].get("costs") or {}).get("verify_ms"):
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or daemon.poll() is not None:
            daemon.kill()
            raise SystemExit("the daemon did not start")
        time.sleep(0.2)
    engine = Engine(manifest, pair)
    client = httpx.Client(timeout=600)
    try:
        with load_pair(manifest, pair, load_draft=False, huge_pages="now") as loaded:
            for item in items:  # warm-up: each side sees every prompt once
                in_process(loaded, item.messages, 8)
                engine.run(item.messages, 8)
                via_daemon(client, url, pair, item.messages, 8)
            for _ in range(args.repeat):
                for item in items:
                    row = rows.setdefault(item.task, {"in": [], "engine": [], "daemon": []})
                    row["in"].append(in_process(loaded, item.messages, item.max_tokens))
                    row["engine"].append(engine.run(item.messages, item.max_tokens))
                    row["daemon"].append(
                        via_daemon(
                            client, url, pair, item.messages, item.max_tokens, not args.no_stream
                        )
                    )
    finally:
        client.close()
        engine.close()
        daemon.terminate()
        daemon.wait(timeout=60)
    how = "one response" if args.no_stream else "streamed"
    print(
        f"pair {pair}, plain decoding, {args.repeat} × {len(items)} prompts, interleaved, "
        f"daemon requests {how}\n"
    )
    print(
        f"{'task':<12} {'in-process':>11} {'engine child':>13} {'daemon':>8}  "
        f"{'engine/in':>9} {'daemon/in':>9}   (tok/s, medians)"
    )
    every: dict[str, list[float]] = {"in": [], "engine": [], "daemon": []}
    for task, r in [*rows.items(), ("all", every)]:
        if task != "all":
            for k in every:
                every[k] += r[k]
        a, e, b = (statistics.median(r[k]) for k in ("in", "engine", "daemon"))
        print(f"{task:<12} {a:>11.1f} {e:>13.1f} {b:>8.1f}  {e / a:>8.3f}× {b / a:>8.3f}×")
    if args.json:
        args.json.write_text(json.dumps({"pair": pair, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
