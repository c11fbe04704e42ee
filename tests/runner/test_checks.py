"""The checks a writer makes before a sample's file is written: the worker's largest
magnitudes, computed for a whole batch at once, refuse exactly what the host's own pass refuses
(on the CPU here; on a GPU: tests/gpu/test_worker_writer_cuda.py)."""

from __future__ import annotations

import pytest
import torch

from specshim.runner.in_worker.checks import largest_magnitudes, sample_problem, state_problem

NAN, INF = float("nan"), float("inf")


def states(kind: str) -> torch.Tensor:
    """A layer's ``[4, 8]`` bf16 states of one kind of content."""
    t = torch.linspace(-3, 2, 32).view(4, 8)
    if kind == "zeros":
        t = torch.zeros(4, 8)
    elif kind == "negative":
        t = -torch.ones(4, 8)
    elif kind in ("nan", "inf", "-inf"):
        t[2, 5] = float(kind)
    elif kind == "nan_and_inf":
        t[0, 0], t[3, 7] = INF, NAN
    return t.to(torch.bfloat16)


KINDS = ["plain", "zeros", "negative", "nan", "inf", "-inf", "nan_and_inf"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_known_largest_magnitude_refuses_what_the_states_own_pass_refuses(kind) -> None:
    state = states(kind)
    (largest,) = largest_magnitudes([[state]])[0]
    assert state_problem(state, 4, largest) == state_problem(state, 4)
    assert state_problem(state, 4) == {
        "plain": None, "negative": None, "zeros": "states are all zero",
    }.get(kind, "states hold NaN or Inf")  # fmt: skip


def test_largest_magnitudes_cover_a_batch_per_sample_and_layer() -> None:
    """Three samples of two layers of different lengths: one value each, in order."""
    batch = [[states("plain"), states("zeros")], [states("nan"), states("negative")],
             [states("-inf")[:3], states("plain")[:1]]]  # fmt: skip
    found = largest_magnitudes(batch)
    assert found.dtype == torch.float32 and tuple(found.shape) == (3, 2)
    assert found[0].tolist() == [3.0, 0.0]
    assert torch.isnan(found[1, 0]) and found[1, 1] == 1
    assert found[2, 0] == INF and found[2, 1] == 3
    where = sample_problem("line 2 (data_1.pt)", [4, 8], batch[1], 4, found[1])
    assert where == "line 2 (data_1.pt), layer 4: states hold NaN or Inf; refusing to write them"
