"""`python -m homespec.engine.canary MODEL.gguf --gpu-layers N --repack on|off`: a model's first
decode, in a process of its own so that a native crash costs nothing but this process.

It loads the model the way the engine would, creates a small context and runs one batched
decode (several tokens, logits at each: the verify step's shape) and one single-token decode
(the plain step's shape), then checks that the logits are finite. Exit 0 and one JSON line on
success; exit 3 when llama.cpp refuses the file (an ordinary error, not a crash); exit 4 when
the logits are not finite. A crash shows as death by a signal, which engine/repack.py reads.
"""

from __future__ import annotations

# llama.cpp's library must load before numpy's (a CUDA build crashed at model load otherwise).
import homespec.engine.llama_backend as backend

# isort: split
import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

from homespec.engine.neighbours import physical_cores
from homespec.errors import HomespecError

PROMPT = "The quick brown fox jumps over the lazy dog. Then it runs back to the forest."


def run(path: Path, gpu_layers: int, repack: bool) -> dict[str, float]:
    t0 = time.perf_counter()
    model = backend.LlamaModel(path, gpu_layers=gpu_layers, repack=repack)
    ctx = backend.LlamaContext(
        model,
        n_ctx=128,
        n_batch=32,
        threads=physical_cores(),
        flash_attn=None if gpu_layers else False,
        n_outputs_max=8,
    )
    try:
        tokens = (model.tokenize(PROMPT, special=True) * 4)[:24]
        batched = ctx.extend(tokens, 8)
        finite = bool(np.isfinite(batched).all())  # before the next decode overwrites it
        single = ctx.extend([*tokens, int(np.argmax(batched[-1]))], 1)
        if not (finite and np.isfinite(single).all()):
            raise ValueError("llama.cpp returned non-finite logits")
    finally:
        ctx.close()
        model.close()
    return {"ms": round((time.perf_counter() - t0) * 1000.0, 1)}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m homespec.engine.canary")
    ap.add_argument("model", type=Path)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--repack", choices=("on", "off"), default="on")
    args = ap.parse_args(argv)
    # A crash here is expected on some machines: no core file (a big model's would be GiBs).
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        result = run(args.model, args.gpu_layers, args.repack == "on")
    except HomespecError as exc:
        print(f"canary: {exc}", file=sys.stderr)
        return 3
    except ValueError as exc:
        print(f"canary: {exc}", file=sys.stderr)
        return 4
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
