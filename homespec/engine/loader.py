"""Load a pair the way its memory plan says, and measure what the load really took.

The plan (homespec/planner.py) is made from metadata before anything loads; this module only
carries it out: which layers go to the GPU, whether the draft loads at all, the context size, and
how many logits rows the target's compute buffer holds. A pair that does not fit is refused here
with the plan's reason, never half-loaded into an out-of-memory crash.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Literal

import psutil

from homespec import heap
from homespec.engine import flash, pages, repack
from homespec.engine.crashsite import CrashSite, Site
from homespec.engine.drafters import ModelDrafter, NgramDrafter
from homespec.engine.llama_backend import (
    LlamaContext,
    LlamaModel,
    ggml,
    supports_gpu_offload,
    system_info,
)
from homespec.engine.neighbours import ThreadAdapter, physical_cores
from homespec.engine.runtime import PairRuntime
from homespec.errors import OutOfMemoryError
from homespec.manifest import Manifest, PairSpec
from homespec.pairs import PairFiles, inspect_pair, plan
from homespec.plan_types import Arrangement, PairPlan
from homespec.planner import (
    cpu_only,
    footprint_of,
    runtime_cost,
    uses_gpu,
)
from homespec.resources import RAM, Machine, cuda_used, probe_machine
from homespec.sizes import fmt_size
from homespec.workers import attach

LOG = logging.getLogger("homespec.loader")
N_BATCH = flash.FULL_BATCH  # tokens a decode holds at most (flash.py may measure fewer)
# How a pair's weights in RAM are held: "mapped" from the file (a one-off load: `ask`), or read
# into 2 MiB pages where the plan says so, collapsed "now" (bench, doctor) or "later" by the
# caller (the engine child, in the background while it serves): see engine/pages.py.
Pages = Literal["mapped", "now", "later"]


def probe() -> Machine:
    """This machine, with this llama.cpp build's backends."""
    return probe_machine(backend_info=lambda: (system_info(), supports_gpu_offload()))


def placement(
    manifest: Manifest, a: Arrangement, role: str
) -> tuple[list[int] | None, list[float] | None, int]:
    """(ggml devices, split, n_gpu_layers) for one model of a pair the plan spreads over RPC
    workers: the target's layers go to the workers' devices (registered in this process now)
    and to the local GPU, the draft's to the local GPU only. (None, None, layers) otherwise:
    llama.cpp's own device choice."""
    layers = a.target_gpu_layers if role == "target" else a.draft_gpu_layers
    assert layers is not None
    if not a.remote:
        return None, None, layers
    g = ggml()
    gpus = [d for d in g.devices() if d.kind in ("gpu", "igpu") and not d.name.startswith("RPC")]
    # the plan's "cuda1" is llama.cpp's CUDA1; Metal has one device
    named = [d for d in gpus if a.gpu and d.name.lower() == a.gpu.lower()]
    local = [d.handle for d in (named or gpus)][:1] if a.gpu else []
    if role == "draft":
        return (local if layers else []), None, layers
    devices: list[int] = []
    split: list[float] = []
    for device, count in a.remote:
        _, worker, index = device.split(":")
        devices.append(g.add_worker(manifest.spec.workers[worker].endpoint)[int(index)].handle)
        split.append(float(count))
    if a.gpu and layers:
        devices += local
        split.append(float(layers))
    return devices, split, sum(int(c) for c in split)


def flash_attention(pair: PairSpec, *, on_gpu: bool, measured: Callable[[], bool]) -> bool | None:
    """The pair's flash-attention setting for llama.cpp (None = llama.cpp decides).

    On a GPU "auto" leaves it to llama.cpp. On the CPU its kernel is faster on some processors
    and far slower on others as the context grows, so "auto" takes what `measured()` found on
    this machine for this model (engine/flash.py); "on" and "off" force it."""
    if pair.flash_attn != "auto":
        return pair.flash_attn == "on"
    return None if on_gpu else measured()


@dataclass(frozen=True)
class MemoryCheck:
    """Predicted vs measured bytes for one loaded model, per device."""

    role: str
    predicted: dict[str, int]
    measured: dict[str, int]
    peak: bool  # measured after touch_peak() (worst case), not just after loading

    def error(self, device: str = RAM) -> float | None:
        """(predicted - measured) / measured; None when nothing was measured there."""
        m = self.measured.get(device)
        return None if not m else (self.predicted.get(device, 0) - m) / m


