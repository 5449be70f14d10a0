from __future__ import annotations

from pathlib import Path

import pytest

from homespec.errors import ConfigError, ModelFileError
from homespec.manifest import find_manifest, load_manifest, parse_manifest

from .conftest import SHIPPED_MANIFEST

BASE = """
default_pair = "p"
[models.big]
path = "big.gguf"
[models.small]
path = "/abs/small.gguf"
[pairs.p]
target = "big"
draft = "small"
"""


def _parse(text: str) -> object:
    return parse_manifest(text, Path("/cfg/models.toml"))


def test_shipped_manifest_is_valid() -> None:
    m = load_manifest(SHIPPED_MANIFEST)
    assert m.default_pair == "smollm2"
    assert {"smollm2", "smollm2-ngram", "gemma3"} <= set(m.spec.pairs)
    # No drafter or draft length is forced: the governor chooses them.
    assert m.spec.pairs["smollm2"].drafter is None
    assert "draft_tokens" not in m.spec.pairs["smollm2"].model_fields_set


def test_a_byte_order_mark_is_no_syntax_error(tmp_path: Path) -> None:
    """Notepad saves UTF-8 with one: it was "not valid TOML: Invalid statement (at line 1)"."""
    path = tmp_path / "models.toml"
    path.write_bytes(b"\xef\xbb\xbf" + BASE.encode())
    assert load_manifest(path).default_pair == "p"


def test_relative_paths_resolve_against_the_manifest() -> None:
    m = parse_manifest(BASE, Path("/cfg/models.toml"))
    assert m.model_path("big") == Path("/cfg/big.gguf")
    assert m.model_path("small") == Path("/abs/small.gguf")


def test_unknown_key_is_named() -> None:
    with pytest.raises(ConfigError) as e:
        _parse(BASE + "draft_tokenz = 3\n")
    assert "pairs.p.draft_tokenz: unknown key" in str(e.value)
    assert "/cfg/models.toml" in str(e.value)


def test_wrong_type_names_field_and_value() -> None:
    with pytest.raises(ConfigError) as e:
        _parse(BASE + 'draft_tokens = "six"\n')
    assert "pairs.p.draft_tokens" in str(e.value)
    assert "'six'" in str(e.value)


def test_out_of_range_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"pairs\.p\.draft_tokens"):
        _parse(BASE + "draft_tokens = 0\n")


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("spec_max_temperature = nan", "pairs.p.spec_max_temperature"),
        ("[server]\nshutdown_timeout_s = inf", "server.shutdown_timeout_s"),
    ],
)
def test_toml_nan_and_inf_are_no_numbers_a_field_takes(line: str, field: str) -> None:
    """TOML writes them; an unbounded `shutdown_timeout_s = inf` passed its ge=0."""
    with pytest.raises(ConfigError, match=rf"{field}: Input should be a finite number"):
        _parse(BASE + line + "\n")


def test_dangling_model_reference() -> None:
    with pytest.raises(ConfigError, match=r"pairs\.p\.draft: 'tiny' is not a model"):
        _parse(BASE.replace('draft = "small"', 'draft = "tiny"'))


def test_bad_toml_syntax() -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        _parse("[pairs.p\n")


def test_model_needs_exactly_one_source() -> None:
    with pytest.raises(ConfigError, match="exactly one of `path` or `package`"):
        _parse(BASE.replace('path = "big.gguf"', 'file = "x.gguf"'))


def test_unknown_pair_lists_known_ones() -> None:
    m = parse_manifest(BASE, Path("/cfg/models.toml"))
    with pytest.raises(ConfigError, match="known pairs: p"):
        m.pair("nope")


def test_missing_model_file_says_which_pair_and_what_to_do(tmp_path: Path) -> None:
    m = parse_manifest(BASE, tmp_path / "models.toml")
    with pytest.raises(ModelFileError) as e:
        m.require_model_file("big", "p")
    assert "pair 'p' needs model 'big'" in str(e.value)
    assert "models.big.path" in str(e.value)


