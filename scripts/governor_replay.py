#!/usr/bin/env python3
"""The governor's choices priced at fixed costs: a deterministic A/B of decision changes.

    .venv/bin/python scripts/governor_replay.py [--workload F] [--task T,…] [--modes plain,auto]
        [--costs cpu|gpu|h100|FILE.json] [--pair NAME] [--why] [--trace] [--json OUT.json]
        [--no-task] [--chatter] [--oracle-horizon] [--calibration]

On a 2-core box one bench run's ratios swing by 10–20%: the machine's speed wanders, and the
governor, which decides from the costs it measures, decides differently from run to run (one
list answer ran at 43 and at 57 tok/s in `auto` on the same code). That hides the few percent
a change to the decision is worth. Here the real models answer the real prompts (temperature
0, so every answer is the target's own, the same in every mode), but the governor is given one
fixed cost table and never a timing, and each request's time is that table's price of every
decode that ran in it, target and draft model, the prompt's included: the same code gives the
same figures, to the digit, on any machine and under any load. Run it before and after a
change (a git worktree for the old code) and compare.

What it does not measure: whether the table is this machine's. `cpu` is the demo pair on the
2-core box these notes come from (see README), `gpu` a launch-bound tiny pair on one H100
(issue 8's llama-bench figures), `h100` the demo pair on one H100 as homespec measured it
in-process, with each step's own work priced too (the Python around the decodes, about a
millisecond there: STEPS), FILE a JSON object {"verify": {"1": ms, …}, "draft": {"1": ms, …},
"step": {"plain": ms, "drafting": ms, "lookup": ms, "choice": ms}, "copy": ms} (ms of one
decode by tokens in it; `homespec doctor --measure` prints this machine's; "step", optional,
what a step costs beyond its decodes, by STEPS' kinds: scripts/step_overhead.py measures it;
"copy", optional, ms per token the target holds that copying its cache into the draft model
costs, where the pair's draft reads the target's cache: engine/cache_share.py; without one,
as on the GPU presets, the draft model decodes every catch-up). Speed claims
still come from `homespec bench`; this says whether a decision change helps at given costs.

`--costs live` gives the governor this machine's costs as the engine does (calibrated at load,
kept current from real steps) and times every request by the clock: with `--trace`, each step's
real ms per committed token beside what the governor expected of it, to check its cost model
against the machine (the figures are this run's, not reproducible ones).

`--calibration` checks lookup's acceptance estimates against what its drafts kept: every
n-gram draft of an `auto` answer past its first step (which carries the prompt), position by
position, as the governor estimated it (the chance a position is kept, given the ones before
it were) against how often it was; and per kind of match (where it was found, its length's
bucket) what those drafts gained over the plain steps that would have committed the same tokens
at these costs; and by the step's estimated speedup over plain, what those bets realized (do
the marginal ones, just past the margin a drafter must beat plain by, pay?). A bias there is a
pricing fault; losses on a table that is right on average are single answers' luck.

`--oracle-horizon` tells the governor how long each answer will run (its plain answer's
length) from its first token: the ceiling of predicting answer lengths. What `auto` trails the
best forced mode by with it is the pricing's; what it gains over `auto` without it is what a
better length prediction could win.

Each run starts as the bench's do (another chat in both caches), but with no warm-up before
the first, as a fresh daemon's first requests; the n-gram memory learns each prompt from the
last mode's run; the draft model's agreement with the target is measured as at load (argmax
on a fixed chat: the same every time); the thread adapter is off (no timings to adapt to).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import homespec.engine.llama_backend  # noqa: F401  (llama.cpp's library before numpy's)

# isort: split
from lookup_calibration import LookupCalibration, conditional_rates

from homespec.bench import (
    AUTO,
    PLAIN,
    Run,
    _another_chat,
    _request,
    render_table,
    summarize,
)
from homespec.bench_remote import WARM_UP
from homespec.engine import generate as loop
from homespec.engine.cache_share import Sharing
from homespec.engine.calibration import agreement, calibrate, probe_sharing, share_cache
from homespec.engine.drafters import Proposal
from homespec.engine.estimates import CostCurve, expected_by_length, match_bucket
from homespec.engine.generate import generate
from homespec.engine.governor import plain_ms
from homespec.engine.governor_types import Choice, Inputs
from homespec.engine.llama_backend import LlamaContext
from homespec.engine.loader import load_pair
from homespec.engine.runtime import PairRuntime
from homespec.engine.types import GenerationRequest, GenerationStats, Message
from homespec.manifest import load_manifest
from homespec.workload import WorkItem, load_workload

SHIPPED = Path(__file__).resolve().parent.parent.parent / "shared" / "prompts" / "workload.jsonl"
PRESETS: dict[str, dict[str, dict[int, float]]] = {
    # SmolLM2-135M F32 target, Q4_1 draft, 2 threads of a 2-core AMD EPYC (median live steps)
    "cpu": {
        "verify": {1: 26.0, 2: 36.0, 4: 42.0, 8: 52.0, 16: 76.0, 32: 112.0, 64: 190.0},
        "draft": {1: 10.0, 2: 17.0, 8: 40.0, 32: 125.0, 64: 240.0},
    },
    # The same pair on one H100, all layers on the GPU: launch-bound, verifying is about free
    # (issue 8's llama-bench figures)
    "gpu": {
        "verify": {1: 2.1, 2: 2.15, 4: 2.2, 8: 2.4, 16: 2.7, 32: 3.1, 64: 3.7},
        "draft": {1: 1.08, 2: 1.1, 8: 1.3, 32: 1.9, 64: 2.6},
    },
    # The same, as homespec measures it in-process (`doctor --measure` on one H100, stop 54):
    # a one-token decode is a CUDA graph's replay, anything longer is not, so 2 tokens cost
    # 2.3x one and 4 to 16 about 3x; and each step's own work, from that run's tables
    # (STEPS below)
    "h100": {
        "verify": {1: 1.21, 2: 2.77, 4: 3.42, 8: 3.54, 16: 3.68, 32: 5.08},
        "draft": {1: 1.07, 8: 3.48, 32: 5.13},
    },
}
# ms a step costs beyond its decodes (homespec's own work), by kind: a step of plain decoding,
# a drafting step, and what a governed step adds to either: its n-gram lookup (or, while a plain
# choice stands, its glance: governor.standing), and asking the governor (governor.settled
# skips that on some steps). On the H100: plain 734 tok/s against a 1.21-ms decode; an answer
# `auto` ran wholly plain 14% slower than plain (unseen-5's explanation), split as the 2-core
# box splits it (lookup 32 µs, asking 130; a glance, measured there later in the loop, 15 µs to
# a lookup's 27–39); forced lookup's steps about a millisecond past their verify (the shipped
# code edits). A CPU's 20-ms steps leave these in the noise.
STEPS: dict[str, dict[str, float]] = {
    "h100": {"plain": 0.15, "drafting": 1.0, "lookup": 0.06, "glance": 0.03, "choice": 0.22}
}
STEP_KINDS = ("plain", "drafting", "lookup", "glance", "choice")
# ms per token the target holds, to copy its cache into the draft model (engine/cache_share.py):
# on the 2-core box, 1.2 ms for 64 tokens, 5.3 for 256, 9.5 for 512, 32 for 1,900
COPIES: dict[str, float] = {"cpu": 0.02}
LIVE = "live"  # --costs: this machine's, measured, and the clock's time


class Clock(Protocol):
    """ms since the request began, at clock[0] (setting it to 0 starts a request)."""

    def __getitem__(self, index: int, /) -> float: ...
    def __setitem__(self, index: int, value: float, /) -> None: ...


class WallClock:
    """`Clock` read from the machine's clock, for `--costs live`: clock[0] = 0.0 restarts it."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __getitem__(self, index: int, /) -> float:
        return (time.perf_counter() - self.start) * 1000.0

    def __setitem__(self, index: int, value: float, /) -> None:
        self.start = time.perf_counter() - value / 1000.0


