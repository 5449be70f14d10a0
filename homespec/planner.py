"""Memory planner: what a pair will take on each device, and the best arrangement that fits.

Pure functions of (GGUF metadata, machine, pair settings): nothing here loads a model or probes
anything, so every rung of the ladder is tested with hand-written machines. What one model
takes per device is footprint.py's estimate; this module adds the reserves, the margin and the
CUDA runtime, and walks the fallback ladder.
"""

from __future__ import annotations

from dataclasses import replace

from homespec.engine.pages import choose
from homespec.footprint import KV_CELL_PAD, N_UBATCH, Footprint, estimate, kv_cells
from homespec.gguf_meta import GGUFInfo
from homespec.plan_types import Arrangement, DeviceUse, PairPlan, PairRequest
from homespec.resources import RAM, Gpu, Machine
from homespec.sizes import GiB, MiB, fmt_size
from homespec.vocab import PlanMode

ESTIMATE_MARGIN = 0.10  # added to every device's estimate
RAM_RESERVE = 256 * MiB  # left free for the OS and the rest of the process
GPU_RESERVE = 1 * GiB  # left free per GPU: driver, display, others (llama.cpp's fitter keeps 1 GiB)
REMOTE_RESERVE = 512 * MiB  # left free per RPC worker device (its OS, its rpc buffers)
# What a process pays once for using a CUDA GPU at all, before any model: the CUDA context and
# the math libraries' workspaces on the card, and the libraries' host mappings in RAM. Measured
# on one H100 (CUDA 13.0, driver 580) as what the first model's NVML and RSS deltas held beyond
# its own estimate (1,272 vs 644 MiB on the card, 377 vs 140 MiB of RAM); `doctor --measure`
# shows it per card.
GPU_RUNTIME = 640 * MiB
GPU_RUNTIME_HOST = 240 * MiB


def uses_gpu(a: Arrangement, role: str) -> bool:
    layers = a.target_gpu_layers if role == "target" else a.draft_gpu_layers
    return a.gpu is not None and layers is not None and layers != 0


def runtime_cost(a: Arrangement) -> dict[str, int]:
    """Bytes per device a process pays once for the CUDA GPU this arrangement uses (none for
    the CPU, and none counted for Metal's unified memory)."""
    if a.gpu is None or not a.gpu.startswith("cuda"):
        return {}
    if not (uses_gpu(a, "target") or uses_gpu(a, "draft")):
        return {}
    return {a.gpu: GPU_RUNTIME, RAM: GPU_RUNTIME_HOST}


def _use(
    machine: Machine, a: Arrangement, target: Footprint, draft: Footprint | None
) -> tuple[DeviceUse, ...]:
    runtime = runtime_cost(a)
    devices = sorted({RAM, *target.devices, *(draft.devices if draft else [])})
    uses = []
    for dev in devices:
        d = draft or Footprint()
        compute = target.compute.get(dev, 0) + d.compute.get(dev, 0)
        need = target.on(dev) + d.on(dev)
        reserve = RAM_RESERVE if dev == RAM else GPU_RESERVE
        if dev.startswith("rpc:"):
            reserve = REMOTE_RESERVE
        free = machine.free(dev, reserve)
        uses.append(
            DeviceUse(
                device=dev,
                target_weights=target.weights.get(dev, 0),
                target_kv=target.kv.get(dev, 0),
                draft_weights=d.weights.get(dev, 0),
                draft_kv=d.kv.get(dev, 0),
                compute=compute,
                margin=int(need * ESTIMATE_MARGIN),
                free=free,
                runtime=runtime.get(dev, 0),
            )
        )
    # Unified memory (Apple): what the GPU takes also comes out of RAM.
    shared = sum(u.need for u in uses for g in machine.gpus if g.device == u.device and g.unified)
    if shared:
        uses = [replace(u, free=max(0, u.free - shared)) if u.device == RAM else u for u in uses]
    return tuple(uses)


def cpu_only(a: Arrangement) -> bool:
    """No target layer on a GPU: flash attention is then homespec's choice, not llama.cpp's
    (engine/loader.flash_attention), for the draft's context too."""
    return not uses_gpu(a, "target")


