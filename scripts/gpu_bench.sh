#!/usr/bin/env bash
# benchmarks/gpu_extraction.py on a machine with CUDA vLLM, speculators $SPEC put on PYTHONPATH
# by $SPECSHIM_GPU_ROOT/env.sh (default /root/g), as for scripts/gpu_release.sh (docs/gpu.md).
# This checkout's src/ goes first on PYTHONPATH, so a change needs no reinstall. Each path's
# line and the table come out without vLLM's log lines, each line as it comes (a run cut off
# by a time limit keeps the paths it finished); the figures go to
# docs/benchmarks/gpu_extraction.json, and a copy to $OUT where it is set (the device tool's
# folder that comes back).
#
#   scripts/gpu_bench.sh --work /dev/shm/b13 --paths vllm_prefill,native,extract_engine
#   SPEC=030 scripts/gpu_bench.sh ...     # speculators 0.3.0 (default: 0.4.0.1)
set -euo pipefail
cd "$(dirname "$0")/.."
export SPEC=${SPEC:-040}
# shellcheck source=/dev/null
source "${SPECSHIM_GPU_ROOT:-/root/g}/env.sh"
export PYTHONPATH="$PWD/src:$PYTHONPATH"
status=0
python3 benchmarks/gpu_extraction.py "$@" 2>&1 |
    { grep --line-buffered -v -E "^(INFO|WARNING|DEBUG|\((EngineCore|Worker|VllmWorker)[^)]*\))|Writing model" || true; } ||
    status=$?
if [ -n "${OUT:-}" ]; then cp docs/benchmarks/gpu_extraction.json "$OUT/"; fi
exit "$status"
