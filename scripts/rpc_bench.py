#!/usr/bin/env python3
"""A target spread over this box and an RPC worker vs the same target on this box alone: the
demo pair, the shipped workload, plain and `auto`, one run.

    .venv/bin/python scripts/rpc_bench.py [--worker HOST:PORT] [--threads 1] [--ram 900MiB]
        [--max-tokens 128] [--json OUT.json]

Without --worker it starts `homespec worker` on a loopback port of this box: the layers then
cross a loopback socket, not a network, so the table shows what llama.cpp's RPC costs per
decode, and how much of it a verify step hides (it pays the round trip once for k tokens);
run a worker on another box for a real network. --ram caps what this box plans to hold, so
the plan puts the rest of the target on the worker (HOMESPEC_MEMORY_BUDGET); --threads is
used on both sides (a worker on the same box must not take this box's cores from it). Nothing
else should run meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from homespec.manifest import load_manifest  # noqa: E402
from homespec.workers import probe  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def manifest(directory: Path, endpoint: str, threads: int, worker_budget: str) -> Path:
    demo = load_manifest(REPO / "models.toml")
    target = demo.model_path("smollm2-135m-f32")
    draft = demo.model_path("smollm2-135m-q4_1")
    path = directory / "models.toml"
    pair = f'target = "t"\ndraft = "d"\nthreads = {threads}\nadapt_threads = false\n'
    path.write_text(
        f'[models.t]\npath = "{target}"\n[models.d]\npath = "{draft}"\n'
        f'[workers.w]\nendpoint = "{endpoint}"\nbudget = "{worker_budget}"\n'
        f'[pairs.split]\n{pair}target_workers = ["w"]\n[pairs.local]\n{pair}'
    )
    return path


def bench(config: Path, pair: str, args: argparse.Namespace, env: dict[str, str]) -> Any:
    cmd = [sys.executable, "-m", "homespec", "bench", "--config", str(config), "--pair", pair]
    cmd += ["--modes", "plain,auto", "--max-tokens", str(args.max_tokens), "--json"]
    print(f"rpc_bench: pair {pair}…", file=sys.stderr, flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"rpc_bench: bench failed:\n{done.stderr}")
    return json.loads(done.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--worker", help="HOST:PORT of a running `homespec worker` (default: start one)"
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ram", default="900MiB", help="what this box may plan to hold")
    ap.add_argument("--worker-budget", default="1GiB")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", type=Path, help="also write both bench reports here")
    args = ap.parse_args()
    worker = None
    endpoint = args.worker
    if endpoint is None:
        endpoint = f"127.0.0.1:{free_port()}"
        cmd = [sys.executable, "-m", "homespec", "worker", "--port", endpoint.split(":")[1]]
        cmd += ["--threads", str(args.threads), "--no-cache"]
        worker = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not probe("w", endpoint, 2.0).reachable:
            if worker.poll() is not None or time.monotonic() > deadline:
                sys.exit("rpc_bench: the worker did not start")
            time.sleep(0.2)
    env = {**os.environ, "HOMESPEC_MEMORY_BUDGET": f"ram={args.ram}"}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            config = manifest(Path(tmp), endpoint, args.threads, args.worker_budget)
            reports = {p: bench(config, p, args, env) for p in ("local", "split")}
    finally:
        if worker is not None:
            worker.kill()
            worker.wait()
    split_plan = reports["split"]["plan"]
    print(f"split plan: {split_plan['reason']}")
    rows: dict[str, dict[str, float]] = {}
    for pair, rep in reports.items():
        for row in rep["tasks"]:
            rows.setdefault(row["task"], {})[f"{pair} {row['mode']}"] = row["tokens_per_s"]
    print(
        "| task | local plain | local auto | split plain | split auto "
        "| split plain ÷ local plain | auto ÷ plain, local | auto ÷ plain, split |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for task, r in rows.items():
        lp, la, sp, sa = (
            r.get(k, 0.0) for k in ("local plain", "local auto", "split plain", "split auto")
        )
        print(
            f"| {task} | {lp:.1f} | {la:.1f} | {sp:.1f} | {sa:.1f} | {sp / lp:.2f} "
            f"| {la / lp:.2f} | {sa / sp:.2f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(reports, indent=2))


if __name__ == "__main__":
    main()
