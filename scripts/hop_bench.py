#!/usr/bin/env python3
"""What the engine process costs: plain decoding in-process vs through the daemon (HTTP + the
engine child), same pair, prompts and settings, interleaved in one run.

    .venv/bin/python scripts/hop_bench.py [--pair NAME] [--repeat 3] [--json OUT.json]

tok/s is measured by the client in both cases: completion tokens over the wall time from
sending the request to its last chunk (through the daemon: a streamed request, so every verify
step crosses the process boundary and the SSE stream). The target is ≥ 0.97× of in-process.
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
from pathlib import Path
from typing import Any

import homespec.engine.llama_backend  # noqa: F401  (llama.cpp's library before numpy's)

# isort: split
import httpx

from homespec.engine.generate import generate
from homespec.engine.loader import load_pair
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


def via_daemon(url: str, pair: str, messages: list[Message], max_tokens: int) -> float:
    chat = [{"role": m.role, "content": m.content} for m in messages]
    body = {"model": pair, "messages": chat, "max_tokens": max_tokens, "stream": True,
            "speculative": False}  # fmt: skip
    tokens = 0
    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {") and '"homespec"' in line:
                tokens = json.loads(line[6:])["homespec"]["completion_tokens"]
    return tokens / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=None)
    ap.add_argument("--pair", default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workload", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    args = ap.parse_args()
    manifest = load_manifest(args.config)
    pair = args.pair or manifest.default_pair
    items = load_workload(args.workload or default_workload())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    state = tempfile.mkdtemp(prefix="homespec-hop-")
    cmd = [sys.executable, "-m", "homespec", "serve", "--config", str(manifest.path),
           "--pair", pair, "--port", str(port), "--state-dir", state]  # fmt: skip
    daemon = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, env=os.environ.copy())
    rows: dict[str, dict[str, list[float]]] = {}
    try:
        with load_pair(manifest, pair, load_draft=False) as loaded:
            deadline = time.monotonic() + 300
            while True:
                try:
                    if httpx.get(url + "/health", timeout=1).json()["status"] == "ready":
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or daemon.poll() is not None:
                    raise SystemExit("the daemon did not start")
                time.sleep(0.2)
            for item in items:  # warm-up: each side sees every prompt once
                in_process(loaded, item.messages, 8)
                via_daemon(url, pair, item.messages, 8)
            for _ in range(args.repeat):
                for item in items:
                    row = rows.setdefault(item.task, {"in": [], "daemon": []})
                    row["in"].append(in_process(loaded, item.messages, item.max_tokens))
                    row["daemon"].append(via_daemon(url, pair, item.messages, item.max_tokens))
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
    print(f"pair {pair}, plain decoding, {args.repeat} × {len(items)} prompts, interleaved\n")
    print(f"{'task':<12} {'in-process tok/s':>17} {'daemon tok/s':>13} {'daemon/in':>10}")
    all_in, all_d = [], []
    for task, r in rows.items():
        a, b = statistics.median(r["in"]), statistics.median(r["daemon"])
        all_in += r["in"]
        all_d += r["daemon"]
        print(f"{task:<12} {a:>17.1f} {b:>13.1f} {b / a:>9.3f}×")
    a, b = statistics.median(all_in), statistics.median(all_d)
    print(f"{'all':<12} {a:>17.1f} {b:>13.1f} {b / a:>9.3f}×")
    if args.json:
        args.json.write_text(json.dumps({"pair": pair, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
