"""`homespec bench`: plain against each speculative mode of a pair, and other servers, on the
same prompts."""

from __future__ import annotations

import json
from pathlib import Path

import click

from homespec.cli_common import FiniteRange, config_option, err, load_llama_first, pair_option


@click.command()
@config_option
@pair_option
@click.option(
    "--workload",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="JSONL: task, messages, max_tokens per line (default: the shipped workload).",
)
@click.option("--repeat", type=click.IntRange(1, 100), default=1, show_default=True)
@click.option(
    "--modes",
    default=None,
    help="Comma-separated from plain,auto,model,ngram,hybrid (default: all the pair can run).",
)
@click.option("--task", "tasks", multiple=True, help="Only these tasks (repeatable).")
@click.option("--max-tokens", type=click.IntRange(1), help="Cap every request's max_tokens.")
@click.option("--temperature", type=FiniteRange(0.0, 5.0), default=0.0, show_default=True)
@click.option(
    "--against",
    "against",
    multiple=True,
    metavar="LABEL=URL",
    help="Also send every request to this OpenAI-compatible server (e.g. a llama-server) and "
    "put it in the table as LABEL (repeatable). One that does not answer is an error before "
    "the pair loads.",
)
@click.option(
    "--threads",
    type=click.IntRange(1, 512),
    help="CPU threads for the pair (default: its models.toml setting), e.g. to match --against.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with a tasks list.")
def bench(
    config: Path | None,
    pair: str | None,
    workload: Path | None,
    repeat: int,
    modes: str | None,
    tasks: tuple[str, ...],
    max_tokens: int | None,
    temperature: float,
    against: tuple[str, ...],
    threads: int | None,
    as_json: bool,
) -> None:
    """A/B benchmark: plain vs each speculative mode of a pair, on the same prompts.

    Reports per task the tok/s (answer tokens over end-to-end time, all runs together), the
    median e2e and ttft, accept rate, mean accepted drafts per step, speedup vs plain (ratio of
    tok/s from this run, with the per-prompt min–max) and the share of answers identical to
    plain decoding's. With --against, other servers get the same requests, interleaved with
    homespec's, and their speedup is against homespec plain. Under the table, auto's tok/s per
    task over plain's, over the fastest forced mode's and over the fastest other server's.

    Each repeat starts with an empty n-gram memory, except with --against: the other servers'
    memories cannot be emptied (llama-server's ngram-mod), so homespec's is kept as well and
    later repeats find the prompt's earlier answer in both.
    """
    load_llama_first()
    from homespec.bench import bench_pair, render_table
    from homespec.bench_remote import parse_against
    from homespec.bench_standing import render_standings, standings
    from homespec.doctor import render_memory
    from homespec.errors import ConfigError
    from homespec.manifest import load_manifest
    from homespec.workload import default_workload, load_workload

    remotes = [parse_against(value, i) for i, value in enumerate(against, 1)]
    manifest = load_manifest(config)
    items = load_workload(workload or default_workload())
    if tasks:
        items = [i for i in items if i.task in tasks]
        if not items:
            raise ConfigError(f"no workload items for task(s) {', '.join(tasks)}", "check --task")
    report = bench_pair(
        manifest,
        pair,
        items,
        modes=modes,
        repeat=repeat,
        temperature=temperature,
        max_tokens=max_tokens,
        progress=err,
        remotes=remotes,
        threads=threads,
    )
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        click.echo(render_table(report.rows))
        standing = render_standings(standings(report.rows))
        if standing:
            click.echo("\n" + standing)
        p = report.plan
        click.echo(f"\nmemory plan: {p.rung} → {p.mode} ({p.reason})")
        click.echo(render_memory(report.memory))
