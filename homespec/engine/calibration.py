"""What a loaded pair measures about itself before the governor bets on it: the target's cost
of one decode by the tokens in it, the draft model's, and how often the draft model predicts
the target's next token. Run once at load, on scratch text, in pieces a few decodes long that
an engine serving requests runs between them (`Pieces`); the loop keeps the costs current from
real steps afterwards.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import IO, TypeVar, cast

import numpy as np

from homespec.engine import cache_share
from homespec.engine.cache_share import Sharing
from homespec.engine.chat_text import chat_tokens
from homespec.engine.estimates import DRAFT_SIZES, VERIFY_SIZES, CostCurve
from homespec.engine.generate import complete
from homespec.engine.runtime import PairRuntime
from homespec.engine.target import Target
from homespec.engine.types import GenerationRequest, Message
from homespec.errors import HomespecError, RequestError
from homespec.paths import cache_dir

LOG = logging.getLogger("homespec.engine")

# Teacher-forced text for the agreement check: an ordinary question and an answer that mixes
# prose and code, as a homelab's requests do. Its answer is not the target's own, so agreement
# on it runs a little below acceptance on the target's own answers: a prior, not a promise.
AGREEMENT_CHAT = [
    Message("user", "How do I keep only the newest backups in a directory, in Python?"),
    Message(
        "assistant",
        "Sort the files by modification time and delete all but the newest ones:\n\n"
        "```python\nimport os\n\n\ndef prune(directory, keep=7):\n"
        "    paths = [os.path.join(directory, name) for name in os.listdir(directory)]\n"
        "    paths.sort(key=os.path.getmtime, reverse=True)\n"
        "    for path in paths[keep:]:\n        os.remove(path)\n```\n\n"
        "Run it after each backup, for example from the same cron job.",
    ),
]
AGREEMENT_POSITIONS = 32  # next-token predictions compared (one draft decode each)


# A decode of more tokens never costs less, and never more per token (a batch shares the
# weights' reads); a size that breaks either rule by more than this was measured while
# something else held the CPU (two engines starting together on two cores priced 4 tokens at
# 134 ms and 8 at 89, 32 at 377 after 16 at 83), and is measured again, up to RETRIES times.
UNEVEN = 1.1
RETRIES = 3

# What calibration does in pieces, each a few decodes long: the generator yields between
# them, and an engine serving requests runs whatever request waits before it goes on
# (engine/child.py), so a request that comes while the pair measures waits for one piece, not
# for the whole (the demo pair's measurement took 2.5 s on the 2-core box, one that began as a
# restarted daemon's first requests came held them up that long, and a pair of bigger models
# on a CPU takes many times that). A request run between two pieces may leave anything in
# the caches: the piece after it makes them hold what it needs first. `finish` runs one
# whole, for the callers with nothing to serve (bench, doctor, the tests).
T = TypeVar("T")
Pieces = Generator[None, None, T]


def finish(pieces: Pieces[T]) -> T:
    """Run `pieces` to the end; what it returns."""
    while True:
        try:
            next(pieces)
        except StopIteration as done:
            return cast(T, done.value)


def uneven(costs: dict[int, float]) -> set[int]:
    """The sizes a quiet machine could not have measured so, beside their neighbours: one
    that costs more per token than the size below it (by UNEVEN), or one that costs more in
    all than the size above it (by UNEVEN)."""
    sizes = sorted(costs)
    out: set[int] = set()
    for lo, hi in itertools.pairwise(sizes):
        if costs[hi] / hi > UNEVEN * costs[lo] / lo:
            out.add(hi)
        if costs[lo] > UNEVEN * costs[hi]:
            out.add(lo)
    return out


def decode_costs(
    ctx: Target, base: list[int], filler: list[int], sizes: tuple[int, ...], n_logits: bool
) -> dict[int, float]:
    """`decode_cost_steps`, at once."""
    return finish(decode_cost_steps(ctx, base, filler, sizes, n_logits))


def decode_cost_steps(
    ctx: Target, base: list[int], filler: list[int], sizes: tuple[int, ...], n_logits: bool
) -> Pieces[dict[int, float]]:
    """ms of one decode of n tokens after `base`, the fastest of two tries (a neighbour's burst
    only ever slows one down) and of more for a size that looks `uneven` beside the others,
    for each n that fits; logits for all n, or for the last only. Yields between tries (see
    Pieces): each try decodes `base` again untimed first, so whatever ran in between is gone
    from the cache before the timed decode."""
    ctx.clear()
    ctx.extend(base, 1)
    ctx.extend(base + filler, 1)  # a throwaway decode: threads and caches settle first

    def once(n: int) -> float:
        ctx.extend(base, 1)  # the cache holds `base` (its last position re-decoded)
        t0 = time.perf_counter()
        ctx.extend(base + filler * n, n if n_logits else 1)  # decodes exactly n tokens
        return (time.perf_counter() - t0) * 1000.0

    fits = [
        n for n in sizes if not (n_logits and n > ctx.n_outputs_max) and len(base) + n <= ctx.n_ctx
    ]
    out: dict[int, float] = {}
    for n in fits:
        out[n] = min(once(n), once(n))
        yield
    for _ in range(RETRIES):
        again = uneven(out)
        if not again:
            break
        for n in sorted(again):
            out[n] = min(out[n], once(n), once(n))
            yield
    ctx.clear()
    return out


def agreement(rt: PairRuntime, *, shared: bool = False) -> float | None:
    """`agreement_steps`, at once."""
    return finish(agreement_steps(rt, shared=shared))


def agreement_steps(rt: PairRuntime, *, shared: bool = False) -> Pieces[float | None]:
    """The share of next-token predictions on which the draft model's argmax is the target's,
    along a fixed chat (AGREEMENT_CHAT) that both read: about the draft's acceptance at
    position 1 at temperature 0. None without a draft model, or where the chat does not fit.
    One target decode with logits at every compared position; the draft, whose context keeps
    the logits of one position only, one decode per position. `shared`: the draft reads the
    chat's question from a copy of the target's cache (engine/cache_share.py; None where that
    copy fails). Leaves both caches empty. Yields once (see Pieces), after the target's decode,
    where the draft reads its own cache: the draft's decodes then run as one piece (a request
    between two of them would have the next re-read the whole chat), and a draft reading the
    target's cache yields nowhere (what ran in between would have taken the copy away)."""
    if rt.draft is None:
        return None
    model = rt.target.model
    prompt = chat_tokens(model, AGREEMENT_CHAT[:1], allow_special=False)
    answer = model.tokenize(AGREEMENT_CHAT[1].content, special=False, add_bos=False)
    draft = rt.draft.ctx
    n = min(AGREEMENT_POSITIONS, rt.target.n_outputs_max, len(answer) + 1)
    # The answer's first n tokens are predicted from the positions before each of them.
    tokens = prompt + answer[: n - 1]
    if len(tokens) > min(rt.target.n_ctx, draft.n_ctx):
        return None
    rt.target.clear()
    draft.clear()
    try:
        wanted = np.argmax(rt.target.extend(tokens, n), axis=1)
        if shared and not cache_share.copy(rt.target, draft):
            return None
        if not shared:
            yield
        same = 0
        for row, end in enumerate(range(len(tokens) - n + 1, len(tokens) + 1)):
            same += int(np.argmax(draft.extend(tokens[:end], 1)[0]) == wanted[row])
    finally:
        rt.target.clear()
        draft.clear()
    return same / n