def cost_table(spec: str) -> dict[str, dict[int, float]]:
    if spec in PRESETS:
        return PRESETS[spec]
    raw = json.loads(Path(spec).read_text())
    parts = ("verify", "draft")
    return {part: {int(n): float(ms) for n, ms in raw[part].items()} for part in parts}


def step_table(spec: str) -> dict[str, float]:
    """A preset's STEPS, or a JSON file's optional "step" object ({} : steps cost nothing)."""
    if spec in PRESETS:
        return STEPS.get(spec, {})
    raw = json.loads(Path(spec).read_text()).get("step", {})
    return {kind: float(raw.get(kind, 0.0)) for kind in STEP_KINDS}


def copy_price(spec: str) -> float | None:
    """A preset's copy price (COPIES), or a JSON file's optional "copy" (None: none)."""
    if spec in PRESETS:
        return COPIES.get(spec)
    raw = json.loads(Path(spec).read_text()).get("copy")
    return None if raw is None else float(raw)


def pin_copies(rt: PairRuntime, per_token: float | None, clock: Clock) -> None:
    """Price each copy of the target's cache into the draft model at `per_token` ms per token
    the target holds, on clock[0] and in the governor's estimate alike; none where the table
    has no price (the draft model then decodes every catch-up, as it does where its cache is
    not the target's shape)."""
    if per_token is None or not rt.sharing.on:
        share_cache(rt, Sharing(False, "decodes the history itself: the cost table prices no copy"))
        return
    rt.ledger.copy_per_token = per_token

    def copied(cells: int, ms: float) -> None:
        clock[0] += per_token * cells

    rt.ledger.observe_copy = copied  # type: ignore[method-assign]


