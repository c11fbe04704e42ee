"""vLLM 0.34.0 (no CPU build) taken as far as this machine allows: importing speculators.

Its wheel's Python sources run beside the test bed's torch (``scripts/unpack_vllm.sh``), so
probes are real and speculators' generator module really imports; extraction itself cannot
run without a GPU build, and compat_matrix.yaml records the level reached.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import ROOT, SPECULATORS, speculators_path, unpacked_vllm, vllm_python

GENERATOR = "speculators.data_generation.vllm_hidden_states_generator"
IMPORT_GENERATOR = f"""
import json, sys, warnings
warnings.simplefilter("ignore")
if sys.argv[1] == "vllm-first":  # as `specshim triage` does: vLLM's module already loaded
    import vllm.v1.core.kv_cache_utils
import specshim
specshim.apply(exclude=sys.argv[2:])
try:
    import {GENERATOR}
    error = None
except ImportError as exc:
    error = f"{{type(exc).__name__}}: {{exc}}"
states = {{a.name: a.state.value for a in specshim.status().adapters}}
print(json.dumps({{"error": error, "states": states}}))
"""


def import_generator(speculators: str, order: str, *exclude: str) -> dict:
    path = f"{unpacked_vllm('0.34.0')}{os.pathsep}{speculators_path(speculators)}"
    env = {**os.environ, "PYTHONPATH": path}
    env.pop("SPECSHIM_APPLY", None)
    cmd = [str(vllm_python("0.32.0")), "-c", IMPORT_GENERATOR, order, *exclude]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.vllm
@pytest.mark.parametrize("order", ["specshim-first", "vllm-first"])
@pytest.mark.parametrize("speculators", SPECULATORS)
def test_generator_imports_on_0_34_once_the_planner_names_resolve(
    speculators: str, order: str
) -> None:
    patched = import_generator(speculators, order)
    assert patched["error"] is None
    assert patched["states"]["kv_cache_planner_moved"] == "applied"
    assert patched["states"]["extensible_kv_cache_off"] == "applied"
    assert patched["states"]["kv_cache_layout"] == "applied"

    without = import_generator(speculators, order, "kv_cache_planner_moved")
    assert without["error"] is not None
    assert "cannot import name" in without["error"]
    assert "vllm.v1.core.kv_cache_utils" in without["error"]
