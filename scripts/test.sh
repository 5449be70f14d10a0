#!/usr/bin/env bash
# The whole check, as CI runs it: install (idempotent), lint, type-check, the full test suite.
# The engine tests run on the real demo models (SmolLM2 F32 target + Q4_1 draft), on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
HOMESPEC_EXTRAS="[dev]" ./scripts/install.sh
.venv/bin/ruff check homespec tests
.venv/bin/ruff format --check homespec tests
.venv/bin/mypy homespec
.venv/bin/python -m pytest "$@"
