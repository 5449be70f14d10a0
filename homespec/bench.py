"""The A/B harness behind `homespec bench`.

Same prompts, same settings, one loaded pair: plain decoding and each speculative mode run
interleaved per prompt (the order rotates so no mode always runs on a warmer cache), after a
warm-up. A task's tok/s is its answer tokens over its end-to-end time, all its runs together
(a median of runs would pick one prompt's figure when a task mixes long and short answers);
speedups are ratios of those from this one run, never compared to numbers from another run
or machine.

Every run starts where a server that just answered some other chat would be: its caches hold
another conversation (so a run reuses the chat template's opening, as a daemon or llama-server
does, but nothing of its own prompt; a server compared with `--against` is sent that other
chat before each of its runs too), and the n-gram memory holds the workload's earlier prompts
and answers, never the prompt at hand (it learns each prompt once, from the last of its runs).
The memory starts empty at each repeat, unless servers are compared with `--against`: their
memories (llama-server's ngram-mod table) cannot be emptied, so from the second repeat on they
have seen the prompt before, and homespec's memory is kept too, to be fair to both.

The governor learns how often drafts are kept from `auto`'s runs only: forced modes run the
same prompts first, and what they measured made auto look better than a server running auto
gets (at temperature 1 the draft model had been measured by the forced runs, while auto on its
own never tried it). Costs are the machine's and every run keeps them current.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from homespec import heap
from homespec.bench_remote import WARM_UP, Remote, preflight, run_remote, warm_up
from homespec.bench_standing import standings
from homespec.engine.calibration import calibrate
from homespec.engine.chat_text import chat_tokens
from homespec.engine.generate import complete
from homespec.engine.runtime import PairRuntime
from homespec.engine.types import GenerationRequest, GenerationStats, Message
from homespec.errors import ConfigError
from homespec.manifest import NGRAM, NO_DRAFT, Manifest
from homespec.plan_types import PairPlan
from homespec.vocab import DRAFTERS, BenchMode
from homespec.workload import WorkItem

PLAIN: BenchMode = "plain"
AUTO: BenchMode = "auto"  # what the manifest's policy picks per task (speculation may be off)
# With --against, a pause before each run: llama.cpp's CPU threads (homespec's and the other
# server's) spin for a while after a decode, and that must not slow whichever runs next.
SETTLE_S = 0.5
Progress = Callable[[str], None]


@dataclass
class Run:
    task: str
    item: int
    repeat: int
    mode: str
    text: str
    stats: GenerationStats
    other_server: bool = False  # another server's answer (--against), not homespec's own


@dataclass
class Row:
    task: str
    mode: str
    runs: int
    tokens_per_s: float
    e2e_ms: float
    ttft_ms: float
    accept_rate: float | None
    mean_accepted_length: float | None
    speedup: float | None
    speedup_min: float | None
    speedup_max: float | None
    identical: float | None  # share of runs whose text equals plain's (another server: greedy)
    reasons: list[str] = field(default_factory=list)
    other_server: bool = False  # another server (--against) that is not a homespec daemon

    def to_dict(self) -> dict[str, Any]:
        r = _round
        return {
            "task": self.task,
            "mode": self.mode,
            "runs": self.runs,
            "speedup": r(self.speedup),
            "speedup_min": r(self.speedup_min),
            "speedup_max": r(self.speedup_max),
            "accept_rate": r(self.accept_rate),
            "mean_accepted_length": r(self.mean_accepted_length),
            "tokens_per_s": r(self.tokens_per_s, 2),
            "e2e_ms": r(self.e2e_ms, 1),
            "ttft_ms": r(self.ttft_ms, 1),
            "identical": r(self.identical),
            "reasons": self.reasons,
            "other_server": self.other_server,
        }


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "—" if value is None else format(value, spec) + suffix


def available_modes(has_draft: bool) -> list[str]:
    return [PLAIN, *DRAFTERS] if has_draft else [PLAIN, "ngram"]


def choose_modes(requested: str | None, *, has_draft: bool, pair: str) -> list[str]:
    """The modes to run from a --modes value ("plain,ngram"); plain always included first.
    By default plain, auto (what homespec does unless told otherwise) and every drafter forced."""
    if not requested:
        return [PLAIN, AUTO, *available_modes(has_draft)[1:]]
    # Named twice, a mode runs once: its row would repeat, and its runs would warm each other.
    chosen = list(dict.fromkeys(m.strip() for m in requested.split(",") if m.strip()))
    allowed = [*available_modes(has_draft), "auto"]
    bad = [m for m in chosen if m not in allowed]
    if bad:
        raise ConfigError(
            f"--modes: {', '.join(bad)} not available for pair {pair!r}",
            f"choose from {', '.join(allowed)}",
        )
    if PLAIN not in chosen:
        chosen.insert(0, PLAIN)  # every speedup needs its baseline from this run
    return chosen


def _request(
    item: WorkItem, mode: str, temperature: float, max_tokens: int | None, *, remember: bool
) -> GenerationRequest:
    return GenerationRequest(
        messages=item.messages,
        max_tokens=min(item.max_tokens, max_tokens) if max_tokens else item.max_tokens,
        temperature=temperature,
        seed=0,
        task=item.task,
        prediction=item.prediction,
        # Each mode is measured as such: speculation forced on, off for the baseline, or left
        # to the policy for "auto".
        speculative=None if mode == AUTO else mode != PLAIN,
        drafter=None if mode in (PLAIN, AUTO) else mode,  # type: ignore[arg-type]
        remember=remember,
        learn=mode == AUTO,  # auto learns acceptance from its own runs only
    )


def _another_chat(rt: PairRuntime) -> None:
    """Leave the caches holding some other conversation: otherwise whichever mode runs a
    prompt first pays its prompt evaluation and the others reuse it all; with nothing cached
    every run would pay for the template's opening, which a serving daemon does not."""
    rt.clear_caches()
    talk = [Message(m["role"], m["content"]) for m in WARM_UP]
    other = chat_tokens(rt.target.model, talk, allow_special=rt.spec.allow_special_tokens)
    rt.target.extend(other, 1)
    if rt.draft is not None:
        rt.draft.ctx.extend(other, 1)