def test_config_lookup_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models.toml").write_text(BASE)
    env = tmp_path / "env.toml"
    env.write_text(BASE)
    assert find_manifest() == Path("models.toml")
    monkeypatch.setenv("HOMESPEC_CONFIG", str(env))
    assert find_manifest() == env
    assert find_manifest(tmp_path / "models.toml") == tmp_path / "models.toml"
    with pytest.raises(ConfigError, match=r"--config: .* does not exist"):
        find_manifest(tmp_path / "missing.toml")


def test_flash_attention_auto_is_measured_on_cpu_and_llama_cpps_own_on_gpu() -> None:
    from homespec.engine.loader import flash_attention
    from homespec.manifest import PairSpec

    asked: list[bool] = []

    def measured() -> bool:
        asked.append(True)
        return True

    pair = PairSpec(target="t", draft="d")
    assert flash_attention(pair, on_gpu=False, measured=measured) is True
    assert flash_attention(pair, on_gpu=False, measured=lambda: False) is False
    assert flash_attention(pair, on_gpu=True, measured=measured) is None
    on, off = (pair.model_copy(update={"flash_attn": v}) for v in ("on", "off"))
    assert flash_attention(on, on_gpu=False, measured=measured) is True
    assert flash_attention(off, on_gpu=True, measured=measured) is False
    assert asked == [True]  # measured only where "auto" leaves it to this CPU


def test_memory_budget_and_min_context_are_validated(tmp_path: Path) -> None:
    base = '[models.t]\npath = "t.gguf"\n[pairs.p]\ntarget = "t"\ndraft = "ngram"\n'
    with pytest.raises(ConfigError, match=r"memory: budget: unknown device 'gpu0'"):
        parse_manifest(base + '[memory]\nbudget = { gpu0 = "1GiB" }\n', tmp_path / "m.toml")
    with pytest.raises(ConfigError, match=r"budget.ram: 'lots' is not a size"):
        parse_manifest(base + '[memory]\nbudget = { ram = "lots" }\n', tmp_path / "m.toml")
    with pytest.raises(ConfigError, match=r"n_ctx_min 4096 is above n_ctx 2048"):
        parse_manifest(base + "n_ctx_min = 4096\n", tmp_path / "m.toml")
    m = parse_manifest(base + '[memory]\nbudget = { ram = "1.5GiB" }\n', tmp_path / "m.toml")
    assert m.spec.memory.budget == {"ram": "1.5GiB"}
    assert m.spec.pairs["p"].min_context == 512


def test_a_model_in_a_package_that_is_not_installed_says_so(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(
        '[models.m]\npackage = "no_such_homespec_pkg"\nfile = "m.gguf"\n'
        'pip = ["no-such-homespec-pkg"]\n[pairs.p]\ntarget = "m"\ndraft = "ngram"\n'
    )
    manifest = load_manifest(path)
    assert manifest.model_path("m") is None
    with pytest.raises(ModelFileError, match="package 'no_such_homespec_pkg' is not installed"):
        manifest.require_model_file("m", "p")


def test_the_shipped_manifests_server_block_shows_the_defaults_it_says_it_shows() -> None:
    """models.toml's commented `[server]` block ("defaults shown"), uncommented, is what
    ServerSpec defaults to: the example cannot drift from the code."""
    import tomllib

    from homespec.manifest_box import ServerSpec

    lines = SHIPPED_MANIFEST.read_text().splitlines()
    start = lines.index("# [server]")
    block = []
    for line in lines[start + 1 :]:
        if not line.startswith("#") or line.startswith("# ---"):
            break
        block.append(line[2:])
    shown = tomllib.loads("\n".join(block))
    defaults = ServerSpec().model_dump()
    assert {"cors_origins", "max_queue", "stream_interval_ms"} <= set(shown)
    for key, value in shown.items():
        if key != "pairs":  # shown as an example: its default is [] (default_pair)
            assert defaults[key] == value, key
    ServerSpec.model_validate(shown)


@pytest.mark.parametrize(
    "origins", [["localhost:3000"], ["http://localhost/app"], ["http://"], [""]]
)
def test_a_cors_origin_that_is_no_origin_is_refused_by_name(origins: list[str]) -> None:
    from pydantic import ValidationError

    from homespec.manifest_box import ServerSpec

    with pytest.raises(ValidationError, match=r"cors_origins: .* is not an origin"):
        ServerSpec(cors_origins=origins)
