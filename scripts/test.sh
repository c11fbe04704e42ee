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
# module fixtures and cached vLLM runs. Tests in the second environment (marker other_vllm)
# run last, once it is built. End-to-end tests need the environments; SPECSHIM_REQUIRE_E2E=1
# turns a missing one into a failure instead of a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
FAST=0
if [ "${1:-}" = "--fast" ]; then
  FAST=1
  shift
fi
scripts/setup_env.sh .venv 0.32.0 5.19.0
if [ "$FAST" = 0 ]; then
  # mostly downloads: built while the default environment's tests run
  mkdir -p build
  (scripts/setup_env.sh .venv-0.28 0.28.0 5.24.0 && scripts/unpack_vllm.sh 0.34.0 vllm) \
    > build/setup_others.log 2>&1 &
  OTHERS=$!
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports  # the layers and no import circles: pyproject.toml [tool.importlinter]
.venv/bin/mypy  # the shipped package's types (py.typed): pyproject.toml [tool.mypy]
export SPECSHIM_REQUIRE_E2E=1
PYTEST=(.venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile)
if [ "$FAST" = 1 ]; then
  exec "${PYTEST[@]}" -m "not slow" "$@"
fi
first=0
"${PYTEST[@]}" -m "not other_vllm" "$@" || first=$?
if ! wait "$OTHERS"; then
  cat build/setup_others.log >&2
  exit 1
fi
last=0
"${PYTEST[@]}" -m other_vllm "$@" || last=$?
# 5: the arguments chose none of one run's tests, which is fine where the other ran some
if [ "$first" = 5 ] && [ "$last" = 5 ]; then exit 5; fi
for code in "$first" "$last"; do
  if [ "$code" != 0 ] && [ "$code" != 5 ]; then exit "$code"; fi
done
