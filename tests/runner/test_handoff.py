"""The hand-offs keep the reply's shape for both speculators releases.

The replies here are built by hand in the shapes the two workers return (speculators 0.3.0:
a list of per-layer tensors; 0.4.x: a dict of request id to that list). The shared-memory
buffer is pickled and unpickled in this process; tests/e2e/test_extraction.py runs it between
vLLM's real CPU worker and the generator, tests/gpu both hand-offs on the H200.
"""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from specshim.runner import handoff


def handles(reply: object) -> object:
    """The tensors inside ``reply``, unwrapped, in the same shape."""
    if isinstance(reply, list):
        return [h.tensor for h in reply]
    assert isinstance(reply, dict)
    return {key: handles(layers) for key, layers in reply.items()}


def test_a_list_of_layers_stays_a_list_of_layers() -> None:
    layers = [torch.ones(3, 4), torch.zeros(3, 4)]
    shared = handoff.shareable(layers)
    assert all(isinstance(h, handoff._SharedCudaTensor) for h in shared)
    assert handles(shared) == layers


def test_a_dict_by_request_keeps_its_keys_and_layers() -> None:
    """speculators 0.4.x reads ``reply[req_id]``: wrapping the dict itself would hand it
    the keys as tensors."""
    states = {"req_0_0": [torch.ones(2, 4)], "req_0_1": [torch.zeros(5, 4)]}
    shared = handoff.shareable(states)
    assert set(shared) == set(states)
    assert all(isinstance(h, handoff._SharedCudaTensor) for v in shared.values() for h in v)
    unwrapped = handles(shared)
    assert all(u[0] is s[0] for u, s in zip(unwrapped.values(), states.values(), strict=True))


def test_nothing_captured_stays_none() -> None:
    assert handoff.shareable(None) is None


def test_an_unknown_shape_is_named() -> None:
    with pytest.raises(TypeError, match="found tuple"):
        handoff.shareable((torch.ones(1),))


def test_a_handoff_name_outside_the_choices_is_one_line() -> None:
    expected = "--handoff must be one of auto, rpc, ipc, shm, worker, got 'nccl'"
    with pytest.raises(ValueError, match=expected):
        handoff.choose("nccl")


def test_shared_memory_reply_is_the_same_tensors_and_leaves_no_file(tmp_path) -> None:
    """A 0.4.x-shaped reply of bf16 and float32 tensors (one a non-contiguous view) comes back
    equal from the buffer; the caller's first mapping unlinks the file."""
    buffer = handoff.HostBuffer(tmp_path)
    wide = torch.randn(7, 6)
    states = {
        "req_0_0": [torch.randn(3, 4, dtype=torch.bfloat16), wide[:, ::2]],
        "req_0_1": [torch.randn(5, 4, dtype=torch.bfloat16), torch.randn(0, 3)],
    }
    received = pickle.loads(pickle.dumps(buffer.fill(states)))
    assert set(received) == set(states)
    for got, sent in zip(received.values(), states.values(), strict=True):
        for a, b in zip(got, sent, strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b)
    assert list(tmp_path.iterdir()) == []


def test_shared_memory_buffer_is_reused_then_grown(tmp_path) -> None:
    """A batch that fits reuses the buffer; a larger one gets a new file, and the caller's
    views of it are the new batch."""
    buffer = handoff.HostBuffer(tmp_path)
    pickle.loads(pickle.dumps(buffer.fill([torch.ones(16, 8)])))
    first = (buffer.path, buffer.size)
    pickle.loads(pickle.dumps(buffer.fill([torch.zeros(4, 8)])))
    assert (buffer.path, buffer.size) == first
    big = torch.arange(2**19, dtype=torch.float32).reshape(-1, 64)  # 2 MiB: more than 1 MiB
    [got] = pickle.loads(pickle.dumps(buffer.fill([big])))
    assert buffer.path != first[0] and buffer.size >= big.numel() * 4
    assert torch.equal(got, big)


def test_buffers_of_processes_that_are_gone_are_removed(tmp_path) -> None:
    alive = tmp_path / f"{handoff.BUFFER_PREFIX}{os.getpid()}-0"
    gone = tmp_path / f"{handoff.BUFFER_PREFIX}999999999-0"  # above any pid_max
    for path in (alive, gone):
        path.write_bytes(b"x")
    assert handoff.remove_stale_buffers(tmp_path) == 1
    assert [p.name for p in tmp_path.iterdir()] == [alive.name]


@pytest.mark.parametrize(
    ("kind", "handoff_option", "tensor_parallel_size", "chosen"),
    [
        ("cuda", "auto", 1, "worker"),
        ("cuda", "auto", 8, "rpc"),  # not yet measured under tensor parallelism
        ("cpu", "worker", 1, "worker"),
        ("cuda", "ipc", 8, "ipc"),
        ("cuda", "rpc", 1, "rpc"),
        ("cpu", "auto", 1, "rpc"),
        ("cpu", "rpc", 1, "rpc"),
        ("cpu", "shm", 1, "shm"),
    ],
)
def test_auto_is_the_worker_writing_on_one_cuda_device_only(
    monkeypatch, kind, handoff_option, tensor_parallel_size, chosen
) -> None:
    """The accelerator is faked (``hardware.detect``): the choice, not the device, is tested."""
    from specshim import hardware

    monkeypatch.setattr(
        hardware, "detect", lambda: hardware.Accelerator(kind, "faked", 1, None, None, None)
    )
    assert handoff.choose(handoff_option, tensor_parallel_size) == chosen


def test_the_worker_hand_off_is_not_offered_to_a_generator_user() -> None:
    """It writes extract's files, so what generate returns while it is on holds no states."""
    with pytest.raises(ValueError, match="hand-off must be one of rpc, ipc, shm, got 'worker'"):
        handoff.use(object(), "worker")