def _run_one(rt: PairRuntime, req: GenerationRequest) -> tuple[str, GenerationStats]:
    _another_chat(rt)
    return complete(rt, req)


def warm_up_modes(rt: PairRuntime, item: WorkItem, modes: list[str], temperature: float) -> None:
    """Touch every mode once (16 tokens of `item`) so page faults and first-graph costs hit no
    measured run. It teaches the governor nothing and the memory nothing: the other servers
    are warmed up with a greeting, and auto warmed up on the workload's first prompt knew
    that task's answers run long before its first measured run, as a fresh daemon does not
    (its first boilerplate answer ran 1.07-1.15x the daemon's in three runs, 0.95-1.10x in
    five since)."""
    for mode in modes:
        req = _request(item, mode, temperature, 16, remember=False)
        _run_one(rt, replace(req, learn=False))


def run_bench(
    rt: PairRuntime,
    items: list[WorkItem],
    *,
    modes: list[str],
    repeat: int = 1,
    temperature: float = 0.0,
    max_tokens: int | None = None,
    progress: Progress = lambda _: None,
    remotes: list[Remote] | None = None,
    client: httpx.Client | None = None,
) -> list[Run]:
    """Every mode (and every remote server) on every prompt, interleaved per prompt."""
    by_label = {r.label: r for r in remotes or []}
    warm_up_modes(rt, items[0], modes, temperature)
    if by_label:
        assert client is not None
        for remote in by_label.values():
            warm_up(client, remote)
    names = [*modes, *by_label]
    runs: list[Run] = []
    total = len(items) * repeat * len(names)
    memory = rt.ngram.memory
    for rep in range(repeat):
        if memory is not None and not by_label:  # see the module docstring
            memory.clear()
        for idx, item in enumerate(items):
            shift = (idx + rep) % len(names)
            order = names[shift:] + names[:shift]
            learns = [m for m in order if m not in by_label][-1]
            for mode in order:
                if mode in by_label:
                    # As homespec's runs start (_another_chat): the server's cache holds some
                    # other chat, never this prompt from an earlier repeat.
                    assert client is not None
                    warm_up(client, by_label[mode])
                if by_label:
                    time.sleep(SETTLE_S)
                if mode in by_label:
                    assert client is not None
                    text, stats, own = run_remote(
                        client,
                        by_label[mode],
                        item,
                        temperature=temperature,
                        max_tokens=max_tokens,
                    )
                else:
                    req = _request(item, mode, temperature, max_tokens, remember=mode == learns)
                    text, stats = _run_one(rt, req)
                    own = True
                runs.append(Run(item.task, idx, rep, mode, text, stats, other_server=not own))
                rate = "" if stats.accept_rate is None else f", accept {stats.accept_rate:.0%}"
                progress(
                    f"[{len(runs)}/{total}] {item.task} #{idx + 1} {mode}: "
                    f"{stats.completion_tokens} tok, {stats.tokens_per_s:.1f} tok/s{rate}"
                )
    return runs


