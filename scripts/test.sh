#!/usr/bin/env bash
# The test command, in two tiers:
#
#   scripts/test.sh --fast [pytest args]   while working: lint, import contracts, type check,
#       every test that needs no vLLM, and one real run per extraction backend in the default
#       environment (-m "not slow"; tests/markers.py). Builds only .venv.
#   scripts/test.sh [pytest args]          everything (what .ci/run runs): builds the real test
#       bed if it is missing, the second environment meanwhile, and runs every test.
#
# Tests run two at a time (pytest-xdist), each file in one process: a file's tests share its
# module fixtures and cached vLLM runs; each process's vLLM gets a core of its own
# (tests/conftest.py). Tests in the second environment (marker other_vllm) come after the
# default environment's long ones. End-to-end tests need the environments;
# SPECSHIM_REQUIRE_E2E=1 turns a missing one into a failure instead of a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
FAST=0
if [ "${1:-}" = "--fast" ]; then
  FAST=1
  shift
fi
scripts/setup_env.sh .venv 0.32.0 5.19.0
if [ "$FAST" = 0 ]; then
  # Mostly downloads: built while the default environment's tests run. It holds
  # $SPECSHIM_SETUP.lock until it ends; a test that needs it waits for that (tests/conftest.py).
  export SPECSHIM_SETUP=build/setup_others
  mkdir -p build
  rm -f "$SPECSHIM_SETUP.status"
  exec 9> "$SPECSHIM_SETUP.lock"
  flock 9
  (
    status=0
    { scripts/setup_env.sh .venv-0.28 0.28.0 5.24.0 && scripts/unpack_vllm.sh 0.34.0 vllm; } \
      > "$SPECSHIM_SETUP.log" 2>&1 || status=$?
    echo "$status" > "$SPECSHIM_SETUP.status"
    exit "$status"
  ) &
  OTHERS=$!
  exec 9>&-  # the build keeps the lock
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports  # the layers and no import circles: pyproject.toml [tool.importlinter]
.venv/bin/mypy  # the shipped package's types (py.typed): pyproject.toml [tool.mypy]
.venv/bin/mkdocs build --strict  # the docs site (mkdocs.yml); -q would hide warnings from --strict
export SPECSHIM_REQUIRE_E2E=1
# each file to one process, in the order tests/markers.py gives them
PYTEST=(.venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile
  --no-loadscope-reorder)
if [ "$FAST" = 1 ]; then
  exec "${PYTEST[@]}" -m "not slow" "$@"
fi
tests=0
"${PYTEST[@]}" "$@" || tests=$?
if ! wait "$OTHERS"; then
  cat "$SPECSHIM_SETUP.log" >&2
  exit 1
fi
exit "$tests"
