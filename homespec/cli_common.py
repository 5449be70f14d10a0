"""What every CLI module shares: the error-printing group, logging to stderr, common options."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from homespec.errors import HomespecError
from homespec.vocab import DRAFTER_LABELS

F = TypeVar("F", bound=Callable[..., Any])


class Group(click.Group):
    """Turns a HomespecError into `Error: <what> — <what to do>` and its exit code (no traceback).

    Any other exception is a bug and keeps its traceback.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except HomespecError as err:
            click.echo(f"Error: {err}", err=True)
            ctx.exit(err.exit_code)


class FiniteRange(click.FloatRange):
    """click.FloatRange, refusing nan and inf: a NaN compares false with both bounds, so
    `--temperature nan` passed the range and sampled from NaN logits."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


class StderrHandler(logging.Handler):
    """Log records to whatever sys.stderr is at the time (warnings such as "pair runs
    degraded" are part of the CLI's output, so they follow stderr redirection)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            click.echo(self.format(record), err=True)
        except (OSError, ValueError, TypeError):  # a closed stream, a bad %-format
            self.handleError(record)


def config_option(f: F) -> F:
    return click.option(
        "--config",
        "config",
        type=click.Path(dir_okay=False, path_type=Path),
        envvar="HOMESPEC_CONFIG",
        help="The pairing manifest (default: ./models.toml, then ~/.config/homespec/models.toml).",
    )(f)


def pair_option(f: F) -> F:
    return click.option("--pair", help="Pair name from models.toml (default: default_pair).")(f)


def load_llama_first() -> None:
    """Load llama.cpp's shared library before numpy's: on an H100 a CUDA build crashed at model
    load when numpy came first. A command that runs llama.cpp in this process calls this
    before importing anything else of the engine."""
    import homespec.engine.llama_backend  # noqa: F401


def err(msg: str) -> None:
    click.echo(msg, err=True)


def stats_line(stats: dict[str, Any]) -> str:
    parts = []
    if stats["proposed_tokens"]:
        parts.append(
            f"accepted {stats['accepted_tokens']}/{stats['proposed_tokens']} "
            f"({stats['accept_rate']:.0%})"
        )
    if stats.get("prediction_tokens"):
        parts.append(f"prediction {stats['accepted_prediction_tokens']} kept")
    if stats.get("queue_ms", 0) >= 10:  # a daemon's answer that waited for others
        parts.append(f"queued {stats['queue_ms']:.0f} ms")
    parts += [
        f"ttft {stats['ttft_ms']:.0f} ms",
        f"e2e {stats['e2e_ms']:.0f} ms",
        f"{stats['tokens_per_s']:.0f} tok/s",
    ]
    if stats.get("seed") is not None:  # sampled: --seed N gives this answer again
        parts.append(f"seed {stats['seed']}")
    if stats.get("context_full"):
        parts.append("cut: the context is full")
    if stats["mode"] == "speculative":
        parts.append(f"speculative ({DRAFTER_LABELS[stats['drafter']]})")
    else:
        parts.append(f"plain ({stats['reason']})")
    return " · ".join(parts)
