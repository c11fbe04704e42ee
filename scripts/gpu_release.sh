#!/usr/bin/env bash
# One CUDA vLLM release on a GPU, from report to evaluation, as one rerunnable step: for each
# speculators version, `specshim report`, then `specshim run` (extract, vocab, train, eval with
# vLLM's EAGLE-3) on the built-in verifier. Each step's log goes to LOGS (and to $OUT where it is
# set, the folder a remote runner brings back); a step left out by the time budget says so.
#
#   scripts/gpu_release.sh 0.34.0                    # vLLM installed under /root/g-0.34.0
#   SPECS="040" BUDGET=300 BACKEND=engine scripts/gpu_release.sh 0.34.0
#
# The release's packages are under SPECSHIM_GPU_ROOT (default /root/g-VERSION), with an env.sh
# that puts speculators $SPEC on PYTHONPATH (docs/gpu.md); this checkout's src/ goes first on
# PYTHONPATH, so a change needs no reinstall.
set -uo pipefail
cd "$(dirname "$0")/.."
VERSION=${1:?usage: scripts/gpu_release.sh VLLM_VERSION}
G=${SPECSHIM_GPU_ROOT:-/root/g-$VERSION}
LOGS=${LOGS:-${OUT:-/tmp/specshim-gpu-release}}
BUDGET=${BUDGET:-540}  # seconds: a step that would start later is left out
SPECS=${SPECS:-"040 030"}
BACKEND=${BACKEND:-generator}  # the matrix's rows are per backend: speculators' generator first
mkdir -p "$LOGS"
start=$SECONDS
status=0

step() {  # step NAME COMMAND...: run it unless the budget is spent, log and time it
    local name=$1
    shift
    if ((SECONDS - start > BUDGET)); then
        echo "$name: left out, $((SECONDS - start)) s of the $BUDGET s budget spent" | tee -a "$LOGS/steps.txt"
        return
    fi
    local t0=$SECONDS rc=0
    "$@" >"$LOGS/$name.log" 2>&1 || rc=$?
    echo "$name: rc=$rc in $((SECONDS - t0)) s" | tee -a "$LOGS/steps.txt"
    ((rc == 0)) || status=1
}

for spec in $SPECS; do
    (
        export SPEC=$spec
        # shellcheck source=/dev/null
        source "$G/env.sh"
        export PYTHONPATH="$PWD/src:$PYTHONPATH"
        work=/tmp/specshim-release-$VERSION-$spec-$BACKEND
        first=$(ls -d /tmp/specshim-release-"$VERSION"-*/verifier 2>/dev/null | head -1)
        if [ ! -d "$work/verifier" ] && [ -n "$first" ]; then  # one verifier for every run
            mkdir -p "$work" && cp -r "$first" "$work/"
        fi
        step "report_$spec" python3 -m specshim.cli report --verbose  # names every adapter
        step "run_${spec}_$BACKEND" python3 -m specshim.cli run --workdir "$work" --verifier-seconds 60 \
            --samples 200 --backend "$BACKEND" --overwrite  # a folder of this script's
        exit $status
    ) || status=1
done
nvidia-smi --query-gpu=name --format=csv,noheader >"$LOGS/gpu.txt" 2>&1
exit $status