def pin_steps(rt: PairRuntime, steps: dict[str, float], clock: Clock) -> None:
    """Price each step's own work at `steps` (step_table) on clock[0], and give the governor
    the same figures as its measured overhead (never this machine's: its Python is not the
    table's)."""
    plain, drafting, lookup, glance, asking = (steps.get(k, 0.0) for k in STEP_KINDS)
    governed = plain + lookup + asking
    drafts = governed - plain + drafting
    rt.ledger.overhead = {"none": governed, "ngram": drafts, "model": drafts}
    rt.ledger.observe_step = lambda option, wall_ms: None  # type: ignore[method-assign]
    extra = [0.0]  # this step's governor work so far
    governed_step = [False]  # a forced lookup's own work is in its `drafting`, not `lookup`
    started = rt.ledger.step_started
    choose: Callable[[Inputs], Choice] = vars(loop)["choose"]
    verify: Callable[..., tuple[int, int]] = vars(loop)["verify"]
    ngram = rt.ngram
    propose, glanced = ngram.propose, ngram.glance

    def step_started() -> None:
        extra[0], governed_step[0] = 0.0, True  # it looks up or glances, and may ask
        started()

    def looked_up(*args: Any, **kw: Any) -> Proposal:
        if governed_step[0] and not waiting[0]:
            extra[0] += lookup
        return propose(*args, **kw)

    # A lookup while the target decodes (a standing step's, to learn from: generate.look_up)
    # is free: on a GPU the card is still computing, and on a CPU nothing stands.
    waiting = [False]
    extend = rt.target.extend

    def extended(
        history: list[int], n_logits: int = 1, while_waiting: Callable[[], None] | None = None
    ) -> Any:
        def in_the_shadow() -> None:
            assert while_waiting is not None
            waiting[0] = True
            try:
                while_waiting()
            finally:
                waiting[0] = False

        return extend(history, n_logits, in_the_shadow if while_waiting else None)

    def glanced_at(history: list[int]) -> bool:
        extra[0] += glance
        return glanced(history)

    def asked(inp: Inputs) -> Choice:
        extra[0] += asking
        return choose(inp)

    def priced(drafts: list[int], *args: object, **kw: object) -> tuple[int, int]:
        clock[0] += (drafting if drafts else plain) + extra[0]
        extra[0], governed_step[0] = 0.0, False
        return verify(drafts, *args, **kw)

    rt.ledger.step_started = step_started  # type: ignore[method-assign]
    rt.target.extend = extended  # type: ignore[method-assign]
    ngram.propose, ngram.glance = looked_up, glanced_at  # type: ignore[method-assign]
    vars(loop).update(choose=asked, verify=priced)


