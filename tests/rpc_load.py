"""`python -m tests.rpc_load MANIFEST PAIR`: load a pair (its workers too) and fill its contexts
once, print the plan's per-device table as one JSON line, then hold the pair until stdin
closes, so a test can measure what the workers hold meanwhile."""

from __future__ import annotations

import homespec.engine.llama_backend  # noqa: F401  (llama.cpp before numpy)

# isort: split
import json
import sys

from homespec.engine.loader import load_pair
from homespec.manifest import load_manifest


def main(manifest_path: str, pair: str) -> None:
    with load_pair(load_manifest(manifest_path), pair, measure_peak=True) as loaded:
        plan = loaded.plan.to_dict()
        print(json.dumps(plan), flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main(*sys.argv[1:])
