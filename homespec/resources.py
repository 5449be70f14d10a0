"""What memory this machine has for homespec: RAM (and the cgroup limit), GPUs, llama.cpp backends.

Probing never blocks startup and never raises: a missing NVIDIA driver is "no GPU", noted once in
`Machine.notes`. Everything here is a plain value, so the planner can be tested with any machine
written by hand (see tests/test_planner.py).

Budgets cap what homespec may plan to use on a device, for users who keep memory for other
services (and for tests): `[memory] budget = { ram = "6GiB", cuda0 = "7GiB" }` in models.toml, or
`HOMESPEC_MEMORY_BUDGET="ram=6GiB,cuda0=7GiB"`, which wins per device.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil

from homespec.errors import ConfigError
from homespec.sizes import GiB, parse_size

LOG = logging.getLogger("homespec.resources")
BUDGET_ENV = "HOMESPEC_MEMORY_BUDGET"
RAM = "ram"
# cgroup v1 reports "no limit" as a huge page-rounded number.
_NO_LIMIT = 2**60


@dataclass(frozen=True)
class Ram:
    total: int
    available: int
    cgroup_limit: int | None = None  # the process's memory cgroup limit (systemd MemoryMax=)
    cgroup_used: int | None = None  # charged to that cgroup, minus reclaimable file cache

    @property
    def free(self) -> int:
        """What a new allocation can take: available RAM, or less under a cgroup limit."""
        if self.cgroup_limit is None:
            return self.available
        return max(0, min(self.available, self.cgroup_limit - (self.cgroup_used or 0)))


@dataclass(frozen=True)
class Gpu:
    device: str  # "cuda0", "cuda1", "metal"
    name: str
    total: int
    free: int
    unified: bool = False  # Metal: allocations come out of system RAM too


@dataclass(frozen=True)
class Remote:
    """One device of an RPC worker (`homespec worker` on another box), as the planner sees it."""

    device: str  # "rpc:NAME:INDEX"
    worker: str
    endpoint: str
    index: int
    description: str
    total: int
    free: int
    budget: int | None = None  # [workers.NAME] budget: the most homespec plans here


@dataclass(frozen=True)
class Machine:
    ram: Ram
    gpus: tuple[Gpu, ...] = ()
    backends: tuple[str, ...] = ("CPU",)
    gpu_offload: bool = False  # this llama.cpp build can put layers on a GPU
    cpu_threads: int = 1
    budgets: Mapping[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    remotes: tuple[Remote, ...] = ()  # reachable RPC workers' devices
    workers_down: Mapping[str, str] = field(default_factory=dict)  # worker name → why not usable
    # Linux transparent huge pages: "always", "madvise" or "never"; None where there are none
    thp: str | None = None

    @property
    def usable_gpus(self) -> tuple[Gpu, ...]:
        """GPUs the planner may use: found, and the llama.cpp build can offload to them."""
        return self.gpus if self.gpu_offload else ()

    def free(self, device: str, reserve: int = 0) -> int:
        """What homespec may plan to use on `device`: free memory less `reserve` (left for the
        OS and drivers), capped by the device's budget."""
        remote = next((r for r in self.remotes if r.device == device), None)
        if device == RAM:
            free = self.ram.free
        elif remote is not None:
            free = remote.free
        else:
            free = next((g.free for g in self.gpus if g.device == device), 0)
        free = max(0, free - reserve)
        budget = self.budgets.get(device, remote.budget if remote else None)
        return free if budget is None else min(free, budget)

    def with_budgets(self, budgets: Mapping[str, int]) -> Machine:
        """Caps added per device; where a cap already exists the tighter one stays."""
        merged = dict(self.budgets)
        for device, cap in budgets.items():
            merged[device] = min(cap, merged.get(device, cap))
        return replace(self, budgets=merged)

    def minus(self, used: Mapping[str, int]) -> Machine:
        """This machine with `used` bytes per device already taken (by pairs loaded earlier in
        the same process): less free RAM and VRAM, and less left of each budget."""
        ram_used = used.get(RAM, 0)
        ram = replace(
            self.ram,
            available=max(0, self.ram.available - ram_used),
            cgroup_used=None
            if self.ram.cgroup_limit is None
            else (self.ram.cgroup_used or 0) + ram_used,
        )
        gpus = tuple(replace(g, free=max(0, g.free - used.get(g.device, 0))) for g in self.gpus)
        budgets = {d: max(0, b - used.get(d, 0)) for d, b in self.budgets.items()}
        remotes = tuple(
            replace(
                r,
                free=max(0, r.free - used.get(r.device, 0)),
                budget=None if r.budget is None else max(0, r.budget - used.get(r.device, 0)),
            )
            for r in self.remotes
        )
        return replace(self, ram=ram, gpus=gpus, budgets=budgets, remotes=remotes)


