"""Follow every ``execute_model`` that returns ``None`` with ``sample_tokens`` (vLLM 0.11.1+).

vLLM split one step in two: ``execute_model`` runs the forward pass and returns ``None``, and
``sample_tokens(grammar_output)`` must come next; a second ``execute_model`` without it raises
``RuntimeError: State error: sample_tokens() must be called after execute_model() returns
None``. speculators 0.3.0 never calls ``sample_tokens``; 0.4.x calls it with the model output
(``None``) where the grammar output belongs. Here ``execute_model`` samples at once, with a
grammar output of ``None`` (extraction requests carry no structured-output constraint, which
is what ``Scheduler.get_grammar_bitmask`` would say), and the generator's own later
``sample_tokens`` call receives that result instead of sampling a second time.

Only Model Runner V1 checks the pairing. V2 (CUDA vLLM's default from 0.2x, the only runner
in 0.34) keeps the pending step in ``execute_model_state`` and overwrites it on the next
``execute_model``; since the generator aborts every request after its single step, skipping
the sampling changes no hidden state (measured on the H200, CUDA vLLM 0.26.0: without this
adapter V1 raises, V2 matches transformers; tests/gpu). The runner is chosen inside the
worker, after this probe decides, so the adapter applies for both: on V2 it costs one
sampling of one token per request and keeps the runner's state machine as upstream intends.
"""

from __future__ import annotations

from typing import Any

from specshim.adapters.executor.extraction_executor import NAME as SEAM
from specshim.adapters.executor.extraction_executor import installed_executor_class
from specshim.adapters.kit import module, source, wrap
from specshim.adapters.model import Adapter, LeftOut, Patch, Probe, facts, needed, not_needed
from specshim.adapters.targets import EXECUTOR, GENERATOR, generator_class

_PENDING = "_specshim_sampled_output"


def probe() -> Probe:
    executor = vars(module(GENERATOR))["MultiprocExecutor"]
    if not hasattr(executor, "sample_tokens"):
        return not_needed("execute_model still samples (vLLM before 0.11.1)")
    if "sample_tokens" in source(generator_class().generate):
        # 0.4 passes execute_model's result, which is None on the extraction path: the
        # grammar output it stands for is None too.
        return not_needed("the generator calls sample_tokens after execute_model")
    return needed(
        "execute_model returns None and sample_tokens(grammar_output) must follow "
        "(Model Runner V1 raises without it; V2 tolerates the skip)"
    )


def _execute(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    output = wrapped(*args, **kwargs)
    if output is None:
        output = super(installed_executor_class(), instance).sample_tokens(None)
        setattr(instance, _PENDING, output)
    return output


def _sample(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if hasattr(instance, _PENDING):
        return instance.__dict__.pop(_PENDING)
    return wrapped(*args, **kwargs)


def patches() -> list[Patch]:
    executor = installed_executor_class()
    return [wrap(executor, "execute_model", _execute), wrap(executor, "sample_tokens", _sample)]


#: What the generator raises without this adapter, wherever ``left_out`` lists.
WITHOUT = LeftOut(
    "0.3.0",
    raises="RuntimeError",
    text="sample_tokens() must be called after execute_model() returns None",
)


ADAPTER = Adapter(
    name="sample_tokens_split",
    targets=(
        "SpecshimExtractionExecutor.execute_model",
        "SpecshimExtractionExecutor.sample_tokens",
    ),
    waits_for=(GENERATOR,),
    requires=(SEAM,),
    why="vLLM 0.11.1 split execute_model and sample_tokens; the generator calls them wrongly",
    upstream="vllm-project/vllm#26866 (async scheduling + structured outputs)",
    remove_when="speculators' generator is no longer used (0.5+)",
    left_out=(
        WITHOUT,
        WITHOUT.also(vllm="0.11.1.post2"),
        WITHOUT.also(accelerator="gpu"),
        LeftOut(
            "0.3.0",
            harmless="V2's execute_model overwrites its pending state instead of checking it, "
            "and the generator aborts every request after its one step: the sampling it skips "
            "changes nothing",
            runner="v2",
            accelerator="gpu",
        ),
    ),
    facts=facts("exists", f"{EXECUTOR}.sample_tokens"),
    probe=probe,
    patches=patches,
)
