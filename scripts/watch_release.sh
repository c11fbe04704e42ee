#!/usr/bin/env bash
# Triage a vLLM release the day it ships: unpack its wheel (scripts/unpack_vllm.sh: no GPU,
# no build), record its snapshot, and run `specshim triage` on it with each speculators, so
# every adapter's probe decides on the release's own code. CI's watch workflow runs this.
#
#   scripts/watch_release.sh [VERSION | --nightly] [--against FILE] [--out DIR]
#                            [--speculators DIR]...
#
# VERSION: a vllm release (default: the newest on PyPI); a wheel already unpacked under
# .wheels/ is reused, so a given VERSION needs no network. --nightly: the newest wheel on
# vLLM's nightly index ($VLLM_NIGHTLY_INDEX, default https://wheels.vllm.ai/nightly); where
# that index cannot be reached it says so and exits 0. --against: the snapshot to compare
# with (default: the recorded one nearest VERSION among older releases). --speculators: the
# speculators folders to probe with (default: every .spec/*/). --out (default
# build/watch/vllm-VERSION) receives the snapshot, vllm-VERSION.json (kept if already there),
# one triage text per speculators, triage-speculators-S.txt, and needs-a-human.txt.
#
# Exit status: 0 when every moved fact is covered and every adapter decided; 1 when something
# needs a human (the lines that do are printed last); 2 when the watch could not run (bad
# arguments, a release that cannot be fetched, no older snapshot to compare with).
set -uo pipefail  # not -e: every step runs and its status is collected
cd "$(dirname "$0")/.."
NIGHTLY_INDEX=${VLLM_NIGHTLY_INDEX:-https://wheels.vllm.ai/nightly}
PYTHON=.venv/bin/python
usage() {
  echo "watch_release: $1; usage: scripts/watch_release.sh [VERSION | --nightly]" \
    "[--against FILE] [--out DIR] [--speculators DIR]..." >&2
  exit 2
}
VERSION="" NIGHTLY="" AGAINST="" OUT="" SPECS=()
while [ $# -gt 0 ]; do
  case $1 in
    --nightly) NIGHTLY=1 ;;
    --against | --out | --speculators)
      [ $# -ge 2 ] || usage "$1 needs a value"
      case $1 in
        --against) AGAINST=$2 ;;
        --out) OUT=$2 ;;
        --speculators) SPECS+=("${2%/}") ;;
      esac
      shift
      ;;
    -*) usage "unknown option $1" ;;
    *)
      [ -z "$VERSION" ] || usage "one VERSION, got $VERSION and $1"
      VERSION=$1
      ;;
  esac
  shift
done
[ -z "$NIGHTLY" ] || [ -z "$VERSION" ] || usage "give VERSION or --nightly, not both"
[ -z "$AGAINST" ] || [ -f "$AGAINST" ] || usage "--against $AGAINST: no such file"

# The newest vllm on an index, as pip sees it; on failure pip's last line, and status 1.
newest() {
  local answer
  if ! answer=$(python3 -m pip index versions vllm --retries 0 --timeout 30 "$@" 2>&1); then
    echo "$answer" | grep -v "^WARNING" | tail -1
    return 1
  fi
  answer=$(echo "$answer" | sed -n 's/^vllm (\(.*\))$/\1/p')
  [ -n "$answer" ] || { echo "pip index versions named no vllm version"; return 1; }
  echo "$answer"
}
if [ -n "$NIGHTLY" ]; then
  if ! VERSION=$(newest --pre --index-url "$NIGHTLY_INDEX"); then
    echo "no nightly wheel from $NIGHTLY_INDEX (unreachable from here, or none for this" \
      "platform; pip: $VERSION): nightly skipped"
    exit 0
  fi
  export PIP_EXTRA_INDEX_URL="$NIGHTLY_INDEX"  # where scripts/unpack_vllm.sh finds the wheel
elif [ -z "$VERSION" ] && ! VERSION=$(newest); then
  echo "watch_release: could not ask PyPI for vllm's newest release ($VERSION): pass VERSION" >&2
  exit 2
