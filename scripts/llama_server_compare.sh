#!/usr/bin/env bash
# homespec against llama-server, same llama.cpp, same models, same threads, same prompts, one run.
#
#   ./scripts/llama_server_compare.sh [extra `homespec bench` options, e.g. --task extract]
#
# 1. Builds llama-server from the llama.cpp source that the installed llama-cpp-python vendors
#    (its sdist from PyPI; CPU build, about 15 minutes on 2 cores the first time), into
#    ~/.cache/homespec/llama-server/VERSION (LLAMA_SERVER_DIR overrides). LLAMA_SERVER_BIN=path
#    uses a llama-server you built yourself instead.
# 2. Starts it on the default pair in each of its speculative configurations, all at once on
#    loopback (an idle server costs memory, not CPU): plain, draft model (its default draft
#    length), ngram-mod (its --spec-default) and ngram-simple.
# 3. Runs `homespec bench --modes plain,auto --against …` so every request goes to homespec and
#    to each server, interleaved per prompt, in one table (speedups against homespec plain).
#
# THREADS (default: what homespec uses) sets both systems' CPU threads; GPU_LAYERS (default 0)
# the llama-server layers on a GPU for a CUDA build. Servers are stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\033[1mcompare:\033[0m %s\n' "$*" >&2; }
die() { printf 'Error: %s\n' "$*" >&2; exit 1; }

PY=.venv/bin/python
[ -x "$PY" ] || die "no .venv here — run ./scripts/install.sh first"
VER=$("$PY" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')
THREADS=${THREADS:-$("$PY" -c 'from homespec.engine.neighbours import physical_cores; print(physical_cores())')}
GPU_LAYERS=${GPU_LAYERS:-0}
PATHS=$("$PY" -c '
from homespec.manifest import load_manifest
m = load_manifest(None)
_, pair = m.pair(None)
print(m.model_path(pair.target)); print(m.model_path(pair.draft))')
TARGET=$(sed -n 1p <<<"$PATHS")
DRAFT=$(sed -n 2p <<<"$PATHS")
[ -f "$TARGET" ] && [ -f "$DRAFT" ] || die "demo models missing ($TARGET, $DRAFT) — run .venv/bin/homespec setup"

SERVER=${LLAMA_SERVER_BIN:-}
if [ -z "$SERVER" ]; then
  DIR=${LLAMA_SERVER_DIR:-$HOME/.cache/homespec/llama-server/$VER}
  SERVER=$DIR/build/bin/llama-server
  if [ ! -x "$SERVER" ]; then
    command -v cmake >/dev/null || die "cmake is needed to build llama-server — Debian: apt-get install cmake"
    mkdir -p "$DIR"
    say "building llama-server from llama-cpp-python $VER's vendored llama.cpp (about 15 min on 2 cores)…"
    "$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VER" -d "$DIR" \
      || die "could not download the llama-cpp-python $VER sdist from PyPI"
    tar -xzf "$DIR/llama_cpp_python-$VER.tar.gz" -C "$DIR"
    SRC=$DIR/llama_cpp_python-$VER/vendor/llama.cpp
    extra=()
    [ "${HOMESPEC_BACKEND:-cpu}" = cuda ] && extra+=(-DGGML_CUDA=ON)
    cmake -S "$SRC" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF "${extra[@]}" >&2
    cmake --build "$DIR/build" --target llama-server llama-bench -j "$(nproc)" >&2
  fi
fi
say "llama-server: $SERVER; $THREADS threads; target $TARGET, draft $DRAFT"

PIDS=()
LOGDIR=$(mktemp -d)
trap 'kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true' EXIT
AGAINST=()
port=18190
start() {  # LABEL ARGS…
  local label=$1; shift
  port=$((port + 1))
  "$SERVER" -m "$TARGET" --host 127.0.0.1 --port "$port" -t "$THREADS" -tb "$THREADS" \
    -c 4096 -np 1 -ngl "$GPU_LAYERS" --no-webui "$@" >"$LOGDIR/$label.log" 2>&1 &
  PIDS+=($!)
  AGAINST+=(--against "$label=http://127.0.0.1:$port")
}
start llama-plain
start llama-draft -md "$DRAFT" -ngld "$GPU_LAYERS"
start llama-ngram-mod --spec-type ngram-mod
start llama-ngram-simple --spec-type ngram-simple
up() { "$PY" -c 'import sys, httpx; sys.exit(httpx.get(sys.argv[1] + "/health").status_code != 200)' "$1" 2>/dev/null; }
for a in "${AGAINST[@]}"; do
  case $a in --against) continue ;; esac
  url=${a#*=}
  for _ in $(seq 120); do
    up "$url" && break
    sleep 1
  done
  up "$url" || die "llama-server at $url did not start: see $LOGDIR"
done
say "servers up (logs in $LOGDIR); benching"
"$PY" -m homespec bench --threads "$THREADS" --modes plain,auto "${AGAINST[@]}" "$@"
