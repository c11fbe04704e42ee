"""apply/revert round trips on the real adapters, over the real vLLM and speculators 0.3.0.

Imports vLLM and speculators' generator into the test process (about 10 s), so every probe
reads the installed code and every patch lands on the real targets.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specshim
from conftest import speculators_path
from specshim import applier
from specshim.adapters import registry
from specshim.adapters.executor.extraction_executor import installed_executor_class
from specshim.adapters.targets import GENERATOR, WORKER

pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def consumers() -> Iterator[list[Any]]:
    sys.path.insert(0, str(speculators_path("0.3.0")))
    specshim.apply(only=["transformers_annotations"])
    import importlib

    modules = [importlib.import_module(GENERATOR), importlib.import_module(WORKER)]
    specshim.revert()
    yield modules
    specshim.revert()


def snapshot(modules: list[Any]) -> dict[tuple[str, str], Any]:
    """Every attribute of every object an adapter may patch, by identity."""
    owners = [
        *modules,
        modules[0].VllmHiddenStatesGenerator,
        modules[1].HiddenStatesWorkerExtension,
        installed_executor_class(),
        sys.modules["transformers.configuration_utils"],
    ]
    return {(repr(o), k): v for o in owners for k, v in list(vars(o).items())}


def test_every_adapter_applies_on_this_vllm(consumers) -> None:
    report = specshim.apply()
    try:
        assert report.ok
        assert "rpc_reply_shape" in report.applied and "kv_cache_config" in report.applied
    finally:
        specshim.revert()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(subset=st.sets(st.sampled_from(registry.names())))
def test_apply_then_revert_restores_identity(consumers, subset: set[str]) -> None:
    before = snapshot(consumers)
    specshim.apply(only=sorted(subset))
    specshim.revert()
    after = snapshot(consumers)
    assert after.keys() == before.keys()
    assert all(after[k] is v for k, v in before.items())


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(subset=st.sets(st.sampled_from(registry.names())))
def test_apply_twice_equals_apply_once(consumers, subset: set[str]) -> None:
    try:
        once = specshim.apply(only=sorted(subset))
        state = snapshot(consumers)
        twice = specshim.apply(only=sorted(subset))
        assert not twice.changed
        assert [(a.name, a.state) for a in once.adapters] == [
            (a.name, a.state) for a in twice.adapters
        ]
        assert all(snapshot(consumers)[k] is v for k, v in state.items())
    finally:
        specshim.revert()


def test_excluding_an_applied_adapter_takes_its_patch_off(consumers) -> None:
    """apply() then apply(exclude=[...]): the excluded adapter's patch comes off the real
    executor, and the selection recorded for vLLM's workers says the same."""
    before = snapshot(consumers)
    try:
        specshim.apply()
        assert "collective_rpc" in vars(installed_executor_class())
        report = specshim.apply(exclude=["rpc_reply_shape"])
        assert "rpc_reply_shape" not in report.applied and "kv_cache_config" in report.applied
        assert "collective_rpc" not in vars(installed_executor_class())
        assert json.loads(os.environ[applier.APPLY_ENV])["exclude"] == ["rpc_reply_shape"]
    finally:
        specshim.revert()
    after = snapshot(consumers)
    assert all(after[k] is v for k, v in before.items())