def _close(contexts: list[LlamaContext], models: list[LlamaModel]) -> None:
    for ctx in contexts:
        ctx.close()
    for model in models:
        model.close()
    contexts.clear()
    models.clear()


@dataclass
class Held:
    """What a pair holds in llama.cpp, in load order, plus how long and how much each took."""

    models: list[LlamaModel] = field(default_factory=list)
    contexts: list[LlamaContext] = field(default_factory=list)
    load_ms: dict[str, float] = field(default_factory=dict)
    memory: list[MemoryCheck] = field(default_factory=list)
    repack: dict[str, repack.Verdict] = field(default_factory=dict)  # by role
    flash: flash.FlashVerdict | None = None  # the target's, measured or remembered (CPU, auto)
    regions: dict[str, list[pages.Region]] = field(default_factory=dict)  # not yet settled
    settled: dict[str, pages.Settled] = field(default_factory=dict)  # by role
    closed: bool = False

    def set_threads(self, n: int) -> None:
        for ctx in self.contexts:
            ctx.set_threads(n)

    def settle_pages(self, role: str | None = None) -> None:
        """Back the memory each model's load created (or `role`'s) with huge pages, where the
        plan read the weights for that; a no-op otherwise. Safe beside decoding."""
        for r in [role] if role else list(self.regions):
            regions = self.regions.pop(r, [])
            if not regions:
                continue
            done = pages.settle(regions, stop=lambda: self.closed)
            self.settled[r] = done
            LOG.info(
                "%s: %s of %s in 2 MiB pages (%.0f ms)%s",
                r,
                fmt_size(done.huge),
                fmt_size(done.bytes),
                done.ms,
                f": {done.note}" if done.note else "",
            )

    def close(self) -> None:
        self.closed = True
        _close(self.contexts, self.models)


@dataclass
class LoadedPair:
    """A loaded pair; close() (or `with`) frees the contexts, then the models."""

    runtime: PairRuntime
    files: PairFiles
    plan: PairPlan
    held: Held
    manifest: Manifest
    crash_site: CrashSite

    @property
    def load_ms(self) -> dict[str, float]:
        return self.held.load_ms

    @property
    def memory(self) -> list[MemoryCheck]:
        return self.held.memory

    def close(self) -> None:
        self.held.close()

    def __enter__(self) -> LoadedPair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _used(gpu: str | None) -> dict[str, int]:
    used = {RAM: psutil.Process().memory_info().rss}
    if gpu and gpu.startswith("cuda"):
        used.update({k: v for k, v in cuda_used().items() if k == gpu})
    return used


