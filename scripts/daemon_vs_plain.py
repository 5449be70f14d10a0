#!/usr/bin/env python3
"""The daemon's answers against its own plain decoding: what a client of `homespec serve` gets.

    .venv/bin/python scripts/daemon_vs_plain.py [--workload F] [--task T,…] [--with-task]
        [--json OUT.json]

homespec promises that the daemon is never meaningfully slower than plain decoding.
`homespec bench` measures `auto` against plain in-process, and llama_server_compare.sh puts the
daemon beside in-process plain, which also charges the daemon its HTTP and its second process
(as it charges llama-server's). This asks the daemon itself: it starts `homespec serve` on the
default pair with fresh state (nothing learned, nothing remembered), waits until the draft is
attached, and sends each prompt twice, streamed over HTTP as a client does: by default (the
governor) and with `"speculative": false`, one after the other, each after a task-less
"Say hello." (as the bench warms every server up). The default goes first: plain decoding never
reads the n-gram memory, so it gains nothing from the answer the first run left there, and the
governor never sees its prompt's answer before. The requests name no task, as an OpenAI client
names none (`--with-task` sends the workload's).

tok/s = answer tokens ÷ end-to-end time measured here; ratios come from this one run. At
temperature 0 both answers must be the same text (the `same` column).
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from homespec.bench_remote import Remote, run_remote, warm_up
from homespec.engine.types import GenerationStats
from homespec.workload import WorkItem, default_workload, load_workload

READY_WAIT_S = 600  # loading, calibrating and attaching the draft (about a minute here)


@dataclass
class Pair:
    task: str
    governed: GenerationStats
    plain: GenerationStats
    same: bool

    @property
    def ratio(self) -> float:
        return self.governed.tokens_per_s / self.plain.tokens_per_s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_speculative(client: httpx.Client, url: str, daemon: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_WAIT_S
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise SystemExit(f"homespec serve exited with {daemon.returncode}")
        try:  # the draft attached and the governor's costs measured (between requests)
            pairs = client.get(f"{url}/homespec/status", timeout=2).json()["pairs"]
            if any(p["mode"] == "speculative" and p["measured_after_s"] for p in pairs):
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"the daemon did not turn speculative in {READY_WAIT_S} s")


@contextmanager
def serving(prefix: str, config: Path | None = None) -> Iterator[str]:
    """`homespec serve` on the default pair with fresh state (a temporary --state-dir named
    `prefix`…), on a free port; its URL once the draft is attached, stopped on leaving."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    state = tempfile.mkdtemp(prefix=prefix)
    log = Path(state) / "daemon.log"
    cmd = [sys.executable, "-m", "homespec", "serve", "--port", str(port), "--state-dir", state]
    if config is not None:
        cmd += ["--config", str(config)]
    with log.open("wb") as sink:
        daemon = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
        try:
            print(f"homespec serve on {url} (log: {log}); waiting for its draft…", file=sys.stderr)
            with httpx.Client() as client:
                wait_until_speculative(client, url, daemon)
            yield url
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)


def run(items: list[WorkItem], daemon: Remote, with_task: bool) -> list[Pair]:
    out: list[Pair] = []
    with httpx.Client(timeout=600) as client:
        for n, item in enumerate(items, 1):
            task = {"task": item.task} if with_task else {}
            answers = []
            for speculative in ("auto", False):  # see the module docstring for the order
                warm_up(client, daemon)
                extra = {**task, "speculative": speculative}
                answers.append(
                    run_remote(client, daemon, item, temperature=0.0, max_tokens=None, extra=extra)
                )
            governed, plain = answers
            pair = Pair(item.task, governed.stats, plain.stats, governed.text == plain.text)
            out.append(pair)
            print(
                f"[{n}/{len(items)}] {item.task}: {plain.stats.completion_tokens} tok, plain "
                f"{plain.stats.tokens_per_s:.1f} tok/s, daemon "
                f"{governed.stats.tokens_per_s:.1f} ({pair.ratio:.2f}×)",
                file=sys.stderr,
                flush=True,
            )
    return out


def _throughput(runs: list[GenerationStats]) -> float:
    """Answer tokens per second of end-to-end time, over these answers together."""
    return 1000.0 * sum(r.completion_tokens for r in runs) / sum(r.e2e_ms for r in runs)


def table(pairs: list[Pair]) -> tuple[str, list[dict[str, Any]]]:
    rows: list[dict[str, Any]] = []
    for task in [*dict.fromkeys(p.task for p in pairs), "all"]:
        group = [p for p in pairs if task in ("all", p.task)]
        plain = _throughput([p.plain for p in group])
        gov = _throughput([p.governed for p in group])
        ratios = [p.ratio for p in group]
        same = sum(p.same for p in group) / len(group)
        rows.append(
            {
                "task": task,
                "prompts": len(group),
                "plain_tok_s": round(plain, 1),
                "daemon_tok_s": round(gov, 1),
                "ratio": round(gov / plain, 3),
                "min": round(min(ratios), 3),
                "max": round(max(ratios), 3),
                "same": same,
            }
        )
    head = (
        f"{'task':12s} {'prompts':>7s} {'plain':>7s} {'daemon':>7s} {'× plain':>8s}"
        f" {'(min–max)':>12s} {'same':>5s}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['task']:12s} {r['prompts']:7d} {r['plain_tok_s']:7.1f} {r['daemon_tok_s']:7.1f}"
            f" {r['ratio']:7.2f}× {r['min']:5.2f}–{r['max']:.2f}  {r['same']:4.0%}"
        )
    return "\n".join(lines), rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", type=Path, default=default_workload())
    ap.add_argument("--task", help="comma-separated tasks (default: all)")
    ap.add_argument("--with-task", action="store_true", help="send each prompt's task")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()
    items = load_workload(args.workload)
    if args.task:
        items = [i for i in items if i.task in args.task.split(",")]
    if not items:
        raise SystemExit(f"no prompts in {args.workload} for --task {args.task}")
    with serving("homespec-vs-plain-") as url:
        pairs = run(items, Remote("homespec-daemon", url), args.with_task)
    text, rows = table(pairs)
    print(
        f"daemon (default: the governor) against the same daemon with speculative=false, "
        f"{args.workload.name}, {'tasks named' if args.with_task else 'no task named'}"
    )
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"workload": str(args.workload), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
