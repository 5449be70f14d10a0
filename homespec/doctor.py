"""`homespec doctor`: the machine, every pair's files, compatibility and memory plan, in one report.

`collect()` builds the report as plain data (what `--json` prints); `render()` turns it into text.
Nothing here loads a model unless asked to measure (`measure()`, `doctor --measure`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from gguf import LlamaFileType

from homespec.engine import flash, repack
from homespec.errors import EngineError, HomespecError
from homespec.gguf_meta import GGUFInfo, compatibility_problems, read_gguf
from homespec.manifest import NGRAM, NO_DRAFT, Manifest
from homespec.pairs import inspect_pair, plan
from homespec.plan_types import PairPlan
from homespec.planner import cpu_only
from homespec.resources import Machine
from homespec.sizes import fmt_size
from homespec.workers import public_bind, split_endpoint

OK, DEGRADED, BROKEN = 0, 1, 2
STATUS = {OK: "ok", DEGRADED: "degraded", BROKEN: "cannot run"}


def quant_name(file_type: int | None) -> str:
    if file_type is None:
        return "?"
    try:
        return LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        return f"type {file_type}"


def model_facts(info: GGUFInfo) -> dict[str, Any]:
    return {
        "path": str(info.path),
        "architecture": info.architecture,
        "name": info.name,
        "params": info.n_params,
        "quantization": quant_name(info.file_type),
        "size": info.tensor_bytes,
        "trained_context": info.context_length,
        "layers": info.block_count,
        "vocab": info.vocab_size,
    }


@dataclass
class PairReport:
    name: str
    status: int = OK
    models: dict[str, dict[str, Any]] = field(default_factory=dict)  # role -> facts or error
    compatibility: list[str] = field(default_factory=list)
    error: str = ""
    plan: PairPlan | None = None
    measured: list[dict[str, Any]] = field(default_factory=list)
    costs: dict[str, Any] = field(default_factory=dict)  # calibrated (doctor --measure)
    # Declared but never set up (`homespec setup` gets its files); `required`: the default
    # pair, one the daemon serves, or one named with --pair, whose absence is an error.
    not_set_up: bool = False
    required: bool = True
    # Where the pair runs on the CPU only: flash attention and batch size (engine/flash.py)
    cpu_attention: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": STATUS[self.status],
            "models": self.models,
            "compatibility": self.compatibility,
            "error": self.error,
            "plan": self.plan.to_dict() if self.plan else None,
            "measured": self.measured,
            "costs": self.costs or None,
            "not_set_up": self.not_set_up,
            "cpu_attention": self.cpu_attention or None,
        }


def _check_models(manifest: Manifest, report: PairReport) -> None:
    """Read each model's metadata on its own, so every bad file gets its own line."""
    _, pair = manifest.pair(report.name)
    infos: dict[str, GGUFInfo] = {}
    roles = [("target", pair.target)]
    if pair.draft not in (NGRAM, NO_DRAFT):
        roles.append(("draft", pair.draft))
    for role, model in roles:
        try:
            info = read_gguf(manifest.require_model_file(model, report.name))
        except HomespecError as err:
            report.models[role] = {"model": model, "error": str(err)}
            continue
        infos[role] = info
        report.models[role] = {"model": model, **model_facts(info)}
    if len(infos) == 2:
        report.compatibility = compatibility_problems(infos["target"], infos["draft"])


def check_pair(
    manifest: Manifest, name: str, machine: Machine, *, required: bool = True
) -> PairReport:
    report = PairReport(name, required=required)
    if manifest.not_set_up(name):
        report.not_set_up = True
        report.status = BROKEN if required else OK
        report.error = f"not set up — homespec setup --pair {name}"
        return report
    _check_models(manifest, report)
    try:
        files = inspect_pair(manifest, name)
        report.plan = plan(manifest, files, machine, kept=True)  # as the daemon plans it
    except HomespecError as err:
        report.status, report.error = BROKEN, str(err)
        return report
    _, pair = manifest.pair(name)
    if report.plan.runnable and cpu_only(report.plan.arrangement):
        target = manifest.require_model_file(pair.target, name)
        report.cpu_attention = flash.describe(pair.flash_attn, target)
    if not report.plan.runnable:
        report.status = BROKEN
    elif report.plan.degraded:
        report.status = DEGRADED
    return report


