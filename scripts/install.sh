#!/usr/bin/env bash
# Install homespec into ./.venv (or $HOMESPEC_VENV) and get the default pair's demo models.
# Idempotent.
#
#   ./scripts/install.sh                 CPU build of llama.cpp (works everywhere)
#   HOMESPEC_BACKEND=cuda ./scripts/install.sh    CUDA build (needs nvcc and cmake); only for
#       this machine's card (nvidia-smi's compute capability) unless CUDA_ARCH says otherwise,
#       e.g. CUDA_ARCH="86;89" for two kinds of card
#   HOMESPEC_BACKEND=metal ./scripts/install.sh   Metal build (macOS)
#
# llama-cpp-python ships as source only: the first build takes about 7 minutes on 2 cores.
# pip keeps the built wheel in its cache, so later installs on the same machine take seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
VENV="${HOMESPEC_VENV:-.venv}"
say() { printf '\033[1mhomespec install:\033[0m %s\n' "$*" >&2; }
die() { printf 'Error: %s\n' "$*" >&2; exit 1; }

command -v "$PY" >/dev/null || die "$PY not found — install Python 3.11+ (Debian: apt-get install python3 python3-venv)"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || die "Python 3.11+ is needed, $("$PY" --version) found — set PYTHON=/path/to/python3.11"
command -v cc >/dev/null || command -v gcc >/dev/null \
  || die "no C compiler for building llama.cpp — Debian: apt-get install build-essential"

if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV ($("$PY" --version))"
  "$PY" -m venv "$VENV" || die "could not create a virtualenv — Debian: apt-get install python3-venv"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install --quiet --upgrade pip

# Every build has llama.cpp's RPC backend: `homespec worker` serves it, and a pair's target can
# spread over workers on other boxes (README, "Several machines").
export CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_RPC=on"
case "${HOMESPEC_BACKEND:-cpu}" in
  cpu) ;;
  cuda)
    command -v nvcc >/dev/null || die "HOMESPEC_BACKEND=cuda needs nvcc (the CUDA toolkit) on PATH — e.g. export PATH=/usr/local/cuda/bin:\$PATH"
    arch=${CUDA_ARCH:-$({ nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null || true; } | sort -u | tr -d . | paste -sd';')}
    # Every architecture llama.cpp knows takes far longer to build than the one card here.
    [ -n "$arch" ] || die "no NVIDIA card found by nvidia-smi — set CUDA_ARCH (e.g. 89 for an RTX 4090, 90 for an H100)"
    say "CUDA build for compute capability $arch"
    export CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$arch" ;;
  metal) export CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_METAL=on" ;;
  *) die "HOMESPEC_BACKEND must be cpu, cuda or metal (got ${HOMESPEC_BACKEND})" ;;
esac

has_rpc='import llama_cpp, sys; sys.exit(not llama_cpp.llama_supports_rpc())'
install_llama() {
  say "installing llama-cpp-python (${HOMESPEC_BACKEND:-cpu}); a first build from source takes ~7 min on 2 cores…"
  extra=()
  # pip's wheel cache does not know about CMAKE_ARGS: a GPU build must not reuse a CPU wheel.
  [ "${HOMESPEC_BACKEND:-cpu}" != cpu ] && extra=(--no-cache-dir --force-reinstall --no-deps)
  "${PIP[@]}" install "${extra[@]}" "llama-cpp-python>=0.3.36,<0.4"
}
if ! "$VENV/bin/python" -c 'import llama_cpp' 2>/dev/null || [ "${HOMESPEC_BACKEND:-cpu}" != cpu ]; then
  install_llama
fi
if ! "$VENV/bin/python" -c "$has_rpc" 2>/dev/null; then
  # Built by an older homespec without RPC (and perhaps reused from pip's cache): once more.
  say "this llama-cpp-python has no RPC backend (for \`homespec worker\`): building it again with one"
  "${PIP[@]}" cache remove 'llama_cpp_python*' >/dev/null 2>&1 || true
  "${PIP[@]}" uninstall --yes llama-cpp-python >/dev/null
  install_llama
  "$VENV/bin/python" -c "$has_rpc" || die "llama-cpp-python still has no RPC backend (CMAKE_ARGS=$CMAKE_ARGS)"
fi

say "installing homespec"
"${PIP[@]}" install --quiet -e ".${HOMESPEC_EXTRAS:-}"

say "getting the demo models (homespec setup)"
"$VENV/bin/homespec" setup
say "done — try: $VENV/bin/homespec ask \"...\"  (or activate: source $VENV/bin/activate)"
