#!/usr/bin/env bash
# The main job on the built-in default: build the environment if needed, then run the whole
# pipeline (tiny local model, built-in data, real vLLM and speculators on the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh .venv 0.32.0 5.19.0
export PYTHONPATH=".spec/${SPECULATORS_VERSION:-0.4.0.1}${PYTHONPATH:+:$PYTHONPATH}"
exec .venv/bin/specshim run "$@"
