#!/usr/bin/env bash
# The whole check, as CI runs it: install (idempotent), lint, type-check, the full test suite.
# The engine tests run on the real demo models (SmolLM2 F32 target + Q4_1 draft), on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
HOMESPEC_EXTRAS="[dev]" ./scripts/install.sh
# The unit-file test runs `systemd-analyze verify` (Debian's systemd package).
if [ "$(uname)" = Linux ] && ! command -v systemd-analyze >/dev/null; then
    SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends systemd
fi
.venv/bin/ruff check homespec tests
.venv/bin/ruff format --check homespec tests
.venv/bin/mypy homespec
.venv/bin/python -m pytest "$@"