def footprint_of(
    info: GGUFInfo, a: Arrangement, role: str, *, flash: bool, n_batch: int = N_UBATCH
) -> Footprint:
    """One model's estimate as arrangement `a` places it: the target with its verify rows of
    logits and its RPC devices, the draft with one row; `n_batch`: tokens a decode holds."""
    n_ubatch = min(n_batch, a.n_ctx)
    if role == "target":
        return estimate(
            info,
            n_ctx=a.n_ctx,
            n_outputs=min(a.n_outputs, n_ubatch),
            gpu_layers=a.target_gpu_layers,
            gpu=a.gpu,
            n_ubatch=n_ubatch,
            remote=a.remote,
            flash=flash,
        )
    assert a.draft_gpu_layers is not None
    return estimate(
        info,
        n_ctx=a.n_ctx,
        n_outputs=1,
        gpu_layers=a.draft_gpu_layers,
        gpu=a.gpu,
        n_ubatch=n_ubatch,
        flash=flash,
    )


def evaluate(req: PairRequest, machine: Machine, a: Arrangement) -> tuple[DeviceUse, ...]:
    flash = req.cpu_flash and cpu_only(a)
    n_batch = req.cpu_batch if cpu_only(a) else N_UBATCH
    target = footprint_of(req.target, a, "target", flash=flash, n_batch=n_batch)
    draft = None
    if a.draft_gpu_layers is not None and req.draft is not None:
        draft = footprint_of(req.draft, a, "draft", flash=flash, n_batch=n_batch)
    return _use(machine, a, target, draft)


def _best_gpu(machine: Machine) -> Gpu | None:
    gpus = machine.usable_gpus
    return max(gpus, key=lambda g: machine.free(g.device)) if gpus else None


def candidates(req: PairRequest, machine: Machine) -> list[Arrangement]:
    """The ladder for this pair on this machine, best first, starting at what it declares."""
    out = _splits(req, machine)
    return out + _local(replace(req, remote_devices=()), machine)


def _shares(total: int, capacity: list[int]) -> list[int]:
    """`total` layers shared in proportion to `capacity` (largest remainder)."""
    cap_sum = sum(capacity)
    if cap_sum <= 0 or total <= 0:
        return [0] * len(capacity)
    exact = [total * c / cap_sum for c in capacity]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(capacity)), key=lambda i: counts[i] - exact[i])
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def _splits(req: PairRequest, machine: Machine) -> list[Arrangement]:
    """The "split" rungs: the target spread over this box and the pair's workers in proportion
    to each one's usable memory (as llama.cpp splits by free memory), then each other split,
    nearest first, so the first that fits is the most even one. The draft stays on this box."""
    if not req.remote_devices:
        return []
    gpu = _best_gpu(machine) if req.gpu_layers != 0 else None
    n = req.target.block_count + 1
    remote_cap = [machine.free(d, REMOTE_RESERVE) for d in req.remote_devices]
    # Offloaded layers: every one when this box's own share is a GPU (it then takes its share
    # of them too), else RAM keeps the first layers in proportion to its memory.
    balanced = n
    if gpu is None:
        balanced -= _shares(n, [machine.free(RAM, RAM_RESERVE), *remote_cap])[0]
    local_cap = machine.free(gpu.device, GPU_RESERVE) if gpu else 0
    order = sorted(range(1, n + 1), key=lambda k: (abs(k - balanced), -k))
    modes: list[PlanMode] = ["speculative", "ngram", "plain"]
    out: list[Arrangement] = []
    # With a GPU here the draft goes on it first, then in RAM ("draft on the CPU"): for each
    # split, as the local ladder keeps the target's layers before the draft's place.
    drafts = [0] if gpu is None or req.draft_gpu_layers == 0 else [req.draft_gpu_layers, 0]
    steps = [
        (m, k, d)
        for m in modes[modes.index(req.declared) :]
        for k in order
        for d in (drafts if m == "speculative" else [None])
    ]
    caps = [*remote_cap, *([local_cap] if gpu else [])]
    for mode, k, draft in steps:
        counts = _shares(k, caps)
        out.append(
            Arrangement(
                "split",
                mode,
                req.n_ctx,
                target_gpu_layers=counts[len(remote_cap)] if gpu else 0,
                draft_gpu_layers=draft,
                gpu=gpu.device if gpu else None,
                n_outputs=1 if mode == "plain" else req.n_outputs,
                remote=tuple(zip(req.remote_devices, counts[: len(remote_cap)], strict=True)),
            )
        )
    return out


