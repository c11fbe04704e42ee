#!/usr/bin/env bash
# The GPU suite (tests/gpu, marker `gpu`) on a machine with CUDA vLLM, speculators 0.3.0 and
# 0.4.0.1 installed under $SPECSHIM_GPU_ROOT/spec030 and spec040 (and vLLM, where it is not
# installed in python3's environment, unpacked under $SPECSHIM_GPU_ROOT/site; docs/gpu.md).
# This checkout's src/ goes first on PYTHONPATH, so a change needs no reinstall.
#
#   scripts/gpu_test.sh [pytest args]        # SPECSHIM_GPU_ROOT=/root/g by default
#   scripts/gpu_test.sh --vllm 0.34.0 [...]  # the release installed under /root/g-0.34.0
#   scripts/gpu_test.sh tests/gpu/test_worker_writer_cuda.py   # paths given: only those
#   STREAMS=3 LOGS=dir scripts/gpu_test.sh -k "not native"
#
# STREAMS=N runs the selected tests in N pytest processes at once on the one GPU (dealt
# round-robin; each stream's log is LOGS/stream_K.log), every generator asking for 0.8/N of
# the device's memory (SPECSHIM_E2E_GPU_MEMORY: read by tests/e2e/driver.py, and given to
# `specshim extract --gpu-memory-utilization` by the backends' tests). Engine start is most of a
# test's minute, so three streams take about a third of the time. vLLM's memory profiling stops an
# engine whose free memory grew while it measured (another stream's engine ended meanwhile), so
# the tests that failed in a stream run once more, one after another, once every stream is done
# (LOGS/alone.log); the verdict is theirs, and the streams' logs keep the first failures.
set -euo pipefail
cd "$(dirname "$0")/.."
G=${SPECSHIM_GPU_ROOT:-/root/g}
if [ "${1:-}" = --vllm ]; then
    G=/root/g-${2:?--vllm needs a version}
    shift 2
fi
mkdir -p .spec
ln -sfn "$G/spec030" .spec/0.3.0
ln -sfn "$G/spec040" .spec/0.4.0.1
# $G/boot holds a sitecustomize.py that reads the site's .pth files (nvidia-cutlass-dsl adds its
# path by one; PYTHONPATH alone skips them), where the install made one (docs/gpu.md).
export PYTHONPATH="$PWD/src:$G/boot:$G/site"
export HF_HUB_OFFLINE=1 VLLM_HOST_IP=127.0.0.1 TOKENIZERS_PARALLELISM=false
export VLLM_USE_FLASHINFER_SAMPLER=0  # flashinfer is an optional install: not needed
export SPECSHIM_E2E_OUT="${SPECSHIM_E2E_OUT:-/tmp/specshim-gpu-e2e}"
PYTEST=(python3 -m pytest -q -rfEsp -p no:cacheprovider -m gpu)  # -r: a line per test
TARGETS=(tests/gpu)  # the whole suite, unless a path under tests/ is given
for arg in "$@"; do [[ $arg == tests/* ]] && TARGETS=(); done
STREAMS=${STREAMS:-1}
if [ "$STREAMS" -le 1 ]; then
    exec "${PYTEST[@]}" "${TARGETS[@]}" "$@"
fi
LOGS=${LOGS:-/tmp/specshim-gpu-logs}
mkdir -p "$LOGS"
export SPECSHIM_E2E_GPU_MEMORY
SPECSHIM_E2E_GPU_MEMORY=$(python3 -c "print(round(0.8 / $STREAMS, 3))")
mapfile -t tests < <("${PYTEST[@]}" "${TARGETS[@]}" --collect-only "$@" | grep '::')
pids=()
for ((k = 0; k < STREAMS; k++)); do
    mine=()
    for i in "${!tests[@]}"; do
        if ((i % STREAMS == k)); then mine+=("${tests[$i]}"); fi
    done
    [ ${#mine[@]} -gt 0 ] || continue
    SPECSHIM_E2E_OUT="$SPECSHIM_E2E_OUT/stream_$k" "${PYTEST[@]}" --basetemp="/tmp/gpu-stream-$k" \
        "${mine[@]}" > "$LOGS/stream_$k.log" 2>&1 &
    pids+=($!)
done
streams=0
for pid in "${pids[@]}"; do wait "$pid" || streams=1; done
tail -n 3 "$LOGS"/stream_*.log
mapfile -t failed < <(sed -n -E 's/^(FAILED|ERROR) ([^ ]+).*/\2/p' "$LOGS"/stream_*.log | sort -u)
[ ${#failed[@]} -gt 0 ] || exit $streams  # a stream that failed naming no test failed whole
echo "again, alone: ${failed[*]}"
"${PYTEST[@]}" "${failed[@]}" > "$LOGS/alone.log" 2>&1 && status=0 || status=$?
tail -n 3 "$LOGS/alone.log"
exit $status