def canary(manifest: Manifest, report: PairReport) -> None:
    """Each model's first decode in a throwaway process (engine/repack.py), unless this machine
    and llama.cpp build already have a verdict for it: whether the model may load with
    repacked weights here, or crashes outright."""
    if report.plan is None or not report.plan.runnable:
        return
    _, pair = manifest.pair(report.name)
    a = report.plan.arrangement
    layers = {
        "target": (pair.target, a.target_gpu_layers),
        "draft": (pair.draft, a.draft_gpu_layers),
    }
    for role, facts in report.models.items():
        model, gpu_layers = layers[role]
        if "error" in facts or gpu_layers is None:
            continue
        override = manifest.spec.models[model].repack
        try:
            v = repack.verdict(model, Path(facts["path"]), gpu_layers=gpu_layers, override=override)
        except EngineError as err:
            facts["canary"] = {"error": str(err)}
            report.status = max(report.status, BROKEN if role == "target" else DEGRADED)
            continue
        facts["canary"] = {"repack": v.repack, "source": v.source, "note": v.note or None}


def _canary_line(role: str, c: dict[str, Any]) -> str:
    if "error" in c:
        return f"  canary  {role}: {c['error']}"
    how = "repacked weights" if c["repack"] else "without repacking"
    if c["note"]:
        return f"  canary  {role}: {how}: {c['note']} ({c['source']})"
    if c["source"].startswith("unchecked"):
        return f"  canary  {role}: not run ({c['source'].removeprefix('unchecked: ')})"
    return f"  canary  {role}: first decode ok, {how} ({c['source']})"


def machine_dict(m: Machine) -> dict[str, Any]:
    return {
        "backends": list(m.backends),
        "gpu_offload": m.gpu_offload,
        "gpus": [
            {"device": g.device, "name": g.name, "total": g.total, "free": g.free} for g in m.gpus
        ],
        "ram": {
            "total": m.ram.total,
            "available": m.ram.available,
            "cgroup_limit": m.ram.cgroup_limit,
            "cgroup_used": m.ram.cgroup_used,
        },
        "budgets": dict(m.budgets),
        "workers": {
            "devices": [
                {
                    "device": r.device,
                    "worker": r.worker,
                    "endpoint": r.endpoint,
                    "total": r.total,
                    "free": r.free,
                    "budget": r.budget,
                }
                for r in m.remotes
            ],
            "down": dict(m.workers_down),
        },
        "cpu_threads": m.cpu_threads,
        "transparent_huge_pages": m.thp,
        "notes": list(m.notes),
    }


def exit_code(reports: list[PairReport]) -> int:
    """An optional pair that was never set up is not a failure."""
    return max((r.status for r in reports if r.required or not r.not_set_up), default=OK)


def required_pairs(manifest: Manifest, named: list[str]) -> set[str]:
    """Pairs whose trouble sets doctor's exit code: those named with --pair, else the default
    pair and the ones the daemon serves."""
    if named:
        return set(named)
    return {manifest.default_pair, *manifest.spec.server.pairs}


# --- text ----------------------------------------------------------------------------------------


def render_machine(m: Machine) -> list[str]:
    ram = m.ram
    lines = [
        "machine",
        f"  llama.cpp backends  {', '.join(m.backends)}"
        + ("" if m.gpu_offload else " (no GPU offload in this build)"),
        f"  RAM                 {fmt_size(ram.total)} total, {fmt_size(ram.available)} available",
    ]
    if ram.cgroup_limit is not None:
        lines.append(
            f"  cgroup limit        {fmt_size(ram.cgroup_limit)} "
            f"({fmt_size(ram.cgroup_used or 0)} used by this cgroup)"
        )
    else:
        lines.append("  cgroup limit        none")
    for g in m.gpus:
        lines.append(
            f"  {g.device:<19} {g.name}: {fmt_size(g.total)} total, {fmt_size(g.free)} free"
        )
    if not m.gpus:
        lines.append("  GPUs                none")
    for device, budget in sorted(m.budgets.items()):
        lines.append(f"  budget {device:<12} {fmt_size(budget)} (homespec plans no more there)")
    lines.append(f"  CPU threads         {m.cpu_threads}")
    if m.thp is not None:
        lines.append(f"  huge pages          transparent, {m.thp}")
    lines += [f"  note: {n}" for n in m.notes]
    return lines


def _llama_version() -> str:
    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        return "?"


