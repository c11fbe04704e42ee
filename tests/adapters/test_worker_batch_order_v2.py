"""worker_batch_order_v2 on forwards without a step: vLLM 0.34 warms up and profiles Model
Runner V2 on a dummy batch through ``execute_model``, never through ``prepare_inputs`` (seen on
CUDA vLLM 0.34.0, where the generator's workers died at start). The dummy forward cannot run
on the CPU test bed, so a fake runner and extension stand in for vLLM's worker objects."""

from __future__ import annotations

from typing import Any

import torch

from specshim.adapters.worker import worker_batch_order_v2 as adapter


class FakeRunner:
    """Model Runner V2's one fact the adapter reads: no ``input_batch``."""


class FakeExtension:
    def __init__(self) -> None:
        self.model_runner = FakeRunner()
        self._current_request_metadata = None
        self._request_metadata: list[Any] = []
        self.stored: list[list[torch.Tensor]] = []

    def store(self, states: list[torch.Tensor]) -> None:
        self.stored.append(states)


def store(extension: FakeExtension, states: list[torch.Tensor]) -> None:
    adapter._store(extension.store, extension, (states,), {})


def test_a_forward_without_a_step_stores_nothing_and_a_step_is_used_once() -> None:
    extension = FakeExtension()
    states = [torch.arange(5.0).unsqueeze(1)]
    store(extension, states)  # warm-up: no step recorded
    assert extension.stored == []
    step = adapter.Step(rows=("b", "a"), tokens=(2, 3), scheduled=("a", "b"))
    setattr(extension.model_runner, adapter.STEP, step)
    store(extension, states)  # a real step: rows put in the scheduler's order
    assert extension.stored[0][0].squeeze(1).tolist() == [2.0, 3.0, 4.0, 0.0, 1.0]
    store(extension, states)  # a dummy forward after it does not reuse that step
    assert len(extension.stored) == 1
