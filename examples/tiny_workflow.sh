#!/usr/bin/env bash
# The specshim workflow on a tiny verifier, on the CPU, in a few minutes:
# report, extract, vocab, train, eval. See examples/README.md.
#
#   examples/tiny_workflow.sh [WORK]      # WORK: a new folder (default runs/tiny-workflow)
#
# Settings (environment): VERIFIER_SECONDS (training time of the tiny verifier, default 60),
# SAMPLES (prompts extracted, default 200), EPOCHS (draft training epochs, default 2).
# Needs `python` and `specshim` of an environment with vLLM and speculators 0.3/0.4.
set -euo pipefail

WORK=${1:-runs/tiny-workflow}
if [ -e "$WORK" ] && [ -n "$(ls -A "$WORK")" ]; then
    echo "tiny_workflow.sh: $WORK is not empty: give a new folder (or remove it)" >&2
    exit 2
fi
mkdir -p "$WORK"
VERIFIER="$WORK/verifier" DATA="$WORK/data.jsonl" HS="$WORK/hs" DRAFT="$WORK/draft"

# 0. The verifier and its prompts. Your own model and data take their place: a model folder or
#    hub id, and JSONL of token ids or chats (docs/data.md). This one is a 4-layer Llama
#    trained here on a corpus it can learn, built by specshim's test bed.
python - "$VERIFIER" "$DATA" "${VERIFIER_SECONDS:-60}" "${SAMPLES:-200}" <<'PY'
import sys
from pathlib import Path

from specshim import console
from specshim.testbed import learnable

console.configure()  # its progress on stderr, as the commands write theirs
verifier, data, seconds, samples = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
learnable.build_verifier(verifier, seconds=float(seconds))
learnable.write_dataset(verifier, data, int(samples))
PY

# 1. Is this vLLM + speculators + accelerator tested, and which patches does it need?
specshim report

# 2. Hidden states of the verifier, as speculators 0.3/0.4 training reads them. A 4-layer model
#    names its layers: speculators' default ids [2, n/2, n-3, n-1] would repeat one.
specshim extract --model "$VERIFIER" --data "$DATA" --out "$HS" --layers 0,1,2,3 \
    --max-model-len 256

# 3. The draft's vocabulary: the 256 most frequent loss-masked tokens.
specshim vocab --data "$HS" --draft-vocab-size 256 --model "$VERIFIER"

# 4. An EAGLE-3 draft, trained by speculators' own trainer.
specshim train --data "$HS" --verifier "$VERIFIER" --out "$DRAFT" --epochs "${EPOCHS:-2}"

# 5. The draft in vLLM's EAGLE-3 decoding: acceptance per position, greedy output unchanged.
specshim eval --verifier "$VERIFIER" --draft "$DRAFT" --data "$HS" --max-model-len 256