def pin_costs(rt: PairRuntime, table: dict[str, dict[int, float]], clock: Clock) -> None:
    """Give the governor `table` and nothing else, and add each decode's price to clock[0]
    (by the same curves: they never change)."""
    verify, draft = CostCurve(dict(table["verify"])), CostCurve(dict(table["draft"]))
    for curve in (verify, draft):
        curve.observe = lambda n, ms: None  # type: ignore[method-assign]
    rt.ledger.verify = rt.ledger.quiet = verify
    rt.ledger.draft = draft
    # The ledger's own bookkeeping, fed the table's prices, never the clock's: no drift (every
    # decode costs what the calibration, the same table, says), and the decoding since plain's
    # last measurement (the governor's PROBE_MS) counted at those prices.
    observe_verify, observe_draft = rt.ledger.observe_verify, rt.ledger.observe_draft
    rt.ledger.observe_verify = lambda n, ms: observe_verify(n, verify.at(n) or 0.0)  # type: ignore[method-assign]
    rt.ledger.observe_draft = lambda decodes: observe_draft(  # type: ignore[method-assign]
        [(n, draft.at(n) or 0.0) for n, _ in decodes]
    )
    rt.threads = None
    contexts = [(rt.target, verify)]
    if rt.draft is not None:
        contexts.append((rt.draft.ctx, draft))
    for ctx, curve in contexts:
        assert isinstance(ctx, LlamaContext)  # the real models: their decodes are priced
        decode: Callable[[list[int], int, int, int], None] = ctx._decode

        def priced(
            history: list[int],
            start: int,
            end: int,
            first_logit: int,
            decode: Callable[[list[int], int, int, int], None] = decode,
            curve: CostCurve = curve,
        ) -> None:
            clock[0] += curve.at(end - start) or 0.0
            decode(history, start, end, first_logit)

        ctx._decode = priced  # type: ignore[method-assign]


