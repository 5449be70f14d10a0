"""The memory planner on hand-written metadata and machines: every rung, and its properties."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from homespec.footprint import estimate
from homespec.gguf_meta import GGUFInfo
from homespec.plan_types import PairRequest
from homespec.planner import (
    GPU_RESERVE,
    GPU_RUNTIME,
    GPU_RUNTIME_HOST,
    RAM_RESERVE,
    candidates,
    evaluate,
    plan_pair,
)
from homespec.resources import RAM, Gpu, Machine, Ram
from homespec.sizes import GiB, MiB
from homespec.vocab import RUNGS, PlanMode


def model(
    *,
    layers: int = 32,
    layer_mib: float = 200,
    embd_mib: float = 500,
    output_mib: float = 500,
    n_head: int = 32,
    n_head_kv: int = 8,
    head_dim: int = 128,
    n_embd: int = 4096,
    n_ff: int = 14336,
    vocab: int = 128_256,
    arch: str = "llama",
) -> GGUFInfo:
    """Metadata shaped like a real model (defaults: roughly Llama 3.1 8B at Q8_0)."""
    return GGUFInfo(
        path=Path(f"{arch}-{layers}.gguf"),
        architecture=arch,
        name="synthetic",
        file_type=7,
        block_count=layers,
        context_length=131_072,
        embedding_length=n_embd,
        vocab_type="gpt2",
        vocab_size=vocab,
        bos_id=1,
        eos_id=2,
        add_bos=True,
        add_eos=False,
        tokens=[],
        tensor_bytes=int((layers * layer_mib + embd_mib + output_mib) * MiB),
        n_head=n_head,
        n_head_kv=(n_head_kv,) * layers,
        key_length=head_dim,
        value_length=head_dim,
        n_ff=n_ff,
        layer_bytes=(int(layer_mib * MiB),) * layers,
        embd_bytes=int(embd_mib * MiB),
        output_bytes=int(output_mib * MiB),
    )


TARGET = model()  # ~7.4 GiB of weights
# ~0.8 GiB, tied embeddings (Llama 3.2 1B)
DRAFT = model(
    layers=16,
    layer_mib=40,
    embd_mib=130,
    output_mib=0,
    n_head_kv=8,
    n_embd=2048,
    n_ff=8192,
    head_dim=64,
)


def request(declared: PlanMode = "speculative", **kw: object) -> PairRequest:
    base = PairRequest(
        name="p",
        target=TARGET,
        draft=DRAFT if declared == "speculative" else None,
        declared=declared,
        n_ctx=8192,
        n_ctx_min=1024,
        n_outputs=65,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def box(ram_gib: float, gpu_gib: float | None = None, **ram_kw: int) -> Machine:
    gpus = () if gpu_gib is None else (Gpu("cuda0", "Test GPU", 24 * GiB, int(gpu_gib * GiB)),)
    return Machine(
        ram=Ram(total=64 * GiB, available=int(ram_gib * GiB), **ram_kw),  # type: ignore[arg-type]
        gpus=gpus,
        gpu_offload=gpu_gib is not None,
    )


def test_kv_cache_follows_the_metadata_formula() -> None:
    # 32 layers × 8 KV heads × (128 + 128) × 2 bytes × 8192 cells = 1 GiB: Llama 3.1 8B's f16 KV.
    fp = estimate(TARGET, n_ctx=8192, n_outputs=1)
    assert fp.kv[RAM] == 32 * 8 * 256 * 2 * 8192 == 1 * GiB
    # Cells are n_ctx rounded up to 256.
    assert estimate(TARGET, n_ctx=8000, n_outputs=1).kv[RAM] == fp.kv[RAM]


def test_layers_offload_from_the_last_and_the_embedding_stays_on_the_cpu() -> None:
    # llama.cpp's n_gpu_layers counts the output as a layer and offloads it first.
    part = estimate(TARGET, n_ctx=4096, n_outputs=1, gpu_layers=10, gpu="cuda0")
    assert part.weights["cuda0"] == (9 * 200 + 500) * MiB
    assert part.weights[RAM] == (23 * 200 + 500) * MiB
    assert part.kv["cuda0"] * 23 == part.kv[RAM] * 9
    full = estimate(TARGET, n_ctx=4096, n_outputs=1, gpu_layers=-1, gpu="cuda0")
    assert full.weights["cuda0"] == (32 * 200 + 500) * MiB  # all layers + output
    assert full.weights[RAM] == 500 * MiB  # token embedding
    # A tied output matrix is a copy of the embedding on the GPU.
    tied = estimate(DRAFT, n_ctx=4096, n_outputs=1, gpu_layers=-1, gpu="cuda0")
    assert tied.weights["cuda0"] == (16 * 40 + 130) * MiB


def test_the_logits_buffer_grows_with_the_outputs_a_verify_step_needs() -> None:
    one = estimate(TARGET, n_ctx=4096, n_outputs=1).total
    many = estimate(TARGET, n_ctx=4096, n_outputs=65).total
    assert many - one == 2 * 64 * TARGET.vocab_size * 4  # compute graph + host output buffer


def test_gpu_box_with_room_co_loads_as_declared() -> None:
    p = plan_pair(request(), box(32, gpu_gib=20))
    assert (p.rung, p.mode, p.degraded) == ("co-load", "speculative", False)
    assert p.reason.startswith("as declared: target and draft on cuda0")
    assert p.arrangement.draft_gpu_layers == -1


def test_gpu_too_small_for_both_moves_the_draft_to_the_cpu() -> None:
    # Target alone ~9.6 GiB on the GPU with its context, ~11.6 GiB with the draft; 1 GiB is kept.
    m = box(32, gpu_gib=12)
    assert not all(u.fits for u in evaluate(request(), m, candidates(request(), m)[0]))
    p = plan_pair(request(), m)
    assert (p.rung, p.mode, p.degraded) == ("draft-on-cpu", "speculative", True)
    assert "target and draft on cuda0 does not fit (cuda0 needs" in p.reason
    assert "target on cuda0, draft in RAM" in p.reason
    use = {u.device: u for u in p.devices}
    assert use["cuda0"].draft_weights == 0 and use[RAM].draft_weights > 0


def test_a_cuda_plan_counts_what_the_process_pays_for_the_card_once() -> None:
    """The CUDA context and libraries: on the card and in RAM, its own row, once per process
    (not per model); a CPU plan pays none of it."""
    p = plan_pair(request(), box(32, gpu_gib=20))
    use = {u.device: u for u in p.devices}
    assert use["cuda0"].runtime == GPU_RUNTIME and use[RAM].runtime == GPU_RUNTIME_HOST
    assert use["cuda0"].need > use["cuda0"].target_weights + GPU_RUNTIME
    cpu = plan_pair(request(), box(32))
    assert all(u.runtime == 0 for u in cpu.devices)
    # A card with room for the models, but not for the runtime as well, is short.
    a = candidates(request(), box(32, gpu_gib=20))[0]
    need = {u.device: u.need for u in evaluate(request(), box(32, gpu_gib=20), a)}["cuda0"]
    models_only = need - GPU_RUNTIME
    tight = box(32, gpu_gib=(models_only + GPU_RUNTIME // 2 + GPU_RESERVE) / GiB)
    card = {u.device: u for u in evaluate(request(), tight, a)}["cuda0"]
    assert card.free > models_only and not card.fits


def test_no_ram_for_the_draft_either_drops_it_for_ngram() -> None:
    p = plan_pair(request(), box(1.5, gpu_gib=12))
    assert (p.rung, p.mode) == ("ngram", "ngram")
    assert p.arrangement.draft_gpu_layers is None
    assert "n-gram drafting (no draft memory)" in p.reason


def test_gpu_smaller_than_the_target_at_full_context_cuts_the_context_first() -> None:
    # At 8192 tokens the target needs ~9.5 GiB + 1 GiB kept free; less at a smaller context.
    p = plan_pair(request(), box(2, gpu_gib=10.2))
    assert p.rung == "smaller-context"
    assert 1024 <= p.arrangement.n_ctx < 8192
    assert f"context cut to {p.arrangement.n_ctx} tokens from 8192" in p.reason


def test_gpu_too_small_at_the_minimum_context_offloads_part_of_the_layers() -> None:
    p = plan_pair(request(), box(16, gpu_gib=5))
    assert p.rung == "partial-offload"
    assert 0 < p.arrangement.target_gpu_layers < 32
    assert f"{p.arrangement.target_gpu_layers}/33 layers (output first) on cuda0" in p.reason
    assert all(u.fits for u in p.devices)


def test_gpu_useless_falls_back_to_the_cpu() -> None:
    p = plan_pair(request(), box(32, gpu_gib=0.5))
    assert p.rung == "cpu-only"
    assert p.arrangement.gpu is None or p.arrangement.target_gpu_layers == 0


def test_cpu_box_rungs_co_load_ngram_plain_smaller_context_refuse() -> None:
    rungs = [a.rung for a in candidates(request(), box(64))]
    assert rungs[:3] == ["co-load", "ngram", "plain"]
    assert set(rungs[3:]) == {"smaller-context"}
    assert plan_pair(request(), box(64)).rung == "co-load"
    # Co-loaded the pair needs ~12.3 GiB with its margin, the target alone ~10.2 GiB.
    assert plan_pair(request(), box(11)).rung == "ngram"
    p = plan_pair(request(), box(4))
    assert p.mode == "refused"
    assert "does not fit even as target in RAM, plain decoding, context cut to 1024" in p.reason
    assert "missing" in p.reason


def test_cgroup_limit_caps_ram_below_what_the_host_has_free() -> None:
    limited = box(60, cgroup_limit=2 * GiB, cgroup_used=100 * MiB)
    assert limited.free(RAM) == 2 * GiB - 100 * MiB
    small = request(target=DRAFT, draft=None, declared="ngram", n_ctx=2048, n_ctx_min=512)
    p = plan_pair(small, limited)
    assert p.runnable
    assert p.devices[0].free == 2 * GiB - 100 * MiB - RAM_RESERVE
    assert plan_pair(request(), limited).mode == "refused"


def test_budget_caps_what_is_planned_even_with_free_memory() -> None:
    m = box(60, gpu_gib=20).with_budgets({"cuda0": 6 * GiB})
    assert m.free("cuda0", GPU_RESERVE) == 6 * GiB
    assert plan_pair(request(), m).rung != "co-load"


def test_declared_layout_is_the_first_rung_and_not_degraded() -> None:
    cpu_draft = plan_pair(request(draft_gpu_layers=0), box(32, gpu_gib=20))
    assert (cpu_draft.rung, cpu_draft.degraded) == ("draft-on-cpu", False)
    cpu_only = plan_pair(request(gpu_layers=0), box(32, gpu_gib=20))
    assert (cpu_only.rung, cpu_only.arrangement.gpu) == ("co-load", None)
    ngram = plan_pair(request("ngram"), box(32))
    assert (ngram.rung, ngram.mode, ngram.degraded) == ("ngram", "ngram", False)
    plain = plan_pair(request("plain"), box(32))
    assert (plain.rung, plain.mode, plain.arrangement.n_outputs) == ("plain", "plain", 1)


def test_gpu_without_offload_support_is_ignored() -> None:
    m = replace(box(32, gpu_gib=20), gpu_offload=False)
    assert plan_pair(request(), m).arrangement.gpu is None


def test_unified_memory_counts_gpu_use_against_ram() -> None:
    metal = Gpu("metal", "Apple GPU", 12 * GiB, 12 * GiB, unified=True)
    m = Machine(ram=Ram(total=16 * GiB, available=12 * GiB), gpus=(metal,), gpu_offload=True)
    p = plan_pair(request(), m)
    ram = next(u for u in p.devices if u.device == RAM)
    gpu = next(u for u in p.devices if u.device == "metal")
    assert ram.free <= 12 * GiB - RAM_RESERVE - gpu.need


def ladder_index(req: PairRequest, m: Machine) -> int:
    p = plan_pair(req, m)
    ladder = candidates(req, m)
    return ladder.index(p.arrangement) if p.runnable else len(ladder)


@settings(max_examples=150, deadline=None)
@given(
    ram=st.floats(0.5, 40),
    gpu=st.one_of(st.none(), st.floats(0.2, 24)),
    more_ram=st.floats(0, 20),
    more_gpu=st.floats(0, 20),
    declared=st.sampled_from(["speculative", "ngram", "plain"]),
)
def test_more_memory_never_picks_a_worse_rung(
    ram: float, gpu: float | None, more_ram: float, more_gpu: float, declared: PlanMode
) -> None:
    req = request(declared)
    less = ladder_index(req, box(ram, gpu))
    more = ladder_index(req, box(ram + more_ram, None if gpu is None else gpu + more_gpu))
    assert more <= less


def test_plan_dict_is_the_documented_shape() -> None:
    d = plan_pair(request(), box(2, gpu_gib=12)).to_dict()
    assert {"name", "rung", "mode", "reason", "devices"} <= set(d)
    assert d["rank"] == RUNGS.index(d["rung"]) + 1
    dev = d["devices"][0]
    assert {
        "device",
        "target_weights",
        "target_kv",
        "draft_weights",
        "draft_kv",
        "compute",
        "runtime",
        "margin",
        "need",
        "free",
        "fits",
    } == set(dev)


# --- huge pages (engine/pages.py) -------------------------------------------------------------


def test_a_kept_cpu_pair_with_room_reads_its_weights_into_huge_pages() -> None:
    p = plan_pair(request(huge_pages=True), replace(box(32), thp="madvise"))
    assert p.huge_pages and not any("huge pages" in n for n in p.notes)
    # `ask` loads once: never (the longer load would not pay), and nothing to say about it
    once = plan_pair(request(), replace(box(32), thp="always"))
    assert not once.huge_pages and once.notes == ()


def test_huge_pages_say_why_not_where_the_system_has_them_off() -> None:
    p = plan_pair(request(huge_pages=True), replace(box(32), thp="never"))
    assert not p.huge_pages
    assert any('"never"' in n and "memory-mapped" in n for n in p.notes)
    # no transparent huge pages at all (not Linux): nothing to act on, nothing said
    mac = plan_pair(request(huge_pages=True), box(32))
    assert not mac.huge_pages and mac.notes == ()


def test_huge_pages_need_room_left_after_the_plan() -> None:
    roomy = plan_pair(request(huge_pages=True), replace(box(32), thp="madvise"))
    ram = next(u for u in roomy.devices if u.device == RAM)
    # Free RAM that fits the pair with 1 GiB less to spare than huge pages ask for.
    need = ram.need + RAM_RESERVE + max(GiB, (ram.target_weights + ram.draft_weights) // 4)
    tight_box = replace(box((need - 64 * MiB) / GiB), thp="madvise")
    tight = plan_pair(request(huge_pages=True), tight_box)
    assert (tight.rung, tight.degraded) == ("co-load", False)  # the pair itself still fits
    assert not tight.huge_pages
    assert any("left after the plan" in n and "drop and re-read" in n for n in tight.notes)
    enough = plan_pair(
        request(huge_pages=True), replace(box((need + 64 * MiB) / GiB), thp="madvise")
    )
    assert enough.huge_pages


def test_huge_pages_only_where_layers_compute_from_ram() -> None:
    gpu = replace(box(32, gpu_gib=20), thp="always")
    on_card = plan_pair(request(huge_pages=True), gpu)
    assert on_card.rung == "co-load" and not on_card.huge_pages and on_card.notes == ()
    draft_in_ram = plan_pair(request(huge_pages=True, draft_gpu_layers=0), gpu)
    assert draft_in_ram.rung == "draft-on-cpu" and draft_in_ram.huge_pages
    partial = plan_pair(request(huge_pages=True), replace(box(32, gpu_gib=4), thp="always"))
    assert partial.rung == "partial-offload" and partial.huge_pages