def _median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def _throughput(runs: list[Run]) -> float:
    """Answer tokens per second of end-to-end time, over all these runs together."""
    ms = sum(r.stats.e2e_ms for r in runs)
    return 1000.0 * sum(r.stats.completion_tokens for r in runs) / ms if ms > 0 else 0.0


def summarize(runs: list[Run], *, temperature: float = 0.0) -> list[Row]:
    plain = {(r.item, r.repeat): r for r in runs if r.mode == PLAIN}
    groups: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.task, r.mode), []).append(r)
        groups.setdefault(("all", r.mode), []).append(r)
    rows = []
    for (task, mode), rs in groups.items():
        proposed = sum(r.stats.proposed_tokens for r in rs)
        accepted = sum(r.stats.accepted_tokens for r in rs)
        draft_steps = sum(r.stats.draft_steps for r in rs)
        tps = _throughput(rs)
        base = [plain[(r.item, r.repeat)] for r in rs if (r.item, r.repeat) in plain]
        speedup = lo = hi = identical = None
        base_tps = _throughput(base)
        if base and mode != PLAIN and base_tps > 0:
            speedup = tps / base_tps
            ratios = [
                r.stats.tokens_per_s / plain[(r.item, r.repeat)].stats.tokens_per_s
                for r in rs
                if plain[(r.item, r.repeat)].stats.tokens_per_s > 0
            ]
            lo, hi = min(ratios), max(ratios)
            # Sampled with seed 0, homespec's answer is plain's on every drafter too
            # (sampling.py); another server samples with its own random numbers.
            if temperature == 0.0 or not any(r.other_server for r in rs):
                same = sum(r.text == plain[(r.item, r.repeat)].text for r in rs)
                identical = same / len(rs)
        rows.append(
            Row(
                task=task,
                mode=mode,
                runs=len(rs),
                tokens_per_s=tps,
                e2e_ms=_median(r.stats.e2e_ms for r in rs),
                ttft_ms=_median(r.stats.ttft_ms for r in rs),
                accept_rate=accepted / proposed if proposed else None,
                mean_accepted_length=accepted / draft_steps if draft_steps else None,
                speedup=speedup,
                speedup_min=lo,
                speedup_max=hi,
                identical=identical,
                reasons=sorted({r.stats.reason for r in rs}),
                other_server=any(r.other_server for r in rs),
            )
        )
    order = {t: i for i, t in enumerate(dict.fromkeys(r.task for r in runs))}
    order["all"] = len(order)
    mode_order = {m: i for i, m in enumerate(dict.fromkeys(r.mode for r in runs))}
    rows.sort(key=lambda row: (order[row.task], mode_order[row.mode]))
    return rows


