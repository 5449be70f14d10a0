"""What the memory planner decides over and what it returns: pure data (planner.py decides).

- PairRequest: a pair as models.toml declares it, reduced to what planning needs;
- Arrangement: where each model goes, the knobs the loader turns;
- DeviceUse: one device's bytes under an arrangement, against what it has free;
- PairPlan: the arrangement chosen, why, and each device's use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from homespec.footprint import N_UBATCH
from homespec.gguf_meta import GGUFInfo
from homespec.vocab import RUNGS, PlanMode, Rung


@dataclass(frozen=True)
class DeviceUse:
    device: str
    target_weights: int
    target_kv: int
    draft_weights: int
    draft_kv: int
    compute: int
    margin: int
    free: int
    runtime: int = 0  # per process, for using a CUDA GPU at all (GPU_RUNTIME)

    @property
    def need(self) -> int:
        return (
            self.target_weights
            + self.target_kv
            + self.draft_weights
            + self.draft_kv
            + self.compute
            + self.runtime
            + self.margin
        )

    @property
    def fits(self) -> bool:
        return self.need <= self.free

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "target_weights": self.target_weights,
            "target_kv": self.target_kv,
            "draft_weights": self.draft_weights,
            "draft_kv": self.draft_kv,
            "compute": self.compute,
            "runtime": self.runtime,
            "margin": self.margin,
            "need": self.need,
            "free": self.free,
            "fits": self.fits,
        }


@dataclass(frozen=True)
class Arrangement:
    """Where each model goes: the knobs the loader turns."""

    rung: Rung
    mode: PlanMode
    n_ctx: int
    target_gpu_layers: int = 0
    draft_gpu_layers: int | None = None  # None: the draft is not loaded
    gpu: str | None = None
    n_outputs: int = 1  # logits positions per target decode (draft_tokens + 1 when speculating)
    # RPC worker devices and the target layers each takes (llama.cpp's order; "split" rung)
    remote: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class PairPlan:
    name: str
    arrangement: Arrangement
    reason: str
    degraded: bool
    declared_rung: str
    devices: tuple[DeviceUse, ...] = ()
    notes: tuple[str, ...] = ()
    shortfall: str = ""  # when degraded: which device ran short for the declared arrangement
    workers_down: tuple[str, ...] = ()  # declared RPC workers planned without (unreachable)
    # Read the weights held in RAM into memory of their own and back it with 2 MiB pages
    # (engine/pages.py); why not, when asked and not, is in `notes`.
    huge_pages: bool = False

    @property
    def rung(self) -> str:
        return self.arrangement.rung

    @property
    def mode(self) -> PlanMode:
        return self.arrangement.mode

    @property
    def runnable(self) -> bool:
        return self.mode != "refused"

    def summary(self) -> dict[str, Any]:
        """The short form requests and status carry: rung, mode, reason, context."""
        a = self.arrangement
        out: dict[str, Any] = {
            "rung": a.rung,
            "mode": a.mode,
            "reason": self.reason,
            "n_ctx": a.n_ctx,
            "huge_pages": self.huge_pages,
            "notes": list(self.notes),
        }
        if a.remote or self.workers_down:
            out["remote_layers"] = dict(a.remote)
            out["workers_down"] = list(self.workers_down)
        return out

    def to_dict(self) -> dict[str, Any]:
        a = self.arrangement
        return {
            "name": self.name,
            "rung": a.rung,
            "rank": RUNGS.index(a.rung) + 1,
            "mode": a.mode,
            "reason": self.reason,
            "degraded": self.degraded,
            "declared_rung": self.declared_rung,
            "shortfall": self.shortfall,
            "n_ctx": a.n_ctx,
            "target_gpu_layers": a.target_gpu_layers,
            "draft_gpu_layers": a.draft_gpu_layers,
            "draft_loaded": a.draft_gpu_layers is not None,
            "gpu": a.gpu,
            "remote_layers": dict(a.remote),
            "n_outputs": a.n_outputs,
            "devices": [d.to_dict() for d in self.devices],
            "workers_down": list(self.workers_down),
            "huge_pages": self.huge_pages,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class PairRequest:
    """What the manifest declares for a pair, reduced to what the planner needs."""

    name: str
    target: GGUFInfo
    draft: GGUFInfo | None  # None: declared "ngram"/"none", or a recurrent target
    declared: PlanMode  # speculative (draft model), ngram or plain
    n_ctx: int
    n_ctx_min: int
    n_outputs: int  # logits positions a verify step needs
    gpu_layers: int = -1  # -1: as many as fit; 0: CPU only; N: at most N
    draft_gpu_layers: int = -1
    remote_devices: tuple[str, ...] = ()  # reachable devices of the pair's target_workers
    # Flash attention where the pair runs on the CPU only: "on", or "auto" with this machine's
    # remembered verdict (engine/flash.py; none yet: planned without, the larger buffers)
    cpu_flash: bool = False
    # and the batch size measured with that verdict (flash.FULL_BATCH where none)
    cpu_batch: int = N_UBATCH
    # models.toml's huge_pages, for a pair kept loaded (the daemon, bench): `ask` loads once
    huge_pages: bool = False