def _load_model(
    manifest: Manifest,
    files: PairFiles,
    the_plan: PairPlan,
    held: Held,
    role: str,
    *,
    site: CrashSite,
    measure_peak: bool,
    warm_up: bool = False,
) -> LlamaContext:
    """Load one model of the pair and its context per the plan (repacking as the canary
    says); record time and memory."""
    pair = manifest.pair(files.name)[1]
    a = the_plan.arrangement
    info = files.target if role == "target" else files.draft
    assert info is not None
    gpu_layers = a.target_gpu_layers if role == "target" else a.draft_gpu_layers
    assert gpu_layers is not None
    name = pair.target if role == "target" else pair.draft
    verdict = repack.verdict(
        name, info.path, gpu_layers=gpu_layers, override=manifest.spec.models[name].repack
    )
    held.repack[role] = verdict
    devices, split, n_gpu_layers = placement(manifest, a, role)
    before = _used(a.gpu)
    regions_before = pages.snapshot() if the_plan.huge_pages else set()
    t0 = time.perf_counter()
    model = LlamaModel(
        info.path,
        gpu_layers=n_gpu_layers,
        repack=verdict.repack,
        crash_site=site,
        load_site=Site.LOAD_TARGET if role == "target" else Site.LOAD_DRAFT,
        devices=devices,
        split=split,
        mmap=not the_plan.huge_pages,
    )
    held.models.append(model)
    if role == "target" and (problem := model.template_problem()):
        LOG.warning(
            "%s: %s: chats are rendered by llama.cpp's built-in look-alike, which may differ "
            "from what the model was trained on",
            info.path.name,
            problem,
        )
    threads = pair.threads or physical_cores()

    def measured() -> bool:
        """The target's verdict (the draft follows it): remembered, else measured now."""
        if held.flash is None:
            assert role == "target", "the target loads first"

            def scratch(on: bool, n_batch: int) -> LlamaContext:
                return LlamaContext(
                    model,
                    n_ctx=max(flash.PROMPT, flash.DEPTH, flash.LONG) + 8,
                    n_batch=n_batch,
                    threads=threads,
                    flash_attn=on,
                    n_outputs_max=8,
                    crash_site=site,
                    decode_site=Site.TARGET,
                )

            filler = (model.tokenize(" the", special=False) or [0])[-1:]
            held.flash = flash.verdict(name, info.path, scratch, filler)
        return held.flash.on

    flash_attn = flash_attention(pair, on_gpu=not cpu_only(a), measured=measured)
    # as measured with the flash verdict (CPU, flash_attn = "auto"); else the full batch
    n_batch = held.flash.n_batch if held.flash is not None else N_BATCH
    ctx = LlamaContext(
        model,
        n_ctx=a.n_ctx,
        n_batch=min(n_batch, a.n_ctx),
        threads=threads,
        flash_attn=flash_attn,
        n_outputs_max=a.n_outputs if role == "target" else 1,
        crash_site=site,
        decode_site=Site.TARGET if role == "target" else Site.DRAFT,
    )
    held.contexts.append(ctx)
    held.load_ms[role] = (time.perf_counter() - t0) * 1000.0
    if the_plan.huge_pages:  # the weights, the context's cache and compute buffers
        held.regions[role] = pages.new_regions(regions_before, pages.snapshot())
    if warm_up:
        ctx.warm_up()
    if measure_peak:
        ctx.touch_peak()
    after = _used(a.gpu)
    fp = footprint_of(info, a, role, flash=ctx.flash_attn is True, n_batch=ctx.n_batch)
    predicted = {d: fp.on(d) for d in fp.devices}
    if uses_gpu(a, role) and not any(a.gpu in c.predicted for c in held.memory):
        # the first model on the card brings the CUDA context and libraries with it
        for device, n in runtime_cost(a).items():
            predicted[device] = predicted.get(device, 0) + n
    check = MemoryCheck(
        role,
        predicted,
        {d: after[d] - before.get(d, 0) for d in after},
        measure_peak,
    )
    held.memory.append(check)
    LOG.info(
        "%s %s loaded in %.0f ms: memory predicted %s, measured %s (%s)",
        files.name,
        role,
        held.load_ms[role],
        fmt_size(predicted.get(RAM, 0)),
        fmt_size(check.measured[RAM]),
        "peak" if measure_peak else "after load; compute buffers not touched yet",
    )
    return ctx


DRAFT_LOADING = "draft model still loading"