def render_table(rows: list[Row]) -> str:
    w = max([6, *(len(r.mode) for r in rows)])
    head = (
        f"{'task':<12} {'mode':<{w}} {'runs':>4} {'tok/s':>7} {'e2e ms':>8} {'ttft ms':>8} "
        f"{'accept':>7} {'acc/step':>8} {'speedup':>8} {'(min–max)':>12} {'same':>5}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        span = "" if r.speedup_min is None else f"{r.speedup_min:.2f}–{r.speedup_max:.2f}"
        lines.append(
            f"{r.task:<12} {r.mode:<{w}} {r.runs:>4} {r.tokens_per_s:>7.1f} {r.e2e_ms:>8.0f} "
            f"{r.ttft_ms:>8.0f} {_fmt(r.accept_rate, '.0%'):>7} "
            f"{_fmt(r.mean_accepted_length, '.2f'):>8} {_fmt(r.speedup, '.2f', '×'):>8} "
            f"{span:>12} {_fmt(r.identical, '.0%'):>5}"
        )
    return "\n".join(lines)


@dataclass
class BenchReport:
    pair: str
    temperature: float
    repeat: int
    modes: list[str]
    rows: list[Row]
    plan: PairPlan
    memory: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "pair": self.pair,
            "temperature": self.temperature,
            "repeat": self.repeat,
            "modes": self.modes,
            "tasks": [r.to_dict() for r in self.rows],
            "auto_standing": [s.to_dict() for s in standings(self.rows)],
            "plan": self.plan.to_dict(),
            "memory": self.memory,
        }


def bench_pair(
    manifest: Manifest,
    pair: str | None,
    items: list[WorkItem],
    *,
    modes: str | None,
    repeat: int,
    temperature: float,
    max_tokens: int | None,
    progress: Progress,
    remotes: list[Remote] | None = None,
    threads: int | None = None,
) -> BenchReport:
    """Load the pair (filling its contexts once, to measure memory), run every mode on every
    prompt, and summarize per task. `modes`: the --modes value (None: all the pair has);
    `remotes`: other OpenAI-compatible servers sent the same requests (`--against`)."""
    from homespec.engine.loader import load_pair
    from homespec.memcheck import memory_rows

    name, spec = manifest.pair(pair)
    if threads:  # --threads: the same CPU threads as the server it is compared with
        spec = manifest.spec.pairs[name] = spec.model_copy(update={"threads": threads})
    has_draft = spec.draft not in (NGRAM, NO_DRAFT)
    chosen = choose_modes(modes, has_draft=has_draft, pair=name)
    remotes = remotes or []
    clash = [r.label for r in remotes if r.label in (*available_modes(True), AUTO)]
    if clash or len({r.label for r in remotes}) < len(remotes):
        raise ConfigError(
            f"--against: label {', '.join(clash) or 'used twice'} clashes with another column",
            "give each server its own label: --against LABEL=URL",
        )
    with httpx.Client(timeout=httpx.Timeout(10, read=600)) as client:
        preflight(client, remotes)  # a server that is not there fails now, not after the load
        progress("bench: loading the pair and filling its contexts once (to measure memory)…")
        with load_pair(manifest, name, measure_peak=True, huge_pages="now") as loaded:
            rt = loaded.runtime
            memory = memory_rows(loaded)
            calibrate(rt)  # the governor ("auto") starts from this machine's costs
            heap.settle()  # as the daemon's engine does: no full collection inside a measured run
            if has_draft and rt.draft is None:
                chosen = [m for m in chosen if m not in ("model", "hybrid")]
                progress(f"bench: no draft model modes: {rt.draft_unavailable_reason}")
            against = "".join(f", {r.label} ({r.url})" for r in remotes)
            progress(
                f"bench: pair {rt.name}, {len(items)} prompts × {repeat} × modes "
                f"{', '.join(chosen)}{against} (temperature {temperature:g})"
            )
            runs = run_bench(
                rt,
                items,
                modes=chosen,
                repeat=repeat,
                temperature=temperature,
                max_tokens=max_tokens,
                progress=progress,
                remotes=remotes,
                client=client,
            )
    rows = summarize(runs, temperature=temperature)
    labels = [*chosen, *(r.label for r in remotes)]
    return BenchReport(name, temperature, repeat, labels, rows, loaded.plan, memory)
