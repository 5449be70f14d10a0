"""`python -m homespec.memcheck MANIFEST PAIR`: load a pair, fill its contexts, and print as JSON
predicted vs measured memory and the governor's calibrated costs (ms of one target decode by
tokens in it, ms per draft-model token; ms of homespec's own work a step, from two short
answers). Run by `homespec doctor --measure` in a fresh process per pair."""

from __future__ import annotations

# llama.cpp's library must load before numpy's (a CUDA build crashed at model load otherwise).
import homespec.engine.llama_backend  # noqa: F401

# isort: split
import json
import sys
from typing import Any

from homespec.engine.calibration import calibrate, measure_steps
from homespec.engine.engine_info import costs_now
from homespec.engine.estimates import cost_report
from homespec.engine.loader import LoadedPair, load_pair
from homespec.manifest import load_manifest
from homespec.resources import RAM


def memory_rows(loaded: LoadedPair) -> list[dict[str, Any]]:
    """Predicted vs measured bytes per loaded model and device (after a peak measurement)."""
    out: list[dict[str, Any]] = []
    for check in loaded.memory:
        for device, measured in check.measured.items():
            predicted = check.predicted.get(device, 0)
            if device != RAM and not predicted:
                continue
            out.append(
                {
                    "role": check.role,
                    "device": device,
                    "predicted": predicted,
                    "measured": measured,
                    "error": (predicted - measured) / measured if measured else 0.0,
                }
            )
    return out


def main(argv: list[str]) -> int:
    manifest_path, pair = argv
    manifest = load_manifest(manifest_path)
    with load_pair(manifest, pair, measure_peak=True, huge_pages="now") as loaded:
        rows = memory_rows(loaded)
        rt = loaded.runtime
        calibrate(rt)
        verify, draft = dict(rt.ledger.verify.points), dict(rt.ledger.draft.points)
        measure_steps(rt)  # homespec's own work per step, after the decodes' costs are taken
        step_ms = costs_now(rt).step_ms
        costs = cost_report(
            verify,
            draft,
            rt.ledger.agreement,
            step_ms,
            rt.sharing.why,
            rt.ledger.copy_per_token,
        )
        print(json.dumps({"memory": rows, "costs": costs}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