def load_pair(
    manifest: Manifest,
    name: str | None = None,
    *,
    load_draft: bool = True,
    machine: Machine | None = None,
    measure_peak: bool = False,
    without_draft: str = "",
    crash_site: CrashSite | None = None,
    warm_up: bool = False,
    huge_pages: Pages = "mapped",
) -> LoadedPair:
    """Check the files (inspect_pair), plan against `machine` (probed when None), then load the
    target and, when the plan has room for it and `load_draft`, the draft (else attach_draft()
    loads it later: the daemon serves plain decoding meanwhile). `measure_peak` fills each
    context once so the memory check sees the worst case (doctor --measure, bench).
    `without_draft`: plan and load the pair as if it had no draft model, for this reason (the
    engine crashed in the draft's code); requests then say so. `crash_site`: where this
    process marks the native work it does (the engine child's shared marker). `warm_up`: run
    each model's first decode right after loading it (the engine child does, before it says
    it serves: a model that crashes here crashes before any request depends on it).
    `huge_pages`: see `Pages`; "later" leaves the target's to `LoadedPair.held.settle_pages()`
    (the draft's are settled before it is handed over)."""
    heap.keep_freed_pages()  # this process's per-step numpy arrays reuse their pages
    files = inspect_pair(manifest, name)
    if without_draft and files.draft is not None:
        files = replace(files, draft=None, draft_skip_reason=without_draft)
    name, pair = manifest.pair(files.name)
    machine = machine or probe()
    if pair.target_workers and not machine.remotes and not machine.workers_down:
        machine = attach(machine, manifest, pair.target_workers)
    the_plan = plan(manifest, files, machine, kept=huge_pages != "mapped")
    if not the_plan.runnable:
        raise OutOfMemoryError(
            f"pair {name!r} {the_plan.reason}", f"see `homespec doctor --pair {name}`"
        )
    if the_plan.degraded:
        LOG.warning("pair %s runs degraded: %s", name, the_plan.reason)
    unavailable = files.draft_skip_reason
    if files.draft is not None and the_plan.arrangement.draft_gpu_layers is None:
        unavailable = f"memory: draft not loaded ({the_plan.shortfall})"
    elif files.draft is not None:
        unavailable = DRAFT_LOADING
    plain_only = files.plain_only_reason
    if the_plan.mode == "plain" and the_plan.degraded:
        plain_only = f"memory: plain decoding only ({the_plan.shortfall})"
    held = Held()
    site = crash_site or CrashSite()
    try:
        target_ctx = _load_model(
            manifest,
            files,
            the_plan,
            held,
            "target",
            site=site,
            measure_peak=measure_peak,
            warm_up=warm_up,
        )
        runtime = PairRuntime(
            name=name,
            spec=pair,
            target=target_ctx,
            draft=None,
            ngram=NgramDrafter(
                n_min=pair.ngram_min,
                n_max=pair.ngram_max,
                memory_tokens=pair.ngram_memory,
                boundaries=target_ctx.model.control_tokens(),
            ),
            draft_unavailable_reason=unavailable,
            plain_only_reason=plain_only,
        )
        if pair.adapt_threads:
            runtime.threads = ThreadAdapter(
                max_threads=pair.threads or physical_cores(),
                apply=held.set_threads,
                quiet_ms=runtime.ledger.quiet.at,
            )
        loaded = LoadedPair(runtime, files, the_plan, held, manifest, site)
        if load_draft:
            attach_draft(loaded, measure_peak=measure_peak, warm_up=warm_up)
        if huge_pages == "now":
            held.settle_pages()
    except BaseException:
        held.close()
        raise
    return loaded


def attach_draft(
    loaded: LoadedPair,
    *,
    measure_peak: bool = False,
    idle: AbstractContextManager[object] | None = None,
    warm_up: bool = False,
) -> bool:
    """Load the draft the plan has room for and hand it to the runtime; False when the plan
    (or the pair) has no draft. The load runs while the target keeps serving; only the
    hand-over waits for `idle` (the daemon's pair lock: held while a request runs)."""
    rt = loaded.runtime
    if loaded.files.draft is None or loaded.plan.arrangement.draft_gpu_layers is None:
        return False
    if rt.draft is not None:
        return True
    try:
        ctx = _load_model(
            loaded.manifest,
            loaded.files,
            loaded.plan,
            loaded.held,
            "draft",
            site=loaded.crash_site,
            measure_peak=measure_peak,
            warm_up=warm_up,
        )
    except Exception as exc:
        rt.draft_unavailable_reason = f"draft failed to load: {exc}"
        rt.draft_failed = True
        raise
    loaded.held.settle_pages("draft")  # before it drafts (a no-op where the file is mapped)
    with idle or nullcontext():
        if rt.threads is not None:
            ctx.set_threads(rt.threads.state.threads)  # as the neighbours left the target
        rt.draft = ModelDrafter(ctx, p_min=rt.spec.draft_p_min)
        rt.draft_unavailable_reason = ""
    LOG.info("pair %s: draft attached, speculation available", rt.name)
    return True


def detach_draft(
    loaded: LoadedPair, reason: str, *, idle: AbstractContextManager[object] | None = None
) -> bool:
    """Take the draft from the runtime (between requests: inside `idle`) and free it, giving
    its memory back; requests then say `reason`. False when no draft was attached."""
    rt = loaded.runtime
    if rt.draft is None:
        return False
    with idle or nullcontext():
        draft_ctx = rt.draft.ctx
        rt.draft = None
        rt.draft_unavailable_reason = reason
        # conversations put aside go first: the draft's with it, the target's too (a draft is
        # detached to give memory back)
        rt.draft_snapshots.clear()
        rt.target_snapshots.clear()
    held = loaded.held
    if isinstance(draft_ctx, LlamaContext) and draft_ctx in held.contexts:
        held.contexts.remove(draft_ctx)
        model = draft_ctx.model
        held.models.remove(model)
        _close([draft_ctx], [model])
    held.memory = [c for c in held.memory if c.role != "draft"]
    held.settled.pop("draft", None)
    LOG.warning("pair %s: draft detached: %s", rt.name, reason)
    return True
