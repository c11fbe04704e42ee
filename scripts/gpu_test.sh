#!/usr/bin/env bash
# The GPU suite (tests/gpu, marker `gpu`) on a machine with CUDA vLLM, as on the lent H200:
# after ../shared/gpu/device_install.sh put vLLM under /root/g/site and speculators 0.3.0 /
# 0.4.0.1 under /root/g/spec030 and spec040 (docs/gpu.md). This checkout's src/ goes first on
# PYTHONPATH, so the bundle need not be rebuilt after a change.
#
#   scripts/gpu_test.sh [pytest args]        # SPECSHIM_GPU_ROOT=/root/g by default
set -euo pipefail
cd "$(dirname "$0")/.."
G=${SPECSHIM_GPU_ROOT:-/root/g}
mkdir -p .spec
ln -sfn "$G/spec030" .spec/0.3.0
ln -sfn "$G/spec040" .spec/0.4.0.1
export PYTHONPATH="$PWD/src:$G/site"
export HF_HUB_OFFLINE=1 VLLM_HOST_IP=127.0.0.1 TOKENIZERS_PARALLELISM=false
export VLLM_USE_FLASHINFER_SAMPLER=0  # flashinfer is not in the bundle
export SPECSHIM_E2E_OUT="${SPECSHIM_E2E_OUT:-/tmp/specshim-gpu-e2e}"
exec python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu "$@"
