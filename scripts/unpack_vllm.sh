#!/usr/bin/env bash
# Unpack the Python sources of a vLLM wheel that cannot be installed here, for import-level
# checks (probes, snapshots, importing speculators' generator after specshim.apply()).
#
#   scripts/unpack_vllm.sh VERSION [DISTRIBUTION]     e.g. 0.34.0 vllm
#
# vLLM 0.33+ has no CPU build and its CUDA wheel pins a torch and flashinfer that cannot be
# installed or run here; its Python modules still import beside the test bed's torch. The
# compiled extensions are left out. Result: .wheels/<distribution>-<version>/vllm (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=$1
DIST=${2:-vllm}
DEST=".wheels/$DIST-$VERSION"
if [ -d "$DEST/vllm" ]; then echo "$DEST: ready"; exit 0; fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: -d "$TMP" "$DIST==$VERSION"
python3 - "$TMP" "$DEST" <<'PY'
import pathlib, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("*.whl"))
dest = pathlib.Path(sys.argv[2])
partial = dest.with_name(dest.name + ".partial")
with zipfile.ZipFile(wheel) as archive:
    names = archive.namelist()
    members = [m for m in names if (m.startswith("vllm/") or ".dist-info/" in m) and not m.endswith(".so")]
    archive.extractall(partial, members)
partial.rename(dest)
print(f"{dest}: {len(members)} files from {wheel.name}")
PY