def render_workers(manifest: Manifest, m: Machine) -> list[str]:
    """The RPC workers models.toml declares: reachable or why not, devices, memory, exposure."""
    if not manifest.spec.workers:
        return []
    lines = [
        "workers (`homespec worker` on each box; llama.cpp's RPC from llama-cpp-python "
        f"{_llama_version()}: a worker answers only when it speaks the same protocol version)"
    ]
    for name, spec in sorted(manifest.spec.workers.items()):
        devices = [r for r in m.remotes if r.worker == name]
        if not devices:
            why = m.workers_down.get(name, "not probed")
            lines.append(f"  {name:<19} {spec.endpoint}: DOWN: {why}")
        for r in devices:
            cap = f", budget {fmt_size(r.budget)}" if r.budget is not None else ""
            lines.append(
                f"  {r.device:<19} {spec.endpoint}: {fmt_size(r.total)} total, "
                f"{fmt_size(r.free)} free{cap}"
            )
        exposed = public_bind(split_endpoint(spec.endpoint)[0])
        if exposed:
            lines.append(
                f"  {'':<19} WARNING: {exposed}: llama.cpp's RPC has no authentication; keep "
                "workers on loopback or a private network"
            )
    lines.append("  note: a CPU worker reports its whole RAM as free (llama.cpp): give it a budget")
    return lines


def _model_line(role: str, facts: dict[str, Any]) -> str:
    if "error" in facts:
        return f"  {role:<7} {facts['model']}: {facts['error']}"
    return (
        f"  {role:<7} {facts['model']}: {facts['architecture']}, "
        f"{facts['params'] / 1e6:,.0f}M params, {facts['quantization']}, "
        f"{fmt_size(facts['size'])}, trained context {facts['trained_context']:,}"
    )


