"""Probes and budgets: cgroup limits from fake cgroup trees, budget strings, backend names."""

from __future__ import annotations

from pathlib import Path

import pytest

from homespec.errors import ConfigError
from homespec.resources import (
    RAM,
    Gpu,
    Ram,
    budgets_from,
    cgroup_memory,
    parse_backends,
    parse_budget,
    probe_machine,
)
from homespec.sizes import GiB, MiB, fmt_size, parse_size


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_limit_of_a_systemd_service(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    write(root / "cgroup.controllers", "memory\n")
    svc = root / "system.slice" / "homespec.service"
    write(svc / "memory.max", f"{2 * GiB}\n")
    write(svc / "memory.current", f"{700 * MiB}\n")
    write(svc / "memory.stat", f"anon 1\ninactive_file {200 * MiB}\n")
    write(root / "system.slice" / "memory.max", "max\n")
    proc = tmp_path / "cgroup"
    write(proc, "0::/system.slice/homespec.service\n")
    assert cgroup_memory(proc, root) == (2 * GiB, 500 * MiB)


def test_cgroup_takes_the_tightest_ancestor(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    write(root / "cgroup.controllers", "memory\n")
    write(root / "a" / "memory.max", f"{1 * GiB}\n")
    write(root / "a" / "memory.current", "0\n")
    write(root / "a" / "b" / "memory.max", f"{4 * GiB}\n")
    write(root / "a" / "b" / "memory.current", "0\n")
    write(tmp_path / "cgroup", "0::/a/b\n")
    assert cgroup_memory(tmp_path / "cgroup", root)[0] == 1 * GiB


def test_cgroup_v1_and_no_limit(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    leaf = root / "memory" / "docker" / "abc"
    write(leaf / "memory.limit_in_bytes", f"{3 * GiB}\n")
    write(leaf / "memory.usage_in_bytes", f"{1 * GiB}\n")
    write(leaf / "memory.stat", f"total_inactive_file {256 * MiB}\n")
    write(tmp_path / "cgroup", "5:cpu:/\n4:memory:/docker/abc\n0::/\n")
    assert cgroup_memory(tmp_path / "cgroup", root) == (3 * GiB, 768 * MiB)
    write(leaf / "memory.limit_in_bytes", "9223372036854771712\n")  # v1's "no limit"
    assert cgroup_memory(tmp_path / "cgroup", root) == (None, None)
    assert cgroup_memory(tmp_path / "missing", root) == (None, None)


def test_ram_free_is_the_tighter_of_host_and_cgroup() -> None:
    assert Ram(total=32 * GiB, available=20 * GiB).free == 20 * GiB
    r = Ram(total=32 * GiB, available=20 * GiB, cgroup_limit=4 * GiB, cgroup_used=3 * GiB)
    assert r.free == 1 * GiB
    assert Ram(total=1, available=1, cgroup_limit=1, cgroup_used=5).free == 0


def test_sizes_parse_and_print() -> None:
    assert parse_size("1.5GiB") == parse_size("1.5 g") == int(1.5 * GiB)
    assert parse_size("512MiB") == 512 * MiB
    assert parse_size("2GB") == 2_000_000_000
    assert parse_size("4096") == 4096
    for bad in ("", "lots", "1.5XB", "-1G"):
        with pytest.raises(ValueError, match="is not a size"):
            parse_size(bad)
    assert fmt_size(1.5 * GiB) == "1.50 GiB"
    assert fmt_size(97.4 * MiB) == "97.4 MiB"


def test_budget_strings_and_their_errors() -> None:
    assert parse_budget("ram=1.5GiB, cuda0=7GiB", "x") == {RAM: int(1.5 * GiB), "cuda0": 7 * GiB}
    assert parse_budget("", "x") == {}
    with pytest.raises(ConfigError, match=r"BUDGET: .vram=1G. is not DEVICE=SIZE"):
        parse_budget("vram=1G", "$HOMESPEC_MEMORY_BUDGET")
    with pytest.raises(ConfigError, match=r"x: ram: 'big' is not a size"):
        parse_budget("ram=big", "x")


def test_env_budget_wins_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOMESPEC_MEMORY_BUDGET", "ram=1GiB")
    got = budgets_from({"ram": "8GiB", "cuda0": "6GiB"}, "models.toml")
    assert got == {RAM: 1 * GiB, "cuda0": 6 * GiB}


def test_backend_names_from_llama_cpp_system_info() -> None:
    info = "CPU : SSE3 = 1 | AVX2 = 1 | REPACK = 1 | CUDA : ARCHS = 890 | USE_GRAPHS = 1 |"
    assert parse_backends(info) == ("CPU", "CUDA")


def test_probe_never_raises_and_notes_a_missing_gpu() -> None:
    m = probe_machine(
        ram=lambda: Ram(total=8 * GiB, available=6 * GiB),
        cuda=lambda: ([], "no NVIDIA GPU (NVML Shared Library Not Found)"),
    )
    assert m.gpus == () and not m.usable_gpus
    assert m.notes == ("no NVIDIA GPU (NVML Shared Library Not Found)",)
    gpu = Gpu("cuda0", "RTX", 8 * GiB, 7 * GiB)
    cpu_build = probe_machine(
        ram=lambda: Ram(total=8 * GiB, available=6 * GiB), cuda=lambda: ([gpu], "")
    )
    assert cpu_build.gpus == (gpu,) and cpu_build.usable_gpus == ()
    assert "cannot offload" in cpu_build.notes[0]


def test_probe_on_this_machine_reads_real_ram() -> None:
    m = probe_machine()
    assert 0 < m.ram.available <= m.ram.total
    assert m.free(RAM) > 0


def test_minus_takes_what_earlier_pairs_use_off_free_memory_and_budgets() -> None:
    gpu = Gpu("cuda0", "RTX", 8 * GiB, 7 * GiB)
    m = probe_machine(
        ram=lambda: Ram(total=16 * GiB, available=10 * GiB, cgroup_limit=8 * GiB, cgroup_used=0),
        cuda=lambda: ([gpu], ""),
    ).with_budgets({RAM: 6 * GiB})
    left = m.minus({RAM: 2 * GiB, "cuda0": 3 * GiB})
    assert left.ram.available == 8 * GiB and left.ram.cgroup_used == 2 * GiB
    assert left.free(RAM) == 4 * GiB  # the budget, less what is taken
    assert left.gpus[0].free == 4 * GiB
    assert left.with_budgets({RAM: 6 * GiB}).free(RAM) == 4 * GiB  # re-applying keeps the tighter


def test_a_pair_holds_its_plan_or_what_was_measured_where_that_is_more() -> None:
    from homespec.resources import held

    assert held({"ram": 900, "cuda0": 4000}, {"ram": 1200}) == {"ram": 1200, "cuda0": 4000}
    assert held({"ram": 900}, {"ram": 700, "cuda1": 5}) == {"ram": 900, "cuda1": 5}
