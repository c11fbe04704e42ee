#!/usr/bin/env bash
# Train an EAGLE-3 draft on a GPU from hidden states extracted on the CPU (the GPU proof).
#
# Runs on the lent H200 (see docs/gpu.md): its image has torch and transformers 5 but not
# speculators' light requirements, which travel as wheels in .whl/. Expects in .gpu/ what
# `specshim extract` and `specshim vocab` wrote on the CPU (model/, hidden/), and speculators
# in .spec/0.4.0.1. Writes train logs (loss per step, step times) for bf16 and fp32 to $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:.spec/0.4.0.1:src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"
for dtype in bfloat16 float32; do
  python3 -m specshim.cli train --data .gpu/hidden --verifier .gpu/verifier --out /tmp/draft-$dtype \
    --epochs "${EPOCHS:-20}" --max-len 2048 --dtype $dtype --device cuda
  cp /tmp/draft-$dtype/train_log.json "$OUT/train_log_$dtype.json"
done