def render_plan_table(p: PairPlan) -> list[str]:
    cols = (
        "target_weights",
        "target_kv",
        "draft_weights",
        "draft_kv",
        "compute",
        "runtime",
        "margin",
    )
    head = ["device", "tgt weights", "tgt KV", "draft wts", "draft KV", "compute", "runtime"]
    head += ["margin"]
    head += ["need", "usable", ""]
    rows = [head]
    for d in p.devices:
        dd = d.to_dict()
        rows.append(
            [
                d.device,
                *(fmt_size(dd[c]) if dd[c] else "—" for c in cols),
                fmt_size(d.need),
                fmt_size(d.free),
                "fits" if d.fits else "SHORT",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = []
    for r in rows:
        pairs = enumerate(zip(r, widths, strict=True))
        cells = [c.rjust(w) if i else c.ljust(w) for i, (c, w) in pairs]
        lines.append(("    " + "  ".join(cells)).rstrip())
    return lines


# A draft model whose batch decodes cost per token this share of the target's or more catches up
# dearly (a catch-up: decoding the prompt, or a stretch lookup committed, before it drafts)
DEAR_CATCH_UP = 0.5


def own_work(costs: dict[str, Any]) -> str:
    """What a step costs beyond its decodes, by what it ran, and a plain step's share of a
    one-token decode: on a GPU's 1-ms decodes it is what decides whether drafting can pay
    (governor.step_ms, settled)."""
    own = costs.get("step_overhead_ms") or {}
    parts = [f"{name} {ms:.2f} ms" for name, ms in own.items()]
    one = (costs.get("verify_ms") or {}).get("1")
    if "plain" in own and one:
        parts[list(own).index("plain")] += f" ({own['plain'] / one:.0%} of a one-token decode)"
    return ", ".join(parts)


def catch_up_note(costs: dict[str, Any], draft_type: str) -> str | None:
    """What the draft model's catch-ups cost where that keeps it off answers, from the
    largest decode both curves measured; None where it catches up cheaply (a GPU, or a
    draft type with fast batch kernels, or a draft that copies the target's cache)."""
    if costs.get("copy_ms_per_token") is not None:
        return None
    verify = {int(n): float(ms) for n, ms in costs.get("verify_ms", {}).items()}
    draft = {int(n): float(ms) for n, ms in (costs.get("draft_ms") or {}).items()}
    sizes = sorted(n for n in set(verify) & set(draft) if n > 1)
    if not sizes or verify[sizes[-1]] <= 0:
        return None
    n = sizes[-1]
    ratio = draft[n] / verify[n]
    if ratio < DEAR_CATCH_UP:
        return None
    return (
        f"the draft model catches up at {draft[n] / n:.1f} ms a token, {ratio:.2f}× the "
        f"target's ({n}-token decodes): the governor leaves it out of answers too short to "
        f"repay decoding their prompt. Its {draft_type} weights may have no fast batch "
        "kernel where it runs, another type may (README: a draft that catches up dearly)"
    )


def render_pair(r: PairReport) -> list[str]:
    if r.not_set_up:
        needed = "" if not r.required else " (needed: default pair, served, or named)"
        return [f"pair {r.name}: {r.error}{needed}"]
    lines = [f"pair {r.name}: {STATUS[r.status]}"]
    lines += [_model_line(role, facts) for role, facts in r.models.items()]
    if "draft" in r.models:
        lines.append(
            "  pair    compatible (llama.cpp's draft rules)"
            if not r.compatibility and "error" not in r.models["draft"]
            else "  pair    " + "; ".join(r.compatibility or ["not checked (a file is bad)"])
        )
    lines += [_canary_line(role, f["canary"]) for role, f in r.models.items() if "canary" in f]
    if r.error:
        lines.append(f"  error   {r.error}")
    if r.plan is not None:
        a = r.plan.arrangement
        lines.append(f"  memory  (context {a.n_ctx} tokens)")
        lines += render_plan_table(r.plan)
        lines.append(f"  plan    {a.rung} → {a.mode}: {r.plan.reason}")
        if r.cpu_attention:
            lines.append(f"  cpu     {r.cpu_attention}")
        lines += [f"  note    {n}" for n in r.plan.notes]
        if r.plan.huge_pages:
            lines.append(
                "  pages   served, the weights in RAM are read into 2 MiB pages (huge_pages): "
                "faster decoding, a longer load"
            )
    if r.measured:
        lines.append("  measured (peak, after filling the context once)")
        lines += ["    " + line for line in render_memory(r.measured).splitlines()]
    if r.costs:
        curve = ", ".join(f"{n}→{ms:g}" for n, ms in r.costs["verify_ms"].items())
        draft = r.costs.get("draft_ms") or {}
        lines.append(f"  costs   one target decode, ms by tokens in it: {curve}")
        if draft:
            batches = ", ".join(f"{n}→{ms:g}" for n, ms in draft.items())
            lines.append(f"          one draft-model decode, ms by tokens in it: {batches}")
        if r.costs.get("draft_agreement") is not None:
            agree = r.costs["draft_agreement"]
            lines.append(
                f"          the draft model agrees with the target on {agree:.0%} of next tokens"
            )
        if r.costs.get("draft_catch_up"):
            lines.append(f"          the draft model {r.costs['draft_catch_up']}")
        if r.costs.get("step_overhead_ms"):
            lines.append(
                f"          homespec's own work a step beyond its decodes: {own_work(r.costs)}"
            )
        draft_type = r.models.get("draft", {}).get("quantization", "")
        if note := catch_up_note(r.costs, draft_type):
            lines.append(f"  note    {note}")
    return lines


def render_memory(rows: list[dict[str, Any]]) -> str:
    """A small table: each loaded model's predicted and measured peak memory per device."""
    lines = ["model   device   predicted    measured   error"]
    for r in rows:
        lines.append(
            f"{r['role']:<7} {r['device']:<6} {fmt_size(r['predicted']):>11} "
            f"{fmt_size(r['measured']):>11} {r['error']:>+7.1%}"
        )
    return "\n".join(lines)


def render(machine: Machine, reports: list[PairReport], manifest: Manifest) -> str:
    lines = render_machine(machine)
    workers = render_workers(manifest, machine)
    if workers:
        lines += ["", *workers]
    for r in reports:
        lines += ["", *render_pair(r)]
    code = exit_code(reports)
    lines += ["", f"doctor: {STATUS[code]}" + ("" if code == OK else f" (exit {code})")]
    return "\n".join(lines)


def measure(manifest: Manifest, report: PairReport) -> None:
    """Load the pair per its plan in a fresh process, fill each context once, and record
    predicted vs measured memory. A fresh process because an allocator keeps freed memory: a
    second load in the same process reuses it and would measure too little."""
    if report.plan is None or not report.plan.runnable:
        return
    cmd = [sys.executable, "-m", "homespec.memcheck", str(manifest.path), report.name]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        report.error = f"measuring failed (exit {done.returncode}): {tail}"
        report.status = BROKEN
        return
    found = json.loads(done.stdout)
    report.measured, report.costs = found["memory"], found["costs"]
