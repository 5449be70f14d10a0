#!/usr/bin/env python3
"""Time to first answer of `homespec serve`: a pair with a draft vs its target alone.

Starts the daemon fresh for each run (alternating the two, so page-cache warmth is shared),
polls until a one-token chat request succeeds, and reports the time from process start, plus
when the pair turned speculative. Run from the repository root:

    .venv/bin/python scripts/serve_start.py [--runs 5] [--pair smollm2] [--alone smollm2-ngram]

The two-model cold start must not make restarts slower: the ratio should be ~1.00.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def one_run(pair: str, config: str) -> tuple[float, float | None]:
    """(seconds to the first answer, seconds until speculative or None)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as state:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "homespec",
                "serve",
                "--config",
                config,
                "--pair",
                pair,
                "--port",
                str(port),
                "--state-dir",
                state,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=os.environ.copy(),
        )
        try:
            first = None
            spec = None
            body = {"model": pair, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
            while time.perf_counter() - t0 < 300:
                if first is None:
                    try:
                        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
                        if r.is_success:
                            first = time.perf_counter() - t0
                    except httpx.HTTPError:
                        pass
                else:
                    status = httpx.get(f"{url}/homespec/status", timeout=5).json()
                    p = status["pairs"][0]
                    if not p["reason"].startswith("draft model still loading"):
                        spec = p["speculative_after_s"]
                        break
                time.sleep(0.02)
            if first is None:
                raise SystemExit(f"serve {pair}: no answer within 300 s")
            return first, spec
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="models.toml")
    ap.add_argument("--pair", default="smollm2", help="the pair with a draft model")
    ap.add_argument("--alone", default="smollm2-ngram", help="a pair with the same target only")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    times: dict[str, list[float]] = {args.pair: [], args.alone: []}
    spec: list[float] = []
    one_run(args.alone, args.config)  # warm the page cache for both orders alike
    for i in range(args.runs):
        order = (args.pair, args.alone) if i % 2 == 0 else (args.alone, args.pair)
        for pair in order:
            first, attached = one_run(pair, args.config)
            times[pair].append(first)
            if pair == args.pair and attached is not None:
                spec.append(attached)
            print(f"run {i + 1}: {pair:<16} first answer after {first:.2f} s", file=sys.stderr)
    with_draft = statistics.median(times[args.pair])
    alone = statistics.median(times[args.alone])
    print(f"time to first answer (median of {args.runs}, process start → 1-token answer):")
    print(
        f"  {args.pair:<16} {with_draft:.2f} s  (target + draft; draft attached after "
        f"{statistics.median(spec):.2f} s)"
        if spec
        else f"  {args.pair:<16} {with_draft:.2f} s"
    )
    print(f"  {args.alone:<16} {alone:.2f} s  (target alone)")
    print(f"  ratio pair/alone {with_draft / alone:.2f}×")


if __name__ == "__main__":
    main()