def probe_sharing(rt: PairRuntime, own: float | None) -> Sharing:
    """`probe_sharing_steps`, at once."""
    return finish(probe_sharing_steps(rt, own))


def probe_sharing_steps(rt: PairRuntime, own: float | None) -> Pieces[Sharing]:
    """Whether the draft model catches up by copying the target's cache (cache_share.decide),
    from its agreement reading its own (`own`) and reading the target's, and what a copy
    costs per token. Leaves both caches empty. Yields once, after the copy is timed."""
    if rt.draft is None:
        return cache_share.NOT_PROBED
    draft = rt.draft.ctx
    shape = rt.target.model.cache_shape()
    same_shape = shape is not None and shape == draft.model.cache_shape()
    copied, per_token, shared = False, None, None
    if same_shape:
        tokens = chat_tokens(rt.target.model, AGREEMENT_CHAT, allow_special=False)
        tokens = tokens[: min(rt.target.n_ctx, draft.n_ctx)]
        try:
            rt.target.extend(tokens, 1)
            ms = cache_share.timed_copy(rt.target, draft)
        finally:
            rt.target.clear()
            draft.clear()
        copied = ms is not None
        per_token = None if ms is None else ms / len(tokens)
        yield
        shared = (yield from agreement_steps(rt, shared=True)) if copied else None
    on, why = cache_share.decide(same_shape, copied, own, shared)
    return Sharing(on, why, per_token if on else None)


def share_cache(rt: PairRuntime, sharing: Sharing) -> None:
    """Give the pair what `sharing` decided: the draft model's catch-ups by copy, priced at
    the probe's copy (later copies keep it current), or by decode."""
    rt.sharing = sharing
    rt.ledger.copy_per_token = sharing.copy_ms_per_token if sharing.on else None
    if rt.draft is not None:
        rt.draft.catch_up = rt.catch_up_by_copy if sharing.on else None


LOCK_NAME = "calibrating.lock"
LOCK_WAIT_S = 30.0
LOCK_POLL_S = 0.05


@contextlib.contextmanager
def lock_file(path: Path | None) -> Iterator[IO[str] | None]:
    """`path` open for an flock (None: no cache directory or an unwritable one)."""
    try:
        handle = path.open("a") if path is not None else None
    except OSError:
        handle = None
    if handle is None:
        yield None
        return
    with handle:
        yield handle