class Tracer:
    """One line per verify step of an answer: what the governor saw (lag: tokens the draft
    model is behind; match: n-gram proposal length/match length, then where it was found, m for
    an earlier request (the memory), p for the prediction, and c where it is contested;
    horizon: answer tokens still expected), what it chose, and how many drafts were kept."""

    def __init__(
        self,
        rt: PairRuntime,
        clock: Clock,
        live: bool = False,
        calibration: LookupCalibration | None = None,
    ) -> None:
        self.rt, self.clock, self.last, self.live = rt, clock, 0.0, live
        self.calibration = calibration
        self.lines: list[str] = []
        self.on = False
        self._seen: tuple[Inputs, Choice] | None = None
        self.verify_ms = 0.0  # the last target decode's, by the clock (live)
        observe = rt.ledger.observe_verify

        def spy_observe(n: int, ms: float) -> None:
            self.verify_ms = ms
            observe(n, ms)

        rt.ledger.observe_verify = spy_observe  # type: ignore[method-assign]
        # what the loop calls, as pin_steps left them
        choose: Callable[[Inputs], Choice] = vars(loop)["choose"]
        verify: Callable[..., tuple[int, int]] = vars(loop)["verify"]

        def spy_choose(inp: Inputs) -> Choice:
            choice = choose(inp)
            # the curve as priced (the step's own decode updates the ledger's before its line)
            curve = CostCurve(dict(inp.verify.points), inp.verify.slope)
            self._seen = (replace(inp, verify=curve), choice)
            return choice

        def spy_verify(drafts: list[int], *args: object, **kw: object) -> tuple[int, int]:
            kept, following = verify(drafts, *args, **kw)
            if self.on:
                self._line(len(drafts), kept)
            return kept, following

        vars(loop).update(choose=spy_choose, verify=spy_verify)  # the loop's own names

    def _line(self, proposed: int, kept: int) -> None:
        seen, self._seen = self._seen, None
        ms, self.last = self.clock[0] - self.last, self.clock[0]  # this step's drafting + verify
        head = f"  {len(self.lines) + 1:3d} {ms:5.0f} ms"
        if seen is None:
            self.lines.append(f"{head} forced/plain kept {kept}/{proposed}")
            return
        inp, c = seen
        acc = inp.acceptance["ngram"]
        rates = " ".join(f"{acc.rate(i, acc.prior):.2f}" for i in range(4))
        ngram = self.rt.ngram
        where = ("m" if ngram.from_memory else "p" if ngram.from_prediction else " ") + (
            "c" if ngram.contested else " "
        )
        # ms per committed token: the governor's estimate (plain's cost over its speedup; a
        # catch-up spread over the horizon is in it) and this step's; and the verify's price
        plain = plain_ms(inp)
        est = f"{plain / c.speedup:5.1f}" if plain and c.speedup else "    ?"
        if self.calibration is not None and c.option == "ngram" and self.lines and plain:
            kind = (
                "memory"
                if ngram.from_memory
                else "prediction"
                if ngram.from_prediction
                else "contested"
                if ngram.contested
                else "request"
            )
            ladder = list(itertools.islice(expected_by_length(acc, acc.prior), 4))
            self.calibration.record(
                kind,
                match_bucket(ngram.match_len),
                conditional_rates(ladder),
                proposed,
                kept,
                ms,
                plain,
                c.speedup,
            )
        verify = f"verify est {inp.verify.at(proposed + 1) or 0.0:4.0f}"
        if self.live:  # and what it took, at this depth of the context
            verify += f" got {self.verify_ms:4.0f} at {len(self.rt.target.tokens):4d}"
        self.lines.append(
            f"{head} {c.option:5s} k={c.k:<2d} kept {kept}/{proposed}"
            f" ms/tok est {est} got {ms / (kept + 1):5.1f} {verify}"
            f"  lag {inp.model_lag:3d} match {inp.ngram_match:2d}/{ngram.match_len:<2d}"
            f"{where} [{rates}] hor {inp.horizon:3d} upk {inp.upkeep:4.1f} | {c.reason[:90]}"
        )

    def take(self) -> list[str]:
        lines, self.lines, self.last = self.lines, [], 0.0
        return lines


def oracle_horizon(rt: PairRuntime, length: list[int]) -> None:
    """Tell the governor each answer's true remaining length (length[0], set per prompt), from
    its first token on: what it would do if it knew how long every answer runs. The gap
    between `auto` and this is what predicting answer lengths could win; what is left
    between this and the best forced mode is the pricing's (the catch-up's risk, the
    estimates)."""

    def known(
        task: str | None, generated: int, room: int, lag: int = 0, cells: int | None = None
    ) -> int:
        return max(0, min(room, length[0] - generated))

    rt.ledger.horizon = known  # type: ignore[method-assign]


