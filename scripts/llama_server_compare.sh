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
#    length; `--spec-type draft-simple` where the build needs it named), ngram-mod (its
#    --spec-default) and ngram-simple.
# 3. Starts `homespec serve` on the same pair (fresh state: nothing learned, nothing remembered)
#    and waits until its draft is attached and its costs calibrated, as a restarted service is.
# 4. Runs `homespec bench --modes plain,auto --against …` so every request goes to homespec and
#    to each server, interleaved per prompt, in one table (speedups against homespec plain).
#    homespec's own modes run in-process; `homespec-daemon` is the daemon's default (`auto`)
#    reached like llama-server is, over HTTP, streamed, a fresh connection per request: the row
#    to hold against llama-server's, since that is what a client of either server gets.
#
# PY (default .venv/bin/python) is the Python that runs homespec: on the GPU machine, the
# machine's own python3 (../shared/gpu/README.md; scripts/gpu_tables.sh runs this script there).
# THREADS (default: what homespec uses) sets both systems' CPU threads (the daemon runs at the
# pair's models.toml setting: it is left out when THREADS differs); GPU_LAYERS (default 0)
# the llama-server layers on a GPU for a CUDA build. DAEMON=0 leaves the daemon out.
# LLAMA_HUGE_PAGES=1 gives llama-server what homespec gives a pair it keeps loaded (README,
# "Huge pages for the weights"): weights read, not mapped (`--load-mode none`), into memory
# glibc asks huge pages for (GLIBC_TUNABLES=glibc.malloc.hugetlb=1). Servers are stopped on
# exit.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\033[1mcompare:\033[0m %s\n' "$*" >&2; }
die() { printf 'Error: %s\n' "$*" >&2; exit 1; }

PY=${PY:-.venv/bin/python}
command -v "$PY" >/dev/null || die "no $PY here — run ./scripts/install.sh first (or set PY)"
VER=$("$PY" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')
OWN_THREADS=$("$PY" -c '
from homespec.engine.neighbours import physical_cores
from homespec.manifest import load_manifest
_, pair = load_manifest(None).pair(None)
print(pair.threads or physical_cores())')
THREADS=${THREADS:-$OWN_THREADS}
GPU_LAYERS=${GPU_LAYERS:-0}
# The pair's two files, and which of them homespec loads without llama.cpp's repacked weights
# here (its canary's verdict, remembered, at the GPU layers llama-server gets). Where those
# crash (AMX: README, "CPUs with AMX"), llama-server gets the same (--no-repack, which applies
# to its draft model too), or its draft-model configuration dies at its first decode.
PATHS=$("$PY" -c '
import sys
from homespec.engine import repack
from homespec.manifest import load_manifest
m = load_manifest(None)
_, pair = m.pair(None)
print(m.model_path(pair.target)); print(m.model_path(pair.draft))
names = [pair.target, pair.draft]
print(" ".join(n for n in names if m.model_path(n).is_file() and not repack.verdict(
    n, m.model_path(n), gpu_layers=int(sys.argv[1]), override=m.spec.models[n].repack).repack))' \
  "$GPU_LAYERS")
TARGET=$(sed -n 1p <<<"$PATHS")
DRAFT=$(sed -n 2p <<<"$PATHS")
NO_REPACK=$(sed -n 3p <<<"$PATHS")
[ -f "$TARGET" ] && [ -f "$DRAFT" ] || die "demo models missing ($TARGET, $DRAFT) — run .venv/bin/homespec setup"
REPACK=()
if [ -n "$NO_REPACK" ]; then
  REPACK=(--no-repack)
  say "llama.cpp's repacked weights crash on this CPU for $NO_REPACK: llama-server runs with --no-repack, as homespec loads them"
fi

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
LLAMA_ENV=(env)
HUGE=()
if [ "${LLAMA_HUGE_PAGES:-0}" = 1 ]; then
  LLAMA_ENV=(env "GLIBC_TUNABLES=glibc.malloc.hugetlb=1")
  HUGE=(--load-mode none)
  say "llama-server reads its weights into huge pages (LLAMA_HUGE_PAGES=1)"
fi
start() {  # LABEL ARGS…
  local label=$1; shift
  port=$((port + 1))
  "${LLAMA_ENV[@]}" "$SERVER" -m "$TARGET" --host 127.0.0.1 --port "$port" -t "$THREADS" \
    -tb "$THREADS" -c 4096 -np 1 -ngl "$GPU_LAYERS" --no-webui "${HUGE[@]}" "${REPACK[@]}" "$@" \
    >"$LOGDIR/$label.log" 2>&1 &
  PIDS+=($!)
  AGAINST+=(--against "$label=http://127.0.0.1:$port")
}
start llama-plain
# A draft model drafts only where --spec-type names it in llama.cpp builds that know
# draft-simple (llama-cpp-python 0.3.36's): there -md alone loads it and decodes plain, which
# is what this row measured until 2026-11-28 (its speed was plain's, its acceptance blank).
DRAFT_TYPE=()
if "$SERVER" --help 2>/dev/null | grep -q 'draft-simple'; then
  DRAFT_TYPE=(--spec-type draft-simple)
fi
start llama-draft -md "$DRAFT" -ngld "$GPU_LAYERS" "${DRAFT_TYPE[@]}"
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
if [ "${DAEMON:-1}" = 1 ] && [ "$THREADS" = "$OWN_THREADS" ]; then
  port=$((port + 1))
  "$PY" -m homespec serve --port "$port" --state-dir "$(mktemp -d)" >"$LOGDIR/homespec-daemon.log" 2>&1 &
  daemon=$!
  PIDS+=("$daemon")
  AGAINST+=(--against "homespec-daemon=http://127.0.0.1:$port")
  # Once the draft is attached and the governor's costs are measured (between requests).
  for _ in $(seq 300); do
    kill -0 "$daemon" 2>/dev/null || break
    "$PY" -c 'import sys, httpx
s = httpx.get(sys.argv[1] + "/homespec/status").json()
sys.exit(0 if all(p["measured_after_s"] is not None for p in s["pairs"]) else 1)' \
      "http://127.0.0.1:$port" 2>/dev/null && break
    sleep 1
  done
  up "http://127.0.0.1:$port" || die "homespec serve did not start: see $LOGDIR/homespec-daemon.log"
elif [ "${DAEMON:-1}" = 1 ]; then
  say "THREADS=$THREADS is not the pair's own $OWN_THREADS: homespec's daemon left out"
fi
say "servers up (logs in $LOGDIR); benching"
"$PY" -m homespec bench --threads "$THREADS" --modes plain,auto "${AGAINST[@]}" "$@"
