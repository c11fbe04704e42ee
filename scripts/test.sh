#!/usr/bin/env bash
# The test command: build the real test bed if it is missing, then lint and run every test.
# End-to-end tests need the environments; SPECSHIM_REQUIRE_E2E=1 turns a missing one into a
# failure instead of a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh .venv 0.32.0 5.19.0
scripts/setup_env.sh .venv-0.28 0.28.0 5.24.0
scripts/unpack_vllm.sh 0.34.0 vllm
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports  # the layers and no import circles: pyproject.toml [tool.importlinter]
.venv/bin/mypy  # the shipped package's types (py.typed): pyproject.toml [tool.mypy]
export SPECSHIM_REQUIRE_E2E=1
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
