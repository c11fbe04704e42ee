"""The ``worker`` hand-off's CUDA branch on the device itself: the copies to page-locked memory
on a side stream and the checks computed on the GPU beside them (the CPU branch:
tests/runner/test_worker_writer.py; the whole path through vLLM: test_cuda_extraction.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from runner.test_worker_writer import assert_written, expected

from specshim.runner.in_worker.writer import WorkerFiles

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        (float("nan"), "states hold NaN or Inf"),
        (float("inf"), "states hold NaN or Inf"),
        (None, "states are all zero"),
    ],
)
def test_checks_on_the_gpu_refuse_what_the_host_checks_refuse(tmp_path, bad, problem) -> None:
    """Three samples of bf16 states on the GPU, the second one bad in its second layer: the
    first is written bit for bit from page-locked copies, the second refused with the same
    message as on the host, the writing stopped after it."""
    batch = expected(tmp_path, [3, 4, 2])
    layers = [torch.randn(9, 64, device="cuda").to(torch.bfloat16) for _ in range(2)]
    if bad is None:
        layers[1][3:7] = 0
    else:
        layers[1][5, 7] = bad
    writer = WorkerFiles(layers=[4, 8], writers=1)  # one process: the samples are written in order
    writer.expect(batch)
    reply = writer.reply([t.clone() for t in layers])
    assert [(tuple(t.shape), t.device.type) for t in reply] == [((9, 0), "cpu")] * 2
    done = dict(writer.finished(wait=True))
    assert writer.pinned
    assert_written(batch[:1], [[t[:3].cpu() for t in layers]])
    assert done[batch[1].path] == f"line 2 (data_1.pt), layer 8: {problem}; refusing to write them"
    assert not Path(batch[1].path).exists() and not Path(batch[2].path).exists()


def test_keyed_reply_on_the_gpu_is_written_bit_for_bit(tmp_path) -> None:
    """speculators 0.4.x's reply of per-request states on the GPU, twelve requests."""
    batch = expected(tmp_path, [5] * 12)
    states = [[torch.randn(5, 32, device="cuda").to(torch.bfloat16)] for _ in range(12)]
    writer = WorkerFiles(layers=[3])
    writer.expect(batch)
    writer.reply({f"req_2_{i}": s for i, s in enumerate(states)})
    assert all(problem is None for _, problem in writer.finished(wait=True))
    assert_written(batch, [[s[0].cpu()] for s in states])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), 0.0])
def test_largest_magnitudes_on_the_gpu_see_a_bad_value_deep_in_a_large_state(bad) -> None:
    """States of 2M elements, past the first chunk torch's CUDA kernel reduces: a NaN or Inf in
    the last element of a row-slice of a step's states, or a layer all zero, is seen as the
    host's own pass sees it."""
    from specshim.runner.in_worker.checks import largest_magnitudes, state_problem

    step = torch.randn(4096, 1024, device="cuda").to(torch.bfloat16)
    sample = step[2048:]  # a prompt's rows of one step: a view at an offset
    if bad == 0.0:
        sample.zero_()
    else:
        sample[-1, -1] = bad
    batch = [[step[:2048], sample], [step[:7], step[7:9]]]
    found = largest_magnitudes(batch).cpu()
    for row, layers in zip(found, batch, strict=True):
        for largest, state in zip(row, layers, strict=True):
            host = state.cpu()
            assert state_problem(host, host.shape[0], largest) == state_problem(host, host.shape[0])
    assert state_problem(sample.cpu(), 2048) == (
        "states are all zero" if bad == 0.0 else "states hold NaN or Inf"
    )
