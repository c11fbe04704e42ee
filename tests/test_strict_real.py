"""An upstream shape no adapter knows, met by the real vLLM and speculators 0.3.0's generator.

The change is simulated live (``upstream_changes.rename_rpc_reply_rank``: collective_rpc's
``unique_reply_rank`` renamed) in a fresh process, in the documented order: ``apply()``, then
speculators' generator imported, so the adapters meet it inside the post-import hook.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import speculators_path
from specshim import applier

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

TESTS = Path(__file__).resolve().parent
GENERATOR_ADAPTERS = ("kv_cache_config", "request_eos_token_id", "request_batching")

#: apply() in strict mode, then import the generator twice; then the same without strict.
STRICT_THEN_NOT = """
import json, sys, warnings
import specshim, upstream_changes
upstream_changes.rename_rpc_reply_rank()

def import_generator():
    try:
        import speculators.data_generation.vllm_hidden_states_generator
    except specshim.AdapterError as exc:
        return [exc.adapter, str(exc)]

def states():
    report = specshim.status()
    return report.ok, {a.name: [a.state.value, a.reason] for a in report.adapters}

seen = {}
specshim.apply()  # SPECSHIM_STRICT=1 in the environment
seen["first"], seen["second"] = import_generator(), import_generator()
seen["strict_ok"], seen["strict"] = states()
specshim.revert()
specshim.apply(strict=False)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    seen["lenient_import"] = import_generator()
seen["warned"] = [str(w.message) for w in caught if w.category.__name__ == "ShapeWarning"]
seen["lenient_ok"], seen["lenient"] = states()
print(json.dumps(seen))
"""


def run(code: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``code`` (Python) in a fresh process that sees speculators 0.3.0 and this folder."""
    path = os.pathsep.join([str(TESTS), str(speculators_path("0.3.0"))])
    environ = {**os.environ, "PYTHONPATH": path, **env}
    environ.pop(applier.APPLY_ENV, None)
    command = [sys.executable, "-c", code, *args]
    return subprocess.run(command, env=environ, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def seen() -> dict:
    result = run(STRICT_THEN_NOT, SPECSHIM_STRICT="1")
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_strict_fails_the_import_naming_adapter_expected_and_found(seen: dict) -> None:
    adapter, message = seen["first"]
    assert adapter == "rpc_reply_shape"
    assert "expected MultiprocExecutor.collective_rpc(..., unique_reply_rank=)" in message
    assert "found collective_rpc(" in message and "'reply_rank'" in message
    assert seen["second"] == seen["first"], "a second import must meet the same check"


def test_strict_failure_shows_the_cause_and_what_was_rolled_back(seen: dict) -> None:
    states = seen["strict"]
    assert states["rpc_reply_shape"][0] == "unknown shape"
    for name in GENERATOR_ADAPTERS:
        state, reason = states[name]
        assert state == "rolled back" and "'rpc_reply_shape'" in reason, (name, states[name])
    assert states["transformers_annotations"][0] == "applied"  # another group: untouched
    assert seen["strict_ok"] is False


def test_without_strict_the_import_warns_and_status_is_not_ok(seen: dict) -> None:
    assert seen["lenient_import"] is None
    assert any("'rpc_reply_shape' expected" in w for w in seen["warned"]), seen["warned"]
    states = seen["lenient"]
    assert states["rpc_reply_shape"][0] == "unknown shape"
    assert all(states[name][0] == "applied" for name in GENERATOR_ADAPTERS), states
    assert seen["lenient_ok"] is False


def test_report_without_strict_shows_the_unknown_shape_and_exits_1() -> None:
    code = "import sys, upstream_changes; upstream_changes.rename_rpc_reply_rank()\n"
    code += "from specshim import cli; sys.exit(cli.main(['report']))"
    result = run(code)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "rpc_reply_shape" in result.stdout and "unknown shape" in result.stdout
    assert "not in force: " in result.stdout
