#!/usr/bin/env python3
"""Several conversations taking turns on one server, as a daemon's users do.

    .venv/bin/python scripts/conversations.py [--cache-mb 256,0] [--against LABEL=URL …]
        [--conversations N] [--turns N] [--max-tokens N] [--no-titles] [--json OUT.json]

A chat's next turn resends the whole conversation. Between two turns of one chat, other
requests run: another user's chat, or the title and tags a client asks for after every answer
(Open WebUI does both). A server with one cache re-reads the conversation at each turn; one
that keeps conversations aside (homespec's `prompt_cache_mb`, llama-server's slots) reads only
the new message. This starts `homespec serve` on the default pair once per `--cache-mb` value
(a copy of models.toml with that prompt_cache_mb), and sends every server the same script:
N conversations, each opened by a prompt of the shipped workload's longer tasks (a code edit,
an extraction, boilerplate) and continued by follow-up questions, round-robin, each answer
followed by a title request. Greedy, streamed, a fresh connection each, as the bench sends.

The table: per server, the mean first-token time and end-to-end time of the first turns and of
the later ones, the later turns' prompt tokens the server said it had cached, and answer
tokens per second of end-to-end time over every conversation turn (titles left out of the
figures, not out of the run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from daemon_vs_plain import serving

from homespec.bench_remote import Remote, parse_against, run_remote, warm_up
from homespec.engine.types import GenerationStats, Message
from homespec.workload import WorkItem, default_workload, load_workload

OPENERS = ["code-edit", "extract", "boilerplate"]  # the shipped tasks with long prompts
FOLLOW_UPS = [
    "Now explain your answer in three short bullet points.",
    "Which part of that is most likely to be wrong? Answer briefly.",
    "Rewrite your first answer so that it is shorter.",
    "Thanks. Summarise the whole conversation in one sentence.",
]
TITLE = "Write a title of at most six words for a chat that begins: {first}"


@dataclass
class Turn:
    server: str
    conversation: int
    turn: int  # 0: the opening prompt
    stats: GenerationStats


def openers(n: int) -> list[WorkItem]:
    items = load_workload(default_workload())
    chosen = [i for task in OPENERS for i in items if i.task == task]
    return [chosen[k % len(chosen)] for k in range(n)]


def run_script(
    remote: Remote, starts: list[WorkItem], turns: int, max_tokens: int, titles: bool
) -> list[Turn]:
    chats = [list(item.messages) for item in starts]
    out: list[Turn] = []
    with httpx.Client(timeout=600) as client:
        warm_up(client, remote)
        for t in range(turns):
            for c, chat in enumerate(chats):
                if t:
                    chat.append(Message("user", FOLLOW_UPS[(t - 1) % len(FOLLOW_UPS)]))
                item = WorkItem(f"conv{c}", chat, max_tokens, 0)
                ans = run_remote(client, remote, item, temperature=0.0, max_tokens=max_tokens)
                chat.append(Message("assistant", ans.text))
                out.append(Turn(remote.label, c, t, ans.stats))
                s = ans.stats
                print(
                    f"{remote.label} conv{c} turn {t}: {s.prompt_tokens} prompt tokens "
                    f"({s.cached_tokens} cached), ttft {s.ttft_ms:.0f} ms, e2e {s.e2e_ms:.0f} ms",
                    file=sys.stderr,
                    flush=True,
                )
                if titles:
                    first = re.sub(r"\s+", " ", chat[-2 if not t else 0].content)[:300]
                    ask = WorkItem("title", [Message("user", TITLE.format(first=first))], 16, 0)
                    run_remote(client, remote, ask, temperature=0.0, max_tokens=16)
    return out


def summary(turns: list[Turn]) -> dict[str, Any]:
    first = [x.stats for x in turns if x.turn == 0]
    later = [x.stats for x in turns if x.turn > 0]
    every = [x.stats for x in turns]
    prompt = sum(s.prompt_tokens for s in later)
    return {
        "server": turns[0].server,
        "first_ttft_ms": statistics.mean(s.ttft_ms for s in first),
        "first_e2e_ms": statistics.mean(s.e2e_ms for s in first),
        "later_ttft_ms": statistics.mean(s.ttft_ms for s in later) if later else None,
        "later_e2e_ms": statistics.mean(s.e2e_ms for s in later) if later else None,
        "later_cached": sum(s.cached_tokens for s in later) / prompt if prompt else None,
        "tok_s": 1000.0 * sum(s.completion_tokens for s in every) / sum(s.e2e_ms for s in every),
    }


def render(rows: list[dict[str, Any]]) -> str:
    def ms(v: float | None) -> str:
        return "—" if v is None else f"{v:.0f}"

    head = (
        f"{'server':22s} {'ttft 1st':>8s} {'e2e 1st':>8s} {'ttft later':>10s} "
        f"{'e2e later':>9s} {'cached':>6s} {'tok/s':>6s} {'× first':>7s}"
    )
    lines = [head, "-" * len(head)]
    base = rows[0]["tok_s"]
    for r in rows:
        cached = "—" if r["later_cached"] is None else f"{r['later_cached']:.0%}"
        lines.append(
            f"{r['server']:22s} {ms(r['first_ttft_ms']):>8s} {ms(r['first_e2e_ms']):>8s} "
            f"{ms(r['later_ttft_ms']):>10s} {ms(r['later_e2e_ms']):>9s} {cached:>6s} "
            f"{r['tok_s']:6.1f} {r['tok_s'] / base:6.2f}×"
        )
    return "\n".join(lines)


def with_cache(mb: int) -> Path:
    """A copy of models.toml, beside it (its paths are relative), with prompt_cache_mb = mb."""
    shipped = Path("models.toml").read_text()
    text, n = re.subn(r"(?m)^prompt_cache_mb = \d+", f"prompt_cache_mb = {mb}", shipped)
    if not n:
        raise SystemExit("models.toml has no prompt_cache_mb line to set")
    path = Path(f".models-cache-{mb}-{os.getpid()}.toml")
    path.write_text(text)
    return path


def serve(mb: int, args: argparse.Namespace, starts: list[WorkItem]) -> list[Turn]:
    """The script through a fresh `homespec serve` whose pair keeps `mb` MiB of snapshots."""
    config = with_cache(mb)
    try:
        with serving("homespec-conversations-", config) as url:
            label = f"homespec cache {mb} MiB"
            return run_script(Remote(label, url), starts, args.turns, args.max_tokens, args.titles)
    finally:
        config.unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache-mb", default="256,0", help="homespec daemons to run ('' for none)")
    ap.add_argument("--against", action="append", default=[], help="LABEL=URL of another server")
    ap.add_argument("--conversations", type=int, default=3)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--no-titles", dest="titles", action="store_false")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    starts = openers(args.conversations)
    runs: list[list[Turn]] = []
    for mb in [int(x) for x in args.cache_mb.split(",") if x.strip()]:
        runs.append(serve(mb, args, starts))
    for i, value in enumerate(args.against, 1):
        runs.append(
            run_script(parse_against(value, i), starts, args.turns, args.max_tokens, args.titles)
        )
    rows = [summary(r) for r in runs]
    print(
        f"{args.conversations} conversations × {args.turns} turns, round-robin, "
        f"{'a title request after each answer' if args.titles else 'no title requests'}, "
        f"max_tokens {args.max_tokens}, greedy"
    )
    print(render(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