fi
[ -x "$PYTHON" ] || usage "$PYTHON is missing: build the test bed with scripts/setup_env.sh"
if [ ${#SPECS[@]} -eq 0 ]; then
  for spec in .spec/*/; do [ -d "$spec/speculators" ] && SPECS+=("${spec%/}"); done
fi
[ ${#SPECS[@]} -gt 0 ] || usage "no speculators under .spec/: run scripts/setup_env.sh"
for spec in "${SPECS[@]}"; do
  [ -d "$spec/speculators" ] || usage "--speculators $spec: expected a folder holding speculators/"
done
# The snapshot to compare with: --against, checked, else the nearest older recorded one.
AGAINST=$("$PYTHON" - "$VERSION" "$AGAINST" <<'PY'
import sys
from pathlib import Path
from specshim import contracts, versions
version, against = sys.argv[1:]
if against:
    try:
        contracts.load(Path(against))
    except (OSError, ValueError) as exc:
        sys.exit(f"watch_release: --against {exc}")
    print(against)
    sys.exit()
release = versions.base(version)
recorded = sorted(contracts.shipped().glob("vllm-*.json"))
older = [p for p in recorded if versions.base(contracts.load(p)["vllm"]) < release]
if not older:
    sys.exit(f"watch_release: no recorded snapshot older than vllm {version}: pass --against")
print(contracts.nearest(older, version))
PY
) || exit 2
echo "vllm $VERSION against $AGAINST"
if ! scripts/unpack_vllm.sh "$VERSION" vllm 2> >(grep -v "^WARNING: Location" >&2); then
  echo "watch_release: vllm==$VERSION could not be fetched and unpacked (above)" >&2
  exit 2
fi
WHEEL=.wheels/vllm-$VERSION

OUT=${OUT:-build/watch/vllm-$VERSION}
mkdir -p "$OUT"
HUMAN=$OUT/needs-a-human.txt
: >"$HUMAN"
SNAPSHOT=$OUT/vllm-$VERSION.json
RECORDING=""
if [ -f "$SNAPSHOT" ]; then
  echo "$SNAPSHOT: kept (remove it to record again)"
else  # recorded while the triages run, into a .partial file renamed once complete
  SPEC_ARGS=()
  for spec in "${SPECS[@]}"; do SPEC_ARGS+=(--speculators "$spec"); done
  PYTHONPATH=$WHEEL "$PYTHON" -W ignore -m specshim.cli snapshot "${SPEC_ARGS[@]}" \
    --out "$SNAPSHOT.partial" >/dev/null 2>"$OUT/snapshot.log" &
  RECORDING=$!
  trap 'kill "$RECORDING" 2>/dev/null' EXIT  # an interrupted watch stops it too
fi

for spec in "${SPECS[@]}"; do
  name=$(basename "$spec")
  text=$OUT/triage-speculators-$name.txt
  log=$OUT/triage-speculators-$name.log
  echo
  echo "specshim triage with speculators $name ($text):"
  PYTHONPATH=$WHEEL:$spec "$PYTHON" -W ignore -m specshim.cli triage --against "$AGAINST" \
    >"$text" 2>"$log"
  status=$?
  cat "$text"
  [ $status -eq 0 ] && continue
  echo "with speculators $name:" >>"$HUMAN"
  if ! grep -q "^adapters on this installation:" "$text"; then
    echo "  triage did not finish ($log): $(tail -1 "$log")" >>"$HUMAN"
    continue
  fi
  # the moved-fact sections that are not empty, adapters out of force (specshim.applier's
  # BROKEN states), a generator that failed to import
  awk '
    /^moved facts (no adapter covers|whose adapter did not decide[^:]*): [1-9]/ { show = 1 }
    /^$/ { show = 0 }
    show { print "  " $0 }
    /^adapters on this installation:/ { table = 1; next }
    table && /^  [a-z0-9_]+ +(unknown shape|failed|rolled back) / { print "  adapter" $0 }
    /^importing speculators. generator failed/ { print "  " $0 }
  ' "$text" >>"$HUMAN"
done

if [ -n "$RECORDING" ]; then
  wait "$RECORDING"
  recorded=$?
  trap - EXIT
  if [ $recorded -eq 0 ]; then
    mv "$SNAPSHOT.partial" "$SNAPSHOT"
    echo "$SNAPSHOT: recorded"
  else
    rm -f "$SNAPSHOT.partial"
    echo "the snapshot failed ($OUT/snapshot.log): $(tail -1 "$OUT/snapshot.log")" >>"$HUMAN"
  fi
fi
echo
if [ ! -s "$HUMAN" ]; then
  echo "vllm $VERSION against $AGAINST: every moved fact is covered and every adapter decided"
  exit 0
fi
echo "vllm $VERSION against $AGAINST needs a human ($HUMAN):"
cat "$HUMAN"
exit 1
