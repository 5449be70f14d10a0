"""A declared pair seen from metadata alone: its files checked, and its memory plan.

Everything that can be refused without loading (missing file, not GGUF, truncated, sha256
mismatch, incompatible vocabularies, not enough memory) is refused here, before llama.cpp
allocates anything. `ask`, `bench`, `doctor` and (later) the daemon all start from here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from homespec.engine import flash
from homespec.gguf_meta import GGUFInfo, check_pair, read_gguf
from homespec.integrity import verify_sha256
from homespec.manifest import MAX_DRAFT_TOKENS, NGRAM, NO_DRAFT, Manifest, PairSpec
from homespec.plan_types import PairPlan, PairRequest
from homespec.planner import plan_pair
from homespec.resources import Machine, budgets_from
from homespec.vocab import PlanMode


@dataclass
class PairFiles:
    """The pair's files, validated from metadata alone (nothing loaded yet)."""

    name: str
    target: GGUFInfo
    draft: GGUFInfo | None
    draft_skip_reason: str = ""
    # Set when the target cannot speculate at all (any drafter needs KV rollback).
    plain_only_reason: str = ""


def inspect_pair(manifest: Manifest, name: str | None) -> PairFiles:
    name, pair = manifest.pair(name)
    target_path = manifest.require_model_file(pair.target, name)
    target = read_gguf(target_path)
    verify_sha256(target_path, manifest.spec.models[pair.target].sha256, pair.target)
    if target.recurrent:
        why = (
            f"target architecture {target.architecture!r} is recurrent: its state cannot roll "
            "back rejected drafts, so the pair runs plain"
        )
        return PairFiles(name, target, None, draft_skip_reason=why, plain_only_reason=why)
    if pair.draft in (NGRAM, NO_DRAFT):
        return PairFiles(name, target, None)
    draft_path = manifest.require_model_file(pair.draft, name)
    draft = read_gguf(draft_path)
    verify_sha256(draft_path, manifest.spec.models[pair.draft].sha256, pair.draft)
    check_pair(name, target, draft)
    return PairFiles(name, target, draft)


def declared_mode(manifest: Manifest, files: PairFiles) -> PlanMode:
    _, pair = manifest.pair(files.name)
    if files.plain_only_reason or pair.draft == NO_DRAFT:
        return "plain"
    return "speculative" if files.draft is not None else "ngram"


def plan_request(manifest: Manifest, files: PairFiles, *, kept: bool = False) -> PairRequest:
    """`kept`: the pair stays loaded (the daemon, bench, doctor), so huge pages may pay."""
    _, pair = manifest.pair(files.name)
    return PairRequest(
        name=files.name,
        target=files.target,
        draft=files.draft,
        declared=declared_mode(manifest, files),
        n_ctx=pair.n_ctx,
        n_ctx_min=pair.min_context,
        n_outputs=MAX_DRAFT_TOKENS + 1,
        gpu_layers=pair.gpu_layers,
        draft_gpu_layers=pair.draft_gpu_layers,
        cpu_flash=cpu_flash(pair, files.target.path),
        cpu_batch=cpu_batch(pair, files.target.path),
        huge_pages=kept and pair.huge_pages,
    )


def cpu_flash(pair: PairSpec, target: Path) -> bool:
    """Whether the pair's contexts use flash attention when it runs on the CPU only: as
    models.toml says, or for "auto" as this machine measured for the target (not yet: no)."""
    if pair.flash_attn != "auto":
        return pair.flash_attn == "on"
    return flash.remembered(target) is True


def cpu_batch(pair: PairSpec, target: Path) -> int:
    """Tokens one decode holds where the pair runs on the CPU only: for "auto", as this machine
    measured with its flash verdict (engine/flash.py); else llama.cpp's full batch."""
    if pair.flash_attn != "auto":
        return flash.FULL_BATCH
    return flash.remembered_batch(target)


def with_workers(req: PairRequest, pair: PairSpec, machine: Machine) -> PairRequest:
    """The request with the reachable devices of the pair's target_workers, in their order."""
    devices = tuple(r.device for w in pair.target_workers for r in machine.remotes if r.worker == w)
    return replace(req, remote_devices=devices)


def machine_budgets(manifest: Manifest, machine: Machine) -> Machine:
    """The machine as the planner may use it: the manifest's and the env's budgets applied."""
    return machine.with_budgets(budgets_from(manifest.spec.memory.budget, str(manifest.path)))


def plan(manifest: Manifest, files: PairFiles, machine: Machine, *, kept: bool = False) -> PairPlan:
    """The pair's plan on this machine (budgets applied), with notes on what it ignores.
    `kept`: for a pair that stays loaded (see plan_request)."""
    _, pair = manifest.pair(files.name)
    req = with_workers(plan_request(manifest, files, kept=kept), pair, machine)
    p = plan_pair(req, machine_budgets(manifest, machine))
    notes = list(p.notes)
    down = [w for w in pair.target_workers if not any(r.worker == w for r in machine.remotes)]
    if down:
        why = "; ".join(
            f"worker {w} ({manifest.spec.workers[w].endpoint}) "
            f"{machine.workers_down.get(w, 'not probed')}"
            for w in down
        )
        p = replace(
            p,
            reason=f"{why}: planned without it. {p.reason}",
            degraded=True,
            workers_down=tuple(down),
        )
    trained = files.target.context_length
    if trained and pair.n_ctx > trained:
        notes.append(
            f"n_ctx {pair.n_ctx} is above the target's trained context ({trained}): "
            "answers past it degrade"
        )
    if files.draft_skip_reason:
        notes.append(files.draft_skip_reason)
    return replace(p, notes=tuple(notes))
