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
from homespec.manifest import NGRAM, NO_DRAFT, Manifest

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


@dataclass
class LoadedPair:
    runtime: PairRuntime
    files: PairFiles
    load_ms: dict[str, float] = field(default_factory=dict)
    _models: list[LlamaModel] = field(default_factory=list)
    _contexts: list[LlamaContext] = field(default_factory=list)

    def close(self) -> None:
        for ctx in self._contexts:
            ctx.close()
        for model in self._models:
            model.close()
        self._contexts.clear()
        self._models.clear()

    def __enter__(self) -> LoadedPair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_pair(
    manifest: Manifest, name: str | None = None, *, load_draft: bool = True
) -> LoadedPair:
    files = inspect_pair(manifest, name)
    name, pair = manifest.pair(files.name)
    threads = pair.threads or default_threads()
    n_batch = min(N_BATCH, pair.n_ctx)
    loaded = LoadedPair(runtime=None, files=files)  # type: ignore[arg-type]  # set below
    try:
        t0 = time.perf_counter()
        target_model = LlamaModel(files.target.path, gpu_layers=pair.gpu_layers)
        loaded._models.append(target_model)
        target_ctx = LlamaContext(target_model, n_ctx=pair.n_ctx, n_batch=n_batch, threads=threads)
        loaded._contexts.append(target_ctx)
        loaded.load_ms["target"] = (time.perf_counter() - t0) * 1000.0
        drafter = None
        reason = files.draft_skip_reason
        if files.draft is not None and load_draft:
            t0 = time.perf_counter()
            draft_model = LlamaModel(files.draft.path, gpu_layers=pair.draft_gpu_layers)
            loaded._models.append(draft_model)
            draft_ctx = LlamaContext(
                draft_model, n_ctx=pair.n_ctx, n_batch=n_batch, threads=threads
            )
            loaded._contexts.append(draft_ctx)
            drafter = ModelDrafter(draft_ctx, p_min=pair.draft_p_min)
            loaded.load_ms["draft"] = (time.perf_counter() - t0) * 1000.0
        elif files.draft is not None:
            reason = "draft model not loaded (load_draft=False)"
        loaded.runtime = PairRuntime(
            name=name,
            spec=pair,
            target=target_ctx,
            draft=drafter,
            ngram=NgramDrafter(n_min=pair.ngram_min, n_max=pair.ngram_max),
            draft_unavailable_reason=reason,
            plain_only_reason=files.plain_only_reason,
        )
        LOG.info("pair %s loaded in %s", name, {k: round(v) for k, v in loaded.load_ms.items()})
        return loaded
    except BaseException:
        loaded.close()
        raise