def _local(req: PairRequest, machine: Machine) -> list[Arrangement]:
    """The ladder on this box alone."""
    gpu = _best_gpu(machine) if req.gpu_layers != 0 else None
    full = req.target.block_count + 1
    t_layers = full if req.gpu_layers < 0 else min(req.gpu_layers, full)
    spec_out, ctx = req.n_outputs, req.n_ctx
    out: list[Arrangement] = []
    modes: list[PlanMode] = ["speculative", "ngram", "plain"]
    modes = modes[modes.index(req.declared) :]
    if gpu is None:
        if "speculative" in modes:
            out.append(Arrangement("co-load", "speculative", ctx, 0, 0, None, spec_out))
        if "ngram" in modes:
            out.append(Arrangement("ngram", "ngram", ctx, n_outputs=spec_out))
        out.append(Arrangement("plain", "plain", ctx))
        out += _smaller_contexts(req, Arrangement("smaller-context", "plain", ctx), modes, spec_out)
        return out
    g = gpu.device
    if "speculative" in modes:
        if req.draft_gpu_layers != 0:
            out.append(
                Arrangement(
                    "co-load", "speculative", ctx, t_layers, req.draft_gpu_layers, g, spec_out
                )
            )
        out.append(Arrangement("draft-on-cpu", "speculative", ctx, t_layers, 0, g, spec_out))
    if "ngram" in modes:
        out.append(Arrangement("ngram", "ngram", ctx, t_layers, None, g, spec_out))
    out.append(Arrangement("plain", "plain", ctx, t_layers, None, g))
    base = Arrangement("smaller-context", "plain", ctx, t_layers, None, g)
    out += _smaller_contexts(req, base, modes, spec_out)
    light: PlanMode = "ngram" if "ngram" in modes else "plain"
    n_out = spec_out if light == "ngram" else 1
    for layers in range(min(t_layers, req.target.block_count) - 1, 0, -1):
        out.append(Arrangement("partial-offload", light, ctx, layers, None, g, n_out))
    cpu_req = replace(req, gpu_layers=0)
    out += [replace(a, rung="cpu-only") for a in _local(cpu_req, machine)]
    return out


def _smaller_contexts(
    req: PairRequest, base: Arrangement, modes: list[PlanMode], spec_out: int
) -> list[Arrangement]:
    """n-gram (when the pair may draft) then plain, at each smaller context down to n_ctx_min."""
    out = []
    ctx = kv_cells(req.n_ctx) - KV_CELL_PAD
    if ctx >= req.n_ctx:
        ctx -= KV_CELL_PAD
    while ctx >= req.n_ctx_min:
        if "ngram" in modes:
            out.append(replace(base, mode="ngram", n_ctx=ctx, n_outputs=spec_out))
        out.append(replace(base, mode="plain", n_ctx=ctx, n_outputs=1))
        ctx -= KV_CELL_PAD
    return out


def _shortfall(uses: tuple[DeviceUse, ...]) -> str:
    """The devices that are short, worst first ("rpc:b:0 needs 1.2 GiB, 300 MiB usable, 900 MiB
    short"), or the tightest one when none is."""
    short = sorted((u for u in uses if not u.fits), key=lambda u: u.free - u.need)
    if not short:
        short = [max(uses, key=lambda u: u.need - u.free)]
        return (
            f"{short[0].device} needs {fmt_size(short[0].need)}, {fmt_size(short[0].free)} usable"
        )
    return "; ".join(
        f"{u.device} needs {fmt_size(u.need)}, {fmt_size(u.free)} usable, "
        f"{fmt_size(u.need - u.free)} short"
        for u in short
    )


