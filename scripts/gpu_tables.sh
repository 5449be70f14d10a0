#!/usr/bin/env bash
# Issue 8's GPU tables in one call: the cost curve homespec measures on the card, then every
# homespec mode, the daemon and llama-server in each of its speculative configurations on the
# shipped workload, one run (scripts/llama_server_compare.sh, llama-server's layers on the GPU).
#
# On the GPU machine, after ../shared/gpu/on-device.sh (which builds llama.cpp with CUDA,
# llama-server included, and writes .gpu-build/env.sh):
#
#   source .gpu-build/env.sh && ./scripts/gpu_tables.sh [extra `homespec bench` options]
#
# Writes gpu.txt (the card), doctor.txt (the measured decode costs: is the curve flat?),
# compare.txt (the table, and under it auto against plain, the best forced mode and the best
# llama-server configuration per task), the servers' logs and step_overhead.txt (homespec's
# own µs per step outside llama_decode: at 700+ tok/s a millisecond matters), hop.txt (plain
# decoding in-process, through the engine child alone and through the daemon: what its hop costs),
# unseen-N.txt (every mode on each of scripts/workloads/, in-process; UNSEEN picks the files),
# conversations.txt (chats taking turns with the prompt cache on and off) and prediction.txt
# (what a client's prediction is worth: scripts/prediction_bench.py) into $OUT (the
# device tool's folder; ./gpu-tables elsewhere), and prints the tables. About 5 minutes on one
# H100 once llama.cpp is built (2 on a 2-core CPU for --task short).
#
# PY: the Python that runs homespec (python3 where the tree has no .venv: on-device.sh's);
# LLAMA_SERVER_BIN: the llama-server (default: the one on PATH); GPU_LAYERS: llama-server's
# layers on the GPU (default 999: all, as homespec's gpu_layers = -1). A dry run on a CPU
# machine: GPU_LAYERS=0 ALLOW_CPU=1 ./scripts/gpu_tables.sh --task short
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\033[1mgpu-tables:\033[0m %s\n' "$*" >&2; }
die() { printf 'Error: %s\n' "$*" >&2; exit 1; }

if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PY
DEST=${OUT:-$PWD/gpu-tables}
mkdir -p "$DEST"
SERVER=${LLAMA_SERVER_BIN:-$(command -v llama-server || true)}
[ -n "$SERVER" ] && [ -x "$SERVER" ] \
  || die "no llama-server on PATH — source .gpu-build/env.sh first, or set LLAMA_SERVER_BIN"

if nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv \
  >"$DEST/gpu.txt" 2>/dev/null; then
  cat "$DEST/gpu.txt"
elif [ "${ALLOW_CPU:-0}" = 1 ]; then
  say "no GPU here (ALLOW_CPU=1): these are a CPU's tables"
  echo "no GPU (dry run on a CPU)" >"$DEST/gpu.txt"
else
  die "nvidia-smi finds no GPU — this script measures one (ALLOW_CPU=1 for a dry run)"
fi

say "measured decode costs (doctor --measure)"
# Exit 1 or 2 is a degraded or impossible plan: the report says which, and the tables below
# show what runs; nothing to stop for.
"$PY" -m homespec doctor --measure >"$DEST/doctor.txt" 2>&1 || true
grep -E '^pair|GPUs|  (plan|costs|measured) |^ {10}(one|the|homespec)|^    (target|draft) ' \
  "$DEST/doctor.txt" || true

# The tables first: device time is short, and what a timeout cuts should be the extra.
say "homespec (in-process modes and daemon) against llama-server"
LLAMA_SERVER_BIN=$SERVER GPU_LAYERS=${GPU_LAYERS:-999} \
  ./scripts/llama_server_compare.sh --modes plain,model,ngram,hybrid,auto "$@" \
  2>"$DEST/compare.log" | tee "$DEST/compare.txt" \
  || say "the compare failed: see $DEST/compare.log"

say "the daemon's hop on the card (hop_bench.py: plain decoding in-process, engine child, daemon)"
# Its short answers ran 0.73x homespec plain in the first H100 run: which layer takes the time
"$PY" scripts/hop_bench.py --repeat 3 --json "$DEST/hop.json" 2>"$DEST/hop.log" \
  | tee "$DEST/hop.txt" || say "hop_bench.py failed: see $DEST/hop.log"
say "homespec's own time per step outside llama_decode (step_overhead.py)"
"$PY" scripts/step_overhead.py --json "$DEST/step_overhead.json" 2>&1 \
  | tee "$DEST/step_overhead.txt" || say "step_overhead.py failed: see $DEST/step_overhead.txt"
# Workloads the governor was not tuned on (scripts/workloads/): every homespec mode in-process,
# auto against plain and the best forced mode per task, as for the shipped workload above.
for w in ${UNSEEN:-scripts/workloads/unseen-*.jsonl}; do
  name=$(basename "$w" .jsonl)
  say "homespec's modes on $name (in-process)"
  "$PY" -m homespec bench --modes plain,model,ngram,hybrid,auto --workload "$w" \
    >"$DEST/$name.txt" 2>"$DEST/$name.log" || say "the $name bench failed: see $DEST/$name.log"
  sed -n '/^auto against/,$p' "$DEST/$name.txt" >&2 || true
done
say "conversations put aside on the card (conversations.py: the prompt cache copies CUDA KV)"
"$PY" scripts/conversations.py --cache-mb 256,0 --conversations 2 --turns 2 \
  --json "$DEST/conversations.json" 2>"$DEST/conversations.log" | tee "$DEST/conversations.txt" \
  || say "conversations.py failed: see $DEST/conversations.log"
say "a client's prediction on the card (prediction_bench.py: regenerated answers and edits)"
"$PY" scripts/prediction_bench.py --repeat 1 --json "$DEST/prediction.json" \
  2>"$DEST/prediction.log" | tee "$DEST/prediction.txt" \
  || say "prediction_bench.py failed: see $DEST/prediction.log"
say "wrote $DEST: gpu.txt doctor.txt compare.txt compare.log hop.txt step_overhead.txt unseen-*.txt conversations.txt prediction.txt"
