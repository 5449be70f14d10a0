"""Shared fixtures. Every test gets its own HOMESPEC_HOME; engine tests use the real demo pair
(and are marked `models`); HTTP and CLI contracts use the scripted fake target."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter
from openai import OpenAI

from homespec.engine.loader import LoadedPair, load_pair
from homespec.manifest import Manifest, load_manifest

from .daemon_process import Daemon, fake_daemon

REPO = Path(__file__).resolve().parent.parent
SHIPPED_MANIFEST = REPO / "models.toml"


# A test that uses one of these needs the real demo models: it is marked `models`, and
# `pytest -m "not models"` (the fast tier) leaves it out.
MODEL_FIXTURES = {"demo_manifest", "demo_pair", "draft_path", "target_path"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.models)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOMESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HOMESPEC_CONFIG", raising=False)
    monkeypatch.delenv("HOMESPEC_MEMORY_BUDGET", raising=False)
    monkeypatch.delenv("HOMESPEC_API_KEY", raising=False)
    monkeypatch.setenv("HOMESPEC_STATE_DIR", str(tmp_path / "state"))
    # `ask` tries a daemon first: point it where none listens (port 9 is "discard").
    monkeypatch.setenv("HOMESPEC_URL", "http://127.0.0.1:9")


@pytest.fixture(scope="session")
def demo_manifest() -> Manifest:
    """The shipped manifest with its default pair's files in place (`homespec setup` is
    idempotent, so this only downloads/derives on a machine that has never run it)."""
    from homespec.setup_models import setup_pairs

    manifest = load_manifest(SHIPPED_MANIFEST)
    setup_pairs(manifest, [manifest.default_pair], report=lambda _: None)
    return manifest


@pytest.fixture(scope="session")
def demo_pair(demo_manifest: Manifest) -> Iterator[LoadedPair]:
    with load_pair(demo_manifest, "smollm2") as loaded:
        yield loaded


@pytest.fixture(scope="session")
def draft_path(demo_manifest: Manifest) -> Path:
    return demo_manifest.model_path("smollm2-135m-q4_1")


@pytest.fixture(scope="session")
def target_path(demo_manifest: Manifest) -> Path:
    return demo_manifest.model_path("smollm2-135m-f32")


def write_tiny_gguf(
    path: Path,
    *,
    tokens: list[str] | None = None,
    vocab_type: str = "gpt2",
    bos: int = 1,
    eos: int = 2,
    add_bos: bool = False,
    arch: str = "llama",
) -> Path:
    """A tiny synthetic GGUF (metadata + one small tensor) for parser and compatibility tests."""
    w = GGUFWriter(str(path), arch)
    w.add_block_count(2)
    w.add_context_length(256)
    w.add_embedding_length(8)
    w.add_head_count(2)
    w.add_tokenizer_model(vocab_type)
    w.add_token_list(tokens if tokens is not None else [f"t{i}" for i in range(300)])
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(add_bos)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="session")
def repack_crash_shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/native/repack_crash.c built as an LD_PRELOAD library: llama.cpp then crashes by
    SIGSEGV at the first compute of a process that loaded a model with repacked weights, as it
    does on CPUs with AMX (llama.cpp issue 20824), on any Linux machine."""
    import shutil
    import subprocess
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("LD_PRELOAD interposition is Linux-only")
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed (it also builds llama-cpp-python)"
    out = tmp_path_factory.mktemp("native") / "repack_crash.so"
    src = REPO / "tests" / "native" / "repack_crash.c"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(out), str(src), "-ldl"], check=True)
    return out


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon serving the pair smollm2 on the scripted fake target, one per test module that
    uses it (a module that needs another daemon defines its own `daemon`)."""
    d = fake_daemon(tmp_path_factory.mktemp("daemon"), "--pair", "smollm2")
    yield d
    d.stop()


@pytest.fixture()
def sdk(daemon: Daemon) -> Iterator[OpenAI]:
    """An OpenAI client of the module's `daemon` fixture. Closed after the test: a client left
    to the garbage collector closed its socket with a ResourceWarning in whichever test the
    collection ran (an error under filterwarnings)."""
    with OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client