def _what(a: Arrangement, req: PairRequest) -> str:
    where = f"on {a.gpu}" if a.gpu and a.target_gpu_layers else "in RAM"
    if a.rung == "partial-offload":
        n = req.target.block_count + 1
        where = f"{a.target_gpu_layers}/{n} layers (output first) on {a.gpu}, rest in RAM"
    if a.remote:
        parts = [f"{c} on {d}" for d, c in a.remote if c]
        if a.gpu and a.target_gpu_layers:
            parts.append(f"{a.target_gpu_layers} on {a.gpu}")
        in_ram = req.target.block_count + 1 - sum(c for _, c in a.remote) - a.target_gpu_layers
        if in_ram > 0:
            parts.append(f"{in_ram} in RAM")
        where = f"split over {', '.join(parts)} of {req.target.block_count + 1} layers"
    text = {
        "speculative": "target and draft " + where,
        "ngram": f"target {where}, n-gram drafting (no draft memory)",
        "plain": f"target {where}, plain decoding",
        "refused": "",
    }[a.mode]
    if a.mode == "speculative" and a.rung == "draft-on-cpu":
        text = f"target on {a.gpu}, draft in RAM"
    if a.mode == "speculative" and a.remote:
        here = f"on {a.gpu}" if a.gpu and a.draft_gpu_layers else "in RAM"
        text = f"target {where}; draft here, {here}"
    if a.n_ctx < req.n_ctx:
        text += f", context cut to {a.n_ctx} tokens from {req.n_ctx}"
    return text


def _layers_in_ram(req: PairRequest, a: Arrangement) -> bool:
    """Some layer of either model computes from RAM (more than the token embedding's one row
    per token, which stays in RAM on any GPU)."""
    n = req.target.block_count + 1
    on_gpu = (n if a.target_gpu_layers < 0 else min(a.target_gpu_layers, n)) if a.gpu else 0
    if on_gpu + sum(c for _, c in a.remote) < n:
        return True
    if a.draft_gpu_layers is None or req.draft is None:
        return False
    draft_n = req.draft.block_count + 1
    return a.gpu is None or 0 <= a.draft_gpu_layers < draft_n


def huge_pages(
    req: PairRequest, machine: Machine, a: Arrangement, uses: tuple[DeviceUse, ...]
) -> tuple[bool, str]:
    """engine/pages.choose() for this plan: its weights in RAM and the RAM left after it."""
    ram = next((u for u in uses if u.device == RAM), None)
    if ram is None or not _layers_in_ram(req, a):
        return False, ""
    weights = ram.target_weights + ram.draft_weights
    return choose(req.huge_pages, machine.thp, weights=weights, left=ram.free - ram.need)


def _fitted(req: PairRequest, machine: Machine, p: PairPlan) -> PairPlan:
    on, note = huge_pages(req, machine, p.arrangement, p.devices)
    return replace(p, huge_pages=on, notes=(*p.notes, note) if note else p.notes)


def plan_pair(req: PairRequest, machine: Machine) -> PairPlan:
    """The first arrangement of the ladder that fits, with a reason a person can act on."""
    ladder = candidates(req, machine)
    first = ladder[0]
    for a in ladder:
        uses = evaluate(req, machine, a)
        if all(u.fits for u in uses):
            if a == first:
                declared = PairPlan(
                    req.name, a, f"as declared: {_what(a, req)}", False, a.rung, uses
                )
                return _fitted(req, machine, declared)
            short = _shortfall(evaluate(req, machine, first))
            reason = f"{_what(first, req)} does not fit ({short}): falling back to {_what(a, req)}"
            fallen = PairPlan(req.name, a, reason, True, first.rung, uses, shortfall=short)
            return _fitted(req, machine, fallen)
    smallest = replace(ladder[-1])
    uses = evaluate(req, machine, smallest)
    missing = sum(max(0, u.need - u.free) for u in uses)
    reason = (
        f"does not fit even as {_what(smallest, req)}: {_shortfall(uses)}, "
        f"{fmt_size(missing)} missing; free memory, raise the budget, or use a smaller model"
    )
    if first.remote:  # say first what the workers lack for the declared split
        split_uses = evaluate(req, machine, first)
        reason = (
            f"does not fit as {_what(first, req)} ({_shortfall(split_uses)}) nor on this box "
            f"alone ({_shortfall(uses)}); add a worker, raise a budget, or use a smaller model"
        )
    refused = replace(smallest, rung="refuse", mode="refused")
    return PairPlan(req.name, refused, reason, True, first.rung, uses, shortfall=_shortfall(uses))
