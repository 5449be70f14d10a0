#!/usr/bin/env python3
"""Two drills for `homespec serve` on the real demo pair, with a figure for each promise.

load:  N concurrent clients for S seconds on loopback, streaming and not, a share of them
       hanging up mid-stream. Expect: only 200s and designed 503s (with Retry-After), no 500,
       the queue back to 0, one whole log line per answered request, the daemon's and its
       engine's resident memory before and after.
crash: K times, `kill -9` the daemon in the middle of a streamed answer, then start it again
       on the same state dir. Expect: no partial log line, ever, and every restarted daemon
       serving. (Engines are the daemon's children: they exit when it is gone.)

Run from the repository root (the quick start's install first):

    .venv/bin/python scripts/daemon_drills.py load  [--clients 8] [--seconds 300]
    .venv/bin/python scripts/daemon_drills.py crash [--kills 20]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psutil

PROMPTS = [
    "Write a bash function that backs up a directory with tar.",
    "Summarize in one line: the server room was cold and loud.",
    "List five Linux commands for disk usage.",
    "Is 7919 a prime number? Answer yes or no.",
    "Write a Python function that checks whether a number is prime.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Served:
    def __init__(self, state: Path, port: int) -> None:
        self.state, self.port = state, port
        self.url = f"http://127.0.0.1:{port}"
        argv = ["serve", "--port", str(port), "--state-dir", str(state)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "homespec", *argv],
            stdout=subprocess.DEVNULL,
            stderr=open(state / "daemon.log", "ab"),  # noqa: SIM115 (the child keeps it)
        )

    def wait_ready(self, timeout: float = 180) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise SystemExit(f"daemon exited with {self.proc.returncode}: see {self.state}")
            try:
                h = httpx.get(self.url + "/health", timeout=1).json()
                if h["status"] == "ready" and all(
                    p["mode"] == "speculative" for p in h["pairs"].values()
                ):
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise SystemExit("daemon not ready in time")

    def rss(self) -> dict[str, int]:
        """Resident bytes: the daemon, and its engine children together."""
        me = psutil.Process(self.proc.pid)
        children = me.children(recursive=True)
        return {
            "daemon": me.memory_info().rss,
            "engines": sum(c.memory_info().rss for c in children),
        }


def log_lines(state: Path) -> tuple[int, int]:
    """(whole JSON lines, lines that are not whole JSON) in the request log."""
    path = state / "requests.jsonl"
    if not path.exists():
        return 0, 0
    good = bad = 0
    for line in path.read_bytes().split(b"\n"):
        if not line:
            continue
        try:
            json.loads(line)
            good += 1
        except ValueError:
            bad += 1
    return good, bad


def client(url: str, stop: float, seed: int, tally: Counter[str], lock: threading.Lock) -> None:
    rng = random.Random(seed)
    with httpx.Client(timeout=httpx.Timeout(10, read=300)) as http:
        while time.monotonic() < stop:
            body: dict[str, Any] = {
                "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
                "max_tokens": rng.choice([8, 48, 128]),
            }
            stream = rng.random() < 0.5
            leave = stream and rng.random() < 0.3
            outcome = "?"
            try:
                if stream:
                    body["stream"] = True
                    with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
                        outcome = str(r.status_code)
                        if r.status_code == 503:
                            outcome += (
                                "" if r.headers.get("retry-after") else " without Retry-After"
                            )
                        for i, _ in enumerate(r.iter_lines()):
                            if leave and i == 3:
                                outcome += " (left mid-stream)"
                                break
                else:
                    r = http.post(url + "/v1/chat/completions", json=body)
                    outcome = str(r.status_code)
                    if r.status_code == 503 and not r.headers.get("retry-after"):
                        outcome += " without Retry-After"
            except httpx.HTTPError as exc:
                outcome = f"transport error {type(exc).__name__}"
            with lock:
                tally[outcome] += 1


def load(clients: int, seconds: float) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        d = Served(state, free_port())
        try:
            print(f"load: daemon ready in {d.wait_ready():.1f} s")
            before = d.rss()
            tally: Counter[str] = Counter()
            lock = threading.Lock()
            stop = time.monotonic() + seconds
            threads = [
                threading.Thread(target=client, args=(d.url, stop, i, tally, lock))
                for i in range(clients)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            time.sleep(1.0)  # the last cancelled streams settle
            status = httpx.get(d.url + "/homespec/status", timeout=10).json()
            queue = sum(p["queue_depth"] for p in status["pairs"])
            after = d.rss()
            good, bad = log_lines(state)
            answered = sum(n for k, n in tally.items() if k.startswith("200"))
            print(f"load: {clients} clients × {seconds:.0f} s")
            for outcome, n in sorted(tally.items()):
                print(f"  {outcome:<32} {n:>6}")
            print(f"  queue depth after: {queue}")
            print(f"  log: {good} whole lines, {bad} broken, {answered} answered (200)")
            for who in ("daemon", "engines"):
                print(f"  RSS {who}: {before[who] / 2**20:.0f} → {after[who] / 2**20:.0f} MiB")
            ok = (
                not any(k.startswith(("5", "transport")) and not k.startswith("503") for k in tally)
                and not any("without" in k for k in tally)
                and queue == 0
                and bad == 0
                and good >= answered
            )
            print("load: PASS" if ok else "load: FAIL")
            return 0 if ok else 1
        finally:
            d.proc.send_signal(signal.SIGTERM)
            d.proc.wait(60)


def crash(kills: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        served_after = 0
        for i in range(kills):
            d = Served(state, free_port())
            ready = d.wait_ready()
            r = httpx.post(
                d.url + "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 8},
                timeout=60,
            )
            served_after += r.status_code == 200
            body = {"messages": [{"role": "user", "content": PROMPTS[4]}], "max_tokens": 256}
            body["stream"] = True
            with httpx.stream("POST", d.url + "/v1/chat/completions", json=body, timeout=60) as s:
                for j, _ in enumerate(s.iter_lines()):
                    if j == 5 + i % 7:  # somewhere in the middle of the answer
                        os.kill(d.proc.pid, signal.SIGKILL)
                        break
            d.proc.wait(30)
            good, bad = log_lines(state)
            print(f"crash {i + 1}/{kills}: ready in {ready:.1f} s, log {good} whole, {bad} broken")
            if bad:
                print("crash: FAIL (a partial log line)")
                return 1
        print(f"crash: {kills} kills, {served_after}/{kills} restarted daemons served")
        ok = served_after == kills
        print("crash: PASS" if ok else "crash: FAIL")
        return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="drill", required=True)
    lp = sub.add_parser("load")
    lp.add_argument("--clients", type=int, default=8)
    lp.add_argument("--seconds", type=float, default=300)
    cp = sub.add_parser("crash")
    cp.add_argument("--kills", type=int, default=20)
    args = ap.parse_args()
    return load(args.clients, args.seconds) if args.drill == "load" else crash(args.kills)


if __name__ == "__main__":
    sys.exit(main())