def one_at_a_time(handle: IO[str] | None, timeout_s: float = LOCK_WAIT_S) -> Pieces[bool | None]:
    """Take an exclusive lock on `handle` (flock: the kernel lets go when the process dies),
    so the engines of one machine, in one daemon or in several, and `bench`, measure one after
    another: two measuring at once on two cores measured each other. Waits at most
    `timeout_s`, yielding between tries, then goes on without it; returns whether it holds the
    lock (None: there is no lock file to be had). `release` lets go."""
    if handle is None:
        return None
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
        yield
        time.sleep(LOCK_POLL_S)


def release(handle: IO[str] | None) -> None:
    if handle is not None:
        fcntl.flock(handle, fcntl.LOCK_UN)


def calibrate(rt: PairRuntime, sizes: tuple[int, ...] = VERIFY_SIZES) -> None:
    """`calibrating`, at once."""
    finish(calibrating(rt, sizes))


def calibrating(rt: PairRuntime, sizes: tuple[int, ...] = VERIFY_SIZES) -> Pieces[None]:
    """`measuring`, one engine of this machine at a time (see one_at_a_time), in pieces."""
    try:
        lock: Path | None = cache_dir() / LOCK_NAME
    except HomespecError:
        lock = None
    with lock_file(lock) as handle:
        held = yield from one_at_a_time(handle)
        try:
            if held is False:
                LOG.warning(
                    "pair %s: another engine kept measuring for %.0f s: measuring beside it",
                    rt.name,
                    LOCK_WAIT_S,
                )
            yield from measuring(rt, sizes)
        finally:
            if held:
                release(handle)


def since(points: dict[int, float], before: dict[int, float]) -> dict[int, float]:
    """The points of a cost curve that moved since it stood at `before` (observed since)."""
    return {n: ms for n, ms in points.items() if before.get(n) != ms}


def measuring(rt: PairRuntime, sizes: tuple[int, ...] = VERIFY_SIZES) -> Pieces[None]:
    """Measure this machine's cost of one target decode of n tokens for a few n, and of a
    draft-model decode of 1, 8 and 32 tokens (a draft catching up on history decodes a batch),
    on a scratch sequence, and the draft model's agreement with the target; the governor starts
    from these and keeps the costs current from real steps. Leaves both caches empty."""
    filler = (rt.target.model.tokenize(" the", special=False) or [0])[-1:]
    base = filler * 32
    # The machine as it is now replaces what was measured before, at every size (not blended
    # with it: a measurement again is one because the last was taken on a busy machine, and
    # the first comes after requests served while the draft loaded beside them: a daemon's
    # first requests here left 17 tokens at 268 ms beside 16 at 64, 6 at 79 beside 4 at 32,
    # pricing every draft of those lengths out). Sizes the requests between its pieces
    # measured stay: those are the machine as it is now too.
    before = dict(rt.ledger.verify.points), dict(rt.ledger.draft.points)
    costs = yield from decode_cost_steps(rt.target, base, filler, sizes, n_logits=True)
    rt.ledger.verify.points = since(rt.ledger.verify.points, before[0]) | costs
    rt.ledger.quiet = CostCurve(dict(rt.ledger.verify.points))
    rt.ledger.slowdown = 1.0  # as fast as the quiet curve, by definition
    rt.ledger.verify_ref = dict.fromkeys(rt.ledger.verify.points, 1.0)
    if rt.draft is not None:
        draft = yield from decode_cost_steps(rt.draft.ctx, base, filler, DRAFT_SIZES, False)
        rt.ledger.draft.points = since(rt.ledger.draft.points, before[1]) | draft
        rt.ledger.draft_ref = 1.0
        rt.ledger.agreement = yield from agreement_steps(rt)
        share_cache(rt, (yield from probe_sharing_steps(rt, rt.ledger.agreement)))
    LOG.info(
        "pair %s: decode cost (ms) by tokens %s; draft %s ms/token, agrees with the target "
        "on %s of next tokens%s",
        rt.name,
        {n: round(v, 1) for n, v in sorted(rt.ledger.verify.points.items())},
        None if rt.ledger.draft_ms is None else round(rt.ledger.draft_ms, 2),
        "—" if rt.ledger.agreement is None else f"{rt.ledger.agreement:.0%}",
        f"; the draft {rt.sharing.why}" if rt.sharing.why else "",
    )


def measure_steps(rt: PairRuntime, max_tokens: int = 48) -> None:
    """Two short governed answers, so that the ledger holds what a step costs beyond its
    decodes (Ledger.overhead; doctor --measure shows it): AGREEMENT_CHAT's question (plain
    steps, or the draft model's where it pays) and its answer to repeat (n-gram lookup finds
    it in the prompt). Nothing is learned or remembered; leaves the caches empty. A context
    too small for one (a few hundred tokens) skips it: what it measures is a figure to show,
    nothing a pair needs to serve."""
    question, answer = AGREEMENT_CHAT
    repeat = Message("user", f"Repeat this text exactly:\n\n{answer.content}")
    for chat in ([question], [repeat]):
        req = GenerationRequest(
            chat, max_tokens=max_tokens, temperature=0.0, learn=False, remember=False
        )
        try:
            complete(rt, req)
        except RequestError as exc:
            LOG.info("pair %s: no step costs measured on one answer: %s", rt.name, exc)
    rt.clear_caches()
