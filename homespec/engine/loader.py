"""Load a pair declared in the manifest: check files and compatibility first, then load.

Everything that can be refused from metadata (missing file, not GGUF, truncated, sha256 mismatch,
incompatible vocabularies) is refused here, before llama.cpp allocates anything.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from homespec.engine.drafters import ModelDrafter, NgramDrafter
from homespec.engine.generate import PairRuntime
from homespec.engine.llama_backend import LlamaContext, LlamaModel, default_threads
from homespec.gguf_meta import GGUFInfo, check_pair, read_gguf
from homespec.integrity import verify_sha256
from homespec.manifest import NGRAM, NO_DRAFT, Manifest, PairSpec

LOG = logging.getLogger("homespec.loader")
N_BATCH = 512


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


def flash_attention(pair: PairSpec) -> bool | None:
    """The pair's flash-attention setting for llama.cpp (None = llama.cpp decides).

    On the CPU, llama.cpp's flash-attention kernel slowed decoding as the context grew on the
    machines homespec is built on (SmolLM2 F32 at 800 tokens of context: 50 ms/token with it,
    28 ms without; about even under 100 tokens), so "auto" turns it off for CPU-only pairs.
    """
    if pair.flash_attn != "auto":
        return pair.flash_attn == "on"
    on_gpu = pair.gpu_layers != 0 or pair.draft_gpu_layers != 0
    return None if on_gpu else False


def _close(contexts: list[LlamaContext], models: list[LlamaModel]) -> None:
    for ctx in contexts:
        ctx.close()
    for model in models:
        model.close()
    contexts.clear()
    models.clear()


@dataclass
class LoadedPair:
    """A loaded pair; close() (or `with`) frees the contexts, then the models."""

    runtime: PairRuntime
    files: PairFiles
    load_ms: dict[str, float]
    models: list[LlamaModel] = field(default_factory=list)
    contexts: list[LlamaContext] = field(default_factory=list)

    def close(self) -> None:
        _close(self.contexts, self.models)

    def __enter__(self) -> LoadedPair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_pair(
    manifest: Manifest, name: str | None = None, *, load_draft: bool = True
) -> LoadedPair:
    """Validate from metadata (inspect_pair), then load the target, then the draft."""
    files = inspect_pair(manifest, name)
    name, pair = manifest.pair(files.name)
    threads = pair.threads or default_threads()
    n_batch = min(N_BATCH, pair.n_ctx)
    flash_attn = flash_attention(pair)
    models: list[LlamaModel] = []
    contexts: list[LlamaContext] = []
    load_ms: dict[str, float] = {}
    try:
        t0 = time.perf_counter()
        models.append(LlamaModel(files.target.path, gpu_layers=pair.gpu_layers))
        target_ctx = LlamaContext(
            models[0], n_ctx=pair.n_ctx, n_batch=n_batch, threads=threads, flash_attn=flash_attn
        )
        contexts.append(target_ctx)
        load_ms["target"] = (time.perf_counter() - t0) * 1000.0
        drafter = None
        reason = files.draft_skip_reason
        if files.draft is not None and load_draft:
            t0 = time.perf_counter()
            models.append(LlamaModel(files.draft.path, gpu_layers=pair.draft_gpu_layers))
            draft_ctx = LlamaContext(
                models[1], n_ctx=pair.n_ctx, n_batch=n_batch, threads=threads, flash_attn=flash_attn
            )
            contexts.append(draft_ctx)
            drafter = ModelDrafter(draft_ctx, p_min=pair.draft_p_min)
            load_ms["draft"] = (time.perf_counter() - t0) * 1000.0
        elif files.draft is not None:
            reason = "draft model not loaded (load_draft=False)"
    except BaseException:
        _close(contexts, models)
        raise
    runtime = PairRuntime(
        name=name,
        spec=pair,
        target=target_ctx,
        draft=drafter,
        ngram=NgramDrafter(n_min=pair.ngram_min, n_max=pair.ngram_max),
        draft_unavailable_reason=reason,
        plain_only_reason=files.plain_only_reason,
    )
    LOG.info("pair %s loaded in %s", name, {k: round(v) for k, v in load_ms.items()})
    return LoadedPair(runtime, files, load_ms, models, contexts)
