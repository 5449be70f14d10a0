"""RPC workers without models: endpoints, binds, probing that never hangs, the split plan, and
the daemon's decision to re-plan. The real thing (workers holding layers) is tests/test_rpc.py."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from homespec.cli import cli
from homespec.daemon import rpc_watch
from homespec.errors import ConfigError
from homespec.footprint import layer_devices
from homespec.manifest import load_manifest
from homespec.planner import evaluate, plan_pair
from homespec.resources import RAM, Remote
from homespec.sizes import GiB, MiB
from homespec.workers import probe, public_bind, remotes, split_endpoint

from .daemon_process import free_port
from .test_planner import TARGET, box, request


def remote(name: str, free_gib: float, budget_gib: float | None = None) -> Remote:
    return Remote(
        device=f"rpc:{name}:0",
        worker=name,
        endpoint=f"10.0.0.{len(name)}:50052",
        index=0,
        description="test worker",
        total=64 * GiB,
        free=int(free_gib * GiB),
        budget=None if budget_gib is None else int(budget_gib * GiB),
    )


# --- endpoints and binds --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "problem"),
    [
        ("192.168.1.20", "is not HOST:PORT"),
        (":50052", "is not HOST:PORT"),
        ("box:0", "port must be 1..65535"),
        ("box:http", "port must be 1..65535"),
        ("[::1]:50052", "IPv4 address or a host name"),
        ("fe80::1:50052", "IPv4 address or a host name"),
    ],
)
def test_an_endpoint_llama_cpp_cannot_use_is_refused_saying_why(
    endpoint: str, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        split_endpoint(endpoint)


def test_an_endpoint_splits_into_host_and_port() -> None:
    assert split_endpoint("gpu-box.lan:50052") == ("gpu-box.lan", 50052)


@pytest.mark.parametrize(
    ("host", "exposed"),
    [
        ("127.0.0.1", False),
        ("localhost", False),
        ("192.168.1.20", False),
        ("10.1.2.3", False),
        ("172.16.0.9", False),
        ("169.254.3.4", False),
        ("0.0.0.0", True),
        ("8.8.8.8", True),
        ("1.1.1.1", True),
    ],
)
def test_only_loopback_and_private_addresses_count_as_safe_binds(host: str, exposed: bool) -> None:
    assert bool(public_bind(host)) is exposed


def test_the_worker_command_refuses_a_public_bind_without_the_flag() -> None:
    result = CliRunner().invoke(cli, ["worker", "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert "refusing to listen on 0.0.0.0" in result.output
    assert "no authentication" in result.output and "--allow-public" in result.output
    v6 = CliRunner().invoke(cli, ["worker", "--host", "::1"])
    assert v6.exit_code == 2 and "IPv4 address or a host name" in v6.output


def test_the_worker_command_says_when_its_port_is_taken() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        result = CliRunner().invoke(cli, ["worker", "--port", str(port)])
    assert result.exit_code == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.output and "--port" in result.output


# --- probing --------------------------------------------------------------------------------


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A port that accepts connections and never says a word (like a worker busy with another
    client, or something that is no worker at all)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield int(srv.getsockname()[1])
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()


def test_a_worker_nobody_listens_for_is_unreachable_at_once() -> None:
    st = probe("gone", f"127.0.0.1:{free_port()}", 2.0)
    assert not st.reachable
    assert st.reason.startswith("unreachable (") and "within 2 s" in st.reason
    assert st.probe_ms < 2000


def test_a_port_that_never_answers_the_handshake_times_out_instead_of_hanging(
    silent_listener: int,
) -> None:
    st = probe("mute", f"127.0.0.1:{silent_listener}", 0.5)
    assert not st.reachable
    assert "no RPC handshake within" in st.reason and "busy" in st.reason
    assert st.probe_ms < 10_000


def test_reachable_workers_become_planner_devices_with_their_budget() -> None:
    from homespec.workers import WorkerStatus

    dev = {"name": "RPC0", "description": "h:1", "kind": "gpu", "free": 8 * GiB, "total": 9 * GiB}
    found = {
        "a": WorkerStatus("a", "h:1", True, devices=(dev, dev)),
        "b": WorkerStatus("b", "h:2", False, reason="unreachable"),
    }
    rs = remotes(found, {"a": "2GiB", "b": None})
    assert [r.device for r in rs] == ["rpc:a:0", "rpc:a:1"]
    assert all(r.budget == 2 * GiB and r.free == 8 * GiB for r in rs)


# --- the plan ---------------------------------------------------------------------------------


def test_layers_are_placed_the_way_llama_cpp_assigns_them() -> None:
    # 4 repeating layers + the output; two devices take 1 and 2: the output is offloaded first.
    assert layer_devices(4, [("a", 1), ("b", 2)]) == [RAM, RAM, "a", "b", "b"]
    assert layer_devices(4, []) == [RAM] * 5
    assert layer_devices(4, [("a", 9)]) == ["a"] * 5


def test_the_target_spreads_over_this_box_and_its_workers_by_usable_memory() -> None:
    machine = box(6)  # 6 GiB of RAM free here, two workers with budgets
    machine = machine.__class__(
        **{**machine.__dict__, "remotes": (remote("a", 30, budget_gib=4), remote("b", 30, 3))}
    )
    req = request("ngram", n_ctx=4096, remote_devices=("rpc:a:0", "rpc:b:0"))
    p = plan_pair(req, machine)
    assert p.rung == "split" and not p.degraded
    layers = dict(p.arrangement.remote)
    # the worker with the larger budget takes more layers; this box keeps the first ones
    assert layers["rpc:a:0"] > layers["rpc:b:0"] > 0
    assert sum(layers.values()) < 33
    assert "split over" in p.reason and "in RAM of 33 layers" in p.reason
    uses = {u.device: u for u in p.devices}
    assert set(uses) == {RAM, "rpc:a:0", "rpc:b:0"} and all(u.fits for u in uses.values())
    # every layer's weights are somewhere, once
    total = sum(u.target_weights for u in uses.values())
    assert total == (32 * 200 + 500 + 500) * MiB


def test_the_draft_stays_on_this_box() -> None:
    machine = box(12)
    machine = machine.__class__(**{**machine.__dict__, "remotes": (remote("a", 30, 6),)})
    p = plan_pair(request(n_ctx=4096, remote_devices=("rpc:a:0",)), machine)
    assert p.rung == "split" and p.mode == "speculative"
    a = next(u for u in p.devices if u.device == "rpc:a:0")
    assert a.draft_weights == 0 and a.draft_kv == 0
    assert "draft here, in RAM" in p.reason


def test_with_a_gpu_here_it_takes_the_output_and_its_share_and_the_draft_goes_there_first() -> None:
    machine = box(16, gpu_gib=10)
    machine = machine.__class__(**{**machine.__dict__, "remotes": (remote("a", 30, 8),)})
    p = plan_pair(request(n_ctx=4096, remote_devices=("rpc:a:0",)), machine)
    a = p.arrangement
    assert p.rung == "split" and a.gpu == "cuda0" and a.draft_gpu_layers != 0
    assert a.target_gpu_layers > 0 and dict(a.remote)["rpc:a:0"] > 0
    assert a.target_gpu_layers + dict(a.remote)["rpc:a:0"] == 33  # nothing left in RAM
    uses = {u.device: u for u in p.devices}
    assert uses["cuda0"].draft_weights > 0 and "draft here, on cuda0" in p.reason
    # llama.cpp's order: RPC devices first, the local GPU last, so it holds the output layer
    split = evaluate(request(n_ctx=4096), machine, a)
    gpu = next(u for u in split if u.device == "cuda0")
    assert gpu.target_weights == ((a.target_gpu_layers - 1) * 200 + 500) * MiB
    # a GPU too small for the draft beside its share: the draft goes to RAM, still split
    tight = plan_pair(
        request(n_ctx=4096, remote_devices=("rpc:a:0",)),
        replace(machine, gpus=(replace(machine.gpus[0], free=int(4 * GiB)),)),
    )
    assert tight.rung == "split" and tight.arrangement.draft_gpu_layers == 0, tight.reason
    assert "draft here, in RAM" in tight.reason


def test_a_worker_short_of_memory_is_named_with_the_missing_mib() -> None:
    machine = box(2)
    machine = machine.__class__(
        **{**machine.__dict__, "remotes": (remote("a", 30, 1), remote("b", 30, 1))}
    )
    p = plan_pair(request("plain", n_ctx=4096, remote_devices=("rpc:a:0", "rpc:b:0")), machine)
    assert not p.runnable
    assert "rpc:a:0 needs" in p.reason and "rpc:b:0 needs" in p.reason
    assert "MiB short" in p.reason or "GiB short" in p.reason
    assert "nor on this box alone" in p.reason
    first = evaluate(request("plain", n_ctx=4096), machine, p.arrangement)
    assert first  # the refused plan still carries a per-device table


def test_an_unreachable_worker_is_a_reason_in_the_plan_and_the_pair_runs_without_it(
    tmp_path: Path,
) -> None:
    from homespec.pairs import PairFiles, plan

    path = tmp_path / "models.toml"
    path.write_text(
        '[models.t]\npath = "t.gguf"\n[workers.gone]\nendpoint = "127.0.0.1:9"\n'
        '[pairs.p]\ntarget = "t"\ndraft = "ngram"\ntarget_workers = ["gone"]\n'
    )
    manifest = load_manifest(path)
    machine = box(16)
    machine = machine.__class__(
        **{**machine.__dict__, "workers_down": {"gone": "unreachable (Connection refused)"}}
    )
    p = plan(manifest, PairFiles("p", TARGET, None), machine)
    assert p.runnable and p.degraded and p.workers_down == ("gone",)
    assert p.reason.startswith("worker gone (127.0.0.1:9) unreachable (Connection refused): ")
    assert p.summary()["workers_down"] == ["gone"]


# --- models.toml ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("snippet", "message"),
    [
        ('[workers.a]\nendpoint = "nohost"\n', "is not HOST:PORT"),
        ('[workers.a]\nendpoint = "h:1"\nbudget = "lots"\n', "budget"),
        ('[workers.a]\nendpoint = "h:1"\nport = 3\n', "port"),
    ],
)
def test_a_bad_worker_table_names_the_worker_and_the_field(
    tmp_path: Path, snippet: str, message: str
) -> None:
    path = tmp_path / "models.toml"
    path.write_text(
        f'[pairs.p]\ntarget = "t"\ndraft = "ngram"\n[models.t]\npath = "t.gguf"\n{snippet}'
    )
    with pytest.raises(ConfigError) as exc:
        load_manifest(path)
    assert "workers.a" in str(exc.value) and message in str(exc.value)


def test_a_pair_naming_an_unknown_worker_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(
        '[pairs.p]\ntarget = "t"\ndraft = "ngram"\ntarget_workers = ["nope"]\n'
        '[models.t]\npath = "t.gguf"\n'
    )
    with pytest.raises(ConfigError, match=r"pairs\.p\.target_workers: no worker named 'nope'"):
        load_manifest(path)


# --- the daemon's re-plan decision --------------------------------------------------------------


def test_a_pair_is_re_planned_only_once_every_missing_worker_answers() -> None:
    assert rpc_watch.decide(("a", "b"), {"a": True, "b": False}) == ""
    assert rpc_watch.decide(("a", "b"), {"a": True}) == ""
    assert rpc_watch.decide(("a", "b"), {"a": True, "b": True}) == "worker a, b answers again"
    assert rpc_watch.decide((), {}) == ""
