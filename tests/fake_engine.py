"""`python -m tests.fake_engine`: homespec's engine program (homespec/engine/child.py, the same
protocol, threads and crash-site marker) over the scripted fake target instead of llama.cpp.

A daemon started with HOMESPEC_ENGINE=tests.fake_engine runs it for every pair, so the HTTP
API, the queue, cancellation, crash recovery and the CLI are tested without model files.
The pair's manifest entry is read as usual; its model files are never opened. Set
HOMESPEC_FAKE_DECODE_S to change how long one fake decode takes (default 2 ms), and
HOMESPEC_FAKE_DRAFT_FAULT=1 to make the draft's first decode die by SIGSEGV, and
HOMESPEC_FAKE_OTHERS=X to run thread adaptation (2 threads, 2 cores, 10 ms windows) as if other
processes kept X cores busy, and HOMESPEC_FAKE_BUSY_CALIBRATION=1 to have the first
calibration's decodes take 4× as long (as on a machine busy then), with no wait before the
engine measures again, and HOMESPEC_FAKE_PIECE_EVERY_S to run a piece of a measurement at least
that often while requests keep coming (child.PIECE_EVERY_S).
"""

from __future__ import annotations

import os
import sys
from contextlib import AbstractContextManager

from homespec.engine import child
from homespec.engine.calibration import Pieces, calibrating
from homespec.engine.child import main
from homespec.engine.crashsite import CrashSite, Site
from homespec.engine.drafters import ModelDrafter, NgramDrafter
from homespec.engine.engine_info import describe
from homespec.engine.neighbours import ThreadAdapter
from homespec.engine.protocol import EngineInfo, Load
from homespec.engine.runtime import PairRuntime
from homespec.manifest import MAX_DRAFT_TOKENS, NGRAM, NO_DRAFT
from homespec.plan_types import Arrangement, PairPlan
from homespec.resources import Machine
from homespec.vocab import PlanMode, Rung

from .fake_target import BOS, EOS, MARK, FakeTarget


class FixedMeter:
    """A CPU meter that reads the same neighbour load every window."""

    def __init__(self, others: float) -> None:
        self.value = others

    def resume(self) -> None: ...

    def pause(self) -> None: ...

    def active_s(self) -> float:
        return 1.0  # every step ends a window

    def others(self) -> float:
        return self.value


class FakeSession:
    def __init__(self, load: Load, site: CrashSite) -> None:
        name, spec = load.manifest.pair(load.pair)
        self.decode_s = float(os.environ.get("HOMESPEC_FAKE_DECODE_S", "0.002"))
        self.site = site
        self.has_draft = spec.draft not in (NGRAM, NO_DRAFT) and not load.without_draft
        self.draft_file = f"{spec.draft}.fake" if self.has_draft else None
        mode: PlanMode = "plain" if spec.draft == NO_DRAFT else "ngram"
        if self.has_draft:
            mode = "speculative"
        rungs: dict[PlanMode, Rung] = {"speculative": "co-load", "ngram": "ngram", "plain": "plain"}
        rung = rungs[mode]
        arrangement = Arrangement(
            rung=rung,
            mode=mode,
            n_ctx=spec.n_ctx,
            draft_gpu_layers=0 if self.has_draft else None,
            n_outputs=MAX_DRAFT_TOKENS + 1,
        )
        self.plan = PairPlan(name, arrangement, "as declared: fake models", False, rung)
        target = FakeTarget(n_ctx=spec.n_ctx, decode_s=self.decode_s, site=site)
        unavailable = load.without_draft or ("draft model still loading" if self.has_draft else "")
        self._runtime = PairRuntime(
            name=name,
            spec=spec,
            target=target,
            draft=None,
            ngram=NgramDrafter(
                n_min=spec.ngram_min,
                n_max=spec.ngram_max,
                memory_tokens=spec.ngram_memory,
                boundaries=frozenset({EOS, BOS, MARK}),
            ),
            draft_unavailable_reason=unavailable,
        )
        others = os.environ.get("HOMESPEC_FAKE_OTHERS")
        if others is not None:
            self._runtime.threads = ThreadAdapter(
                2,
                target.set_threads,
                lambda n: None,
                cores=2,
                meter=FixedMeter(float(others)),  # type: ignore[arg-type]
                window_s=0.01,
            )
        self.target_file = f"{spec.target}.fake"

    @property
    def runtime(self) -> PairRuntime:
        return self._runtime

    def info(self) -> EngineInfo:
        return describe(
            self._runtime,
            self.plan,
            target_file=self.target_file,
            draft_file=self.draft_file,
            degraded=False,
        )

    def attach_draft(self, idle: AbstractContextManager[object]) -> None:
        if not self.has_draft:
            return
        fault = os.environ.get("HOMESPEC_FAKE_DRAFT_FAULT") == "1"
        draft = FakeTarget(
            n_ctx=self._runtime.target.n_ctx,
            wrong_every=5,
            decode_s=self.decode_s / 2,
            site=self.site,
            role=Site.DRAFT,
            fault=fault,
        )
        draft.extend([BOS], 1)  # the first decode, before hand-over (as the real engine does)
        draft.clear()
        with idle:
            self._runtime.draft = ModelDrafter(draft)
            self._runtime.draft_unavailable_reason = ""

    def detach_draft(self, reason: str, idle: AbstractContextManager[object]) -> None:
        with idle:
            self._runtime.draft = None
            self._runtime.draft_unavailable_reason = reason

    def settle_pages(self) -> None:
        pass  # nothing of its own in memory to back with huge pages

    def close(self) -> None:
        pass


def open_fake(load: Load, site: CrashSite) -> tuple[FakeSession, Machine | None]:
    return FakeSession(load, site), None


def busy_first(rt: PairRuntime) -> Pieces[None]:
    """`calibrating`, the first time with every target decode 4× as long."""
    target = rt.target
    assert isinstance(target, FakeTarget)
    quiet = target.decode_s
    target.decode_s = quiet * 4
    try:
        yield from calibrating(rt)
    finally:
        target.decode_s = quiet
        child.calibrating = calibrating


if "HOMESPEC_FAKE_PIECE_EVERY_S" in os.environ:
    child.PIECE_EVERY_S = float(os.environ["HOMESPEC_FAKE_PIECE_EVERY_S"])

if os.environ.get("HOMESPEC_FAKE_BUSY_CALIBRATION") == "1":
    child.calibrating = busy_first
    child.RECALIBRATE_GAP_S = 0.0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], opener=open_fake))
