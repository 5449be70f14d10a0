"""What a pair's engine told the daemon about itself (`EngineInfo`), as `/homespec/status`
shows it: the plan, memory predicted and measured, the model files, the governor's costs as
the last request left them, the prompt cache's, the weights' repacking and huge pages."""

from __future__ import annotations

from typing import Any

from homespec.engine.estimates import cost_report
from homespec.engine.prompt_cache import cache_report
from homespec.engine.protocol import EngineInfo


def engine_report(info: EngineInfo) -> dict[str, Any]:
    plan = info.plan
    return {
        "plan": plan.summary(),
        "memory": {
            check.role: {"predicted": check.predicted, "measured_after_load": check.measured}
            for check in info.memory
        },
        "memory_planned": {
            d.device: {
                "target": d.target_weights + d.target_kv,
                "draft": d.draft_weights + d.draft_kv,
                "compute": d.compute,
                "total": d.need,
            }
            for d in plan.devices
        },
        "models": {
            "target": info.target_file,
            "draft": info.draft_file,
            "draft_loaded": info.draft_loaded,
            "load_ms": {role: round(ms) for role, ms in info.load_ms.items()},
        },
        "costs": cost_report(
            info.verify_ms,
            info.draft_ms,
            info.agreement,
            info.step_ms,
            info.catch_up,
            info.copy_per_token,
        ),
        "prompt_cache": cache_report(info.copy_ms, info.read_ms),
        "repack": {
            role: {"repack": v.repack, "source": v.source, "note": v.note or None}
            for role, v in info.repack.items()
        },
        "huge_pages": {role: s.to_dict() for role, s in info.pages.items()},
    }