def run_priced(rt: PairRuntime, req: GenerationRequest, clock: Clock) -> Run:
    """One request as the bench runs it (bench._run_one), its e2e and ttft the priced time."""
    _another_chat(rt)
    clock[0] = 0.0
    parts: list[str] = []
    stats: GenerationStats | None = None
    first = 0.0  # the priced time at the first text
    for out in generate(rt, req):
        if isinstance(out, GenerationStats):
            stats = out
        else:
            if not parts:
                first = clock[0]
            parts.append(out.text)
    assert stats is not None
    stats.e2e_ms, stats.ttft_ms = clock[0], first if parts else clock[0]
    return Run(req.task or "", 0, 0, "", "".join(parts), stats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", type=Path, default=SHIPPED)
    ap.add_argument("--task", help="comma-separated tasks (default: all)")
    ap.add_argument("--modes", default="plain,ngram,model,auto")
    ap.add_argument(
        "--costs", default="cpu", help="cpu, gpu, h100, live or a JSON file (see above)"
    )
    ap.add_argument("--pair")
    ap.add_argument("--why", action="store_true", help="print each auto answer's reason")
    ap.add_argument("--trace", action="store_true", help="print every step of each auto answer")
    ap.add_argument("--json", type=Path, help="write the table's rows here")
    ap.add_argument(
        "--calibration",
        action="store_true",
        help="after the table, lookup's estimates against what its drafts kept (see above)",
    )
    ap.add_argument(
        "--no-task",
        action="store_true",
        help="send no task, as an OpenAI client does (the table still groups by task)",
    )
    ap.add_argument(
        "--oracle-horizon",
        action="store_true",
        help="give the governor each answer's true length as it starts (from the plain run of "
        "the same prompt, which must come first in --modes): the ceiling of length prediction",
    )
    ap.add_argument(
        "--chatter",
        action="store_true",
        help="before each prompt, an unpriced task-less 'Say hello.' through the governor, as "
        "a daemon benched against other servers gets (bench warms every server up that way)",
    )
    args = ap.parse_args()
    items = load_workload(args.workload)
    if args.task:
        items = [i for i in items if i.task in args.task.split(",")]
    modes = args.modes.split(",")
    if args.oracle_horizon and modes[0] != PLAIN:
        ap.error("--oracle-horizon needs plain first in --modes (it learns each answer's length)")
    live = args.costs == LIVE
    clock: Clock = WallClock() if live else [0.0]
    runs: list[Run] = []
    tracer: Tracer | None = None
    with load_pair(load_manifest(None), args.pair) as loaded:
        rt = loaded.runtime
        if live:
            calibrate(rt)  # as the engine does at load; its agreement included
        else:
            rt.ledger.agreement = agreement(rt)  # before pin_costs: its decodes are not priced
            share_cache(rt, probe_sharing(rt, rt.ledger.agreement))
            pin_costs(rt, cost_table(args.costs), clock)
            pin_copies(rt, copy_price(args.costs), clock)
            pin_steps(rt, step_table(args.costs), clock)
        calibration = LookupCalibration() if args.calibration else None
        tracer = Tracer(rt, clock, live, calibration) if args.trace or calibration else None
        length = [0]  # this prompt's answer length, for --oracle-horizon
        if args.oracle_horizon:
            oracle_horizon(rt, length)
        for idx, item in enumerate(items):
            if args.chatter:
                length[0] = 0  # a greeting's length is not known: no catch-up for it
                if tracer is not None:
                    tracer.on = False  # the greeting is not one of the workload's answers
                talk = [Message(m["role"], m["content"]) for m in WARM_UP]
                hello = _request(WorkItem("chatter", talk, 8, 0), AUTO, 0.0, None, remember=True)
                run_priced(rt, replace(hello, task=None), clock)
            for mode in modes:
                req = _request(item, mode, 0.0, None, remember=mode == modes[-1])
                if args.no_task:
                    req = replace(req, task=None)
                if tracer is not None:
                    tracer.on = mode == AUTO
                run = replace(run_priced(rt, req, clock), task=item.task, item=idx, mode=mode)
                runs.append(run)
                if mode == PLAIN:  # at temperature 0 every mode gives this answer
                    length[0] = run.stats.completion_tokens
                print(
                    f"{item.task} #{idx + 1} {mode}: {run.stats.completion_tokens} tok, "
                    f"{run.stats.tokens_per_s:.1f} tok/s at {args.costs} costs",
                    flush=True,
                )
                if args.why and mode == AUTO:
                    print(f"    {run.stats.reason}")
                if tracer is not None:
                    lines = tracer.take()
                    if args.trace:
                        print("\n".join(lines))
    rows = summarize(runs)
    print(f"ms, tok/s and speedups priced at the {args.costs} costs")
    print(render_table(rows))
    if calibration is not None:
        print(calibration.render())
    if args.json:
        report = {"costs": args.costs, "tasks": [r.to_dict() for r in rows]}
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