# --- RAM and cgroups ---------------------------------------------------------------------------


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _inactive_file(stat: Path) -> int:
    try:
        for line in stat.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key in ("inactive_file", "total_inactive_file"):
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def cgroup_memory(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> tuple[int | None, int | None]:
    """(limit, used) of the tightest memory cgroup above this process, v2 or v1; (None, None)
    when there is no limit. `used` leaves out inactive file cache, which the kernel reclaims
    before it OOM-kills."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None, None
    best: tuple[int, int] | None = None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if controllers == "":  # v2 unified hierarchy
            base, limit_file, used_file = root, "memory.max", "memory.current"
            if not (root / "cgroup.controllers").exists() and (root / "unified").is_dir():
                base = root / "unified"
        elif "memory" in controllers.split(","):
            base, limit_file, used_file = (
                root / "memory",
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        else:
            continue
        leaf = base / rel.lstrip("/")
        if not leaf.is_dir():  # a container sees its own cgroup as the mount's root
            leaf = base
        for d in [leaf, *leaf.parents]:
            limit = _read_int(d / limit_file)
            if limit is not None and limit < _NO_LIMIT:
                used = _read_int(d / used_file) or 0
                used = max(0, used - _inactive_file(d / "memory.stat"))
                if best is None or limit - used < best[0] - best[1]:
                    best = (limit, used)
            if d == base:
                break
    return best if best is not None else (None, None)


def probe_ram() -> Ram:
    vm = psutil.virtual_memory()
    limit, used = cgroup_memory()
    return Ram(total=vm.total, available=vm.available, cgroup_limit=limit, cgroup_used=used)


# --- GPUs --------------------------------------------------------------------------------------


def probe_cuda() -> tuple[list[Gpu], str]:
    """NVIDIA GPUs via NVML (nvidia-ml-py): ([gpus], note). Never raises."""
    try:
        import pynvml
    except ImportError:
        return [], "no GPU probe: nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [], f"no NVIDIA GPU ({exc})"
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else str(name)
            gpus.append(Gpu(f"cuda{i}", name, int(mem.total), int(mem.free)))
        return gpus, ""
    except pynvml.NVMLError as exc:
        return [], f"NVIDIA GPU probe failed ({exc})"
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def cuda_used() -> dict[str, int]:
    """Used memory per NVIDIA GPU (for measuring a load); {} without NVML."""
    gpus, _ = probe_cuda()
    return {g.device: g.total - g.free for g in gpus}


def cuda_used_by(pid: int) -> dict[str, int]:
    """GPU memory one process holds, per NVIDIA GPU, where NVML reports it (a container may
    hide other namespaces' pids); {} without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except (ImportError, pynvml.NVMLError):
        return {}
    used: dict[str, int] = {}
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == pid and proc.usedGpuMemory:
                    used[f"cuda{i}"] = used.get(f"cuda{i}", 0) + int(proc.usedGpuMemory)
    except pynvml.NVMLError:
        pass
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    return used


def held(planned: dict[str, int], measured: dict[str, int]) -> dict[str, int]:
    """What a loaded pair holds per device: its plan, or what its process was measured to
    hold where that is more (the planner plans the next pair around this)."""
    return {d: max(planned.get(d, 0), measured.get(d, 0)) for d in {*planned, *measured}}


def probe_metal(ram: Ram) -> tuple[list[Gpu], str]:
    """Apple silicon: the GPU shares RAM up to a working-set limit. macOS does not expose the
    limit without Metal itself; homespec reads `sysctl iogpu.wired_limit_mb` when the user set it,
    else uses Apple's usual default (about 2/3 of RAM up to 36 GiB, 3/4 above)."""
    if platform.system() != "Darwin" or platform.machine() != "arm64":
        return [], ""
    limit = 0
    try:
        out = subprocess.run(
            ["sysctl", "-n", "iogpu.wired_limit_mb"], capture_output=True, text=True, timeout=2
        )
        limit = int(out.stdout.strip() or 0) * 1024**2
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    if limit <= 0:
        limit = ram.total * 2 // 3 if ram.total <= 36 * GiB else ram.total * 3 // 4
    return [Gpu("metal", "Apple GPU (unified memory)", limit, min(limit, ram.free), True)], ""


def parse_backends(system_info: str) -> tuple[str, ...]:
    """Backend names from llama.cpp's system info ("CPU : SSE3 = 1 | ... | CUDA : ARCHS = ...")."""
    return tuple(dict.fromkeys(re.findall(r"(?:^|\|\s*)([A-Za-z][\w-]*) : ", system_info)))


THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def probe_thp(path: Path = THP_SETTING) -> str | None:
    """The system's transparent huge page setting ("always [madvise] never" → "madvise"), None
    where the file is missing (not Linux, or a kernel without them)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    chosen = re.search(r"\[(\w+)\]", text)
    return chosen.group(1) if chosen else None


def probe_machine(
    *,
    backend_info: Callable[[], tuple[str, bool]] | None = None,
    ram: Callable[[], Ram] = probe_ram,
    cuda: Callable[[], tuple[list[Gpu], str]] = probe_cuda,
) -> Machine:
    """Probe everything. `backend_info` returns (llama.cpp system info, supports GPU offload);
    the CLI passes the engine's, so this module never imports llama_cpp itself."""
    notes: list[str] = []
    r = ram()
    info, offload = backend_info() if backend_info else ("CPU : ", False)
    gpus, note = cuda()
    if note:
        notes.append(note)
    metal, note = probe_metal(r)
    gpus += metal
    if gpus and not offload:
        notes.append(
            "a GPU is present but this llama.cpp build cannot offload to it: reinstall with "
            "HOMESPEC_BACKEND=cuda (or metal) ./scripts/install.sh"
        )
    return Machine(
        ram=r,
        gpus=tuple(gpus),
        backends=parse_backends(info) or ("CPU",),
        gpu_offload=offload,
        cpu_threads=psutil.cpu_count(logical=True) or os.cpu_count() or 1,
        notes=tuple(notes),
        thp=probe_thp(),
    )


# --- budgets -----------------------------------------------------------------------------------


def parse_budget(text: str, origin: str) -> dict[str, int]:
    """'ram=1.5GiB,cuda0=7GiB' → {device: bytes}. `origin` names where the text came from."""
    budgets: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        device, sep, size = part.partition("=")
        device = device.strip().lower()
        if not sep or not re.fullmatch(r"ram|cuda\d+|metal", device):
            raise ConfigError(
                f"{origin}: {part!r} is not DEVICE=SIZE",
                "write e.g. ram=6GiB,cuda0=7GiB (devices: ram, cudaN, metal)",
            )
        try:
            budgets[device] = parse_size(size)
        except ValueError as exc:
            raise ConfigError(f"{origin}: {device}: {exc}", "fix the size") from None
    return budgets


def budgets_from(manifest_budget: Mapping[str, str], manifest_origin: str) -> dict[str, int]:
    """The manifest's budgets, overridden per device by $HOMESPEC_MEMORY_BUDGET."""
    text = ",".join(f"{k}={v}" for k, v in manifest_budget.items())
    budgets = parse_budget(text, f"{manifest_origin}: memory.budget")
    env = os.environ.get(BUDGET_ENV, "")
    budgets.update(parse_budget(env, f"${BUDGET_ENV}"))
    return budgets
