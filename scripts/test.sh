#!/usr/bin/env bash
# The whole check, as CI runs it: install (idempotent), lint, type-check, the full test suite.
# The engine tests run on the real demo models (SmolLM2 F32 target + Q4_1 draft), on CPU.
# PYTHON=/path/to/python3.12 HOMESPEC_VENV=.venv-3.12 runs it all under another Python.
set -euo pipefail
cd "$(dirname "$0")/.."
HOMESPEC_EXTRAS="[dev]" ./scripts/install.sh
# The unit-file test runs `systemd-analyze verify` (Debian's systemd package).
if [ "$(uname)" = Linux ] && ! command -v systemd-analyze >/dev/null; then
    SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends systemd
fi
VENV="${HOMESPEC_VENV:-.venv}"
"$VENV/bin/ruff" check homespec tests
"$VENV/bin/ruff" format --check homespec tests
"$VENV/bin/mypy" homespec
"$VENV/bin/python" -m pytest "$@"
