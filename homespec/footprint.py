"""What one model takes on each device: the estimate the memory planner (planner.py) plans with.

Pure functions of GGUF metadata and the context settings (docs/ARCHITECTURE.md, "Memory", has
the measurements behind the constants):
- weights: the file's tensor bytes, placed as llama.cpp places them (`layer_devices`): its
  n_gpu_layers counts the output as a layer and offloads it first, then the repeating layers
  from the last; the token embedding stays on the CPU; a tied output is a copy of the
  embedding on the output's device.
- KV cache: Σ layers n_head_kv × (key_length + value_length) × 2 bytes (f16) × cells, cells =
  n_ctx rounded up to 256; sliding-window layers are full size (llama.cpp's swa_full default).
- compute: attention scores for one layer (n_ubatch × cells × n_head × 4 bytes, ×1.6 for the
  softmax copy), masks, activations, per backend that runs layers, and the logits of up to
  `n_outputs` positions on the output's device; fitted to what llama.cpp really touched on the
  demo models (the planner adds a margin on top).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from homespec.gguf_meta import GGUFInfo
from homespec.resources import RAM
from homespec.sizes import MiB

KV_CELL_PAD = 256
KV_BYTES_PER_ELEMENT = 2.0  # f16 K and V, llama.cpp's default cache type
KQ_FACTOR = 1.6  # scores + softmax output alive at once (measured: 1.6 on SmolLM2, Gemma 3)
ACTIVATION_ROWS = 3  # ~3 × (n_embd + n_ff) floats per batch token alive at the peak (measured)
HOST_OVERHEAD = 14 * MiB  # per loaded model: vocabulary, token cache, graph metadata (measured)
HOST_OVERHEAD_PER_TOKEN = 80  # bytes per vocabulary entry (measured: 49k and 262k vocabularies)
N_UBATCH = 512


@dataclass(frozen=True)
class Footprint:
    """One model's estimated bytes per device ("ram", "cuda0", ...)."""

    weights: dict[str, int] = field(default_factory=dict)
    kv: dict[str, int] = field(default_factory=dict)
    compute: dict[str, int] = field(default_factory=dict)

    def on(self, device: str) -> int:
        return sum(part.get(device, 0) for part in (self.weights, self.kv, self.compute))

    @property
    def total(self) -> int:
        return sum(self.on(d) for d in self.devices)

    @property
    def devices(self) -> list[str]:
        return sorted({*self.weights, *self.kv, *self.compute})


def _add(d: dict[str, int], device: str, n: float) -> None:
    if n:
        d[device] = d.get(device, 0) + int(n)


def kv_cells(n_ctx: int) -> int:
    return -(-n_ctx // KV_CELL_PAD) * KV_CELL_PAD


def layer_devices(
    n_layer: int, offload: tuple[tuple[str, int], ...] | list[tuple[str, int]]
) -> list[str]:
    """The device of each of the model's n_layer + 1 layers (the last one is the output), as
    llama.cpp assigns them: `offload` lists the devices in llama.cpp's order with how many layers
    each takes (their sum is n_gpu_layers); the last layers go to them in that order, the
    others stay in RAM. llama.cpp counts the output as a layer and offloads it first."""
    n = min(sum(c for _, c in offload), n_layer + 1)
    out = [RAM] * (n_layer + 1 - n)
    for device, count in offload:
        out += [device] * count
    return out[: n_layer + 1]


def estimate(
    info: GGUFInfo,
    *,
    n_ctx: int,
    n_outputs: int,
    gpu_layers: int = 0,
    gpu: str | None = None,
    n_ubatch: int = N_UBATCH,
    remote: tuple[tuple[str, int], ...] = (),
    flash: bool = False,
) -> Footprint:
    """Bytes per device for one model and its context. `gpu_layers` is llama.cpp's n_gpu_layers
    for the local GPU (-1: all, the output included); `remote` gives RPC devices their layers
    first (llama.cpp puts RPC devices before local GPUs). `flash`: the context runs flash
    attention on the CPU, which never holds the attention scores of a whole batch (measured on
    the demo pair: 48 and 65 MiB less than without it, the scores term within 2%)."""
    n_layer = info.block_count
    taken = sum(c for _, c in remote)
    local = 0
    if gpu is not None:
        local = n_layer + 1 - taken if gpu_layers < 0 else min(gpu_layers, n_layer + 1 - taken)
    offload = [*remote, *([(gpu, local)] if gpu is not None and local > 0 else [])]
    where = layer_devices(n_layer, offload)
    w: dict[str, int] = {}
    kv: dict[str, int] = {}
    compute: dict[str, int] = {}
    cells = kv_cells(n_ctx)
    for i, layer_bytes in enumerate(info.layer_bytes):
        _add(w, where[i], layer_bytes)
        n_kv = info.n_head_kv[i] if i < len(info.n_head_kv) else 0
        _add(
            kv,
            where[i],
            n_kv * (info.key_length + info.value_length) * KV_BYTES_PER_ELEMENT * cells,
        )
    _add(w, RAM, info.embd_bytes)
    output_device = where[n_layer]
    if info.output_bytes:
        _add(w, output_device, info.output_bytes)
    elif output_device != RAM:  # tied: llama.cpp copies the embedding to the output's device
        _add(w, output_device, info.embd_bytes)
    _add(w, output_device, info.other_bytes)
    ubatch = min(n_ubatch, n_ctx)
    kv_cells_used = cells if not info.recurrent else ubatch
    scores = 0 if flash else ubatch * kv_cells_used * max(info.n_head, 1) * 4 * KQ_FACTOR
    graph = (
        scores
        + ubatch * kv_cells_used * 4 * (2 if info.sliding_window else 1)
        + ubatch * 4 * ACTIVATION_ROWS * (info.embedding_length + info.n_ff)
    )
    logits = n_outputs * info.vocab_size * 4
    # One compute buffer per backend that runs layers: the local one (the GPU when it holds
    # any, else the CPU) with the logits, and each RPC device that holds layers.
    compute_device = gpu if gpu is not None and local > 0 else RAM
    _add(compute, compute_device, graph + (logits if output_device == compute_device else 0))
    for device, count in remote:
        if count:
            _add(compute, device, graph + (logits if output_device == device else 0))
    # Host side: vocabulary and caches, the logits output buffer, the input embeddings.
    host = HOST_OVERHEAD + HOST_OVERHEAD_PER_TOKEN * info.vocab_size
    host += n_outputs * info.vocab_size * 4
    if output_device != RAM:
        host += ubatch * info.embedding_length * 4 * 2
    _add(compute, RAM, host)
    return Footprint(w, kv, compute)
