"""The CUDA IPC hand-off keeps the reply's shape for both speculators releases.

The replies here are built by hand in the shapes the two workers return (speculators 0.3.0:
a list of per-layer tensors; 0.4.x: a dict of request id to that list), since no CUDA device
is here to pickle an IPC handle; tests/gpu compares the real hand-off with the RPC path.
"""

from __future__ import annotations

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
    with pytest.raises(ValueError, match="--handoff must be one of auto, rpc, ipc, got 'shm'"):
        handoff.choose("shm")


@pytest.mark.parametrize(
    ("kind", "handoff_option", "tensor_parallel_size", "chosen"),
    [
        ("cuda", "auto", 1, "ipc"),
        ("cuda", "auto", 8, "rpc"),  # every rank would share: not yet measured
        ("cuda", "ipc", 8, "ipc"),
        ("cuda", "rpc", 1, "rpc"),
        ("cpu", "auto", 1, "rpc"),
        ("cpu", "rpc", 1, "rpc"),
    ],
)
def test_auto_is_ipc_on_one_cuda_device_only(
    monkeypatch, kind, handoff_option, tensor_parallel_size, chosen
) -> None:
    """The accelerator is faked (``hardware.detect``): the choice, not the device, is tested."""
    from specshim import hardware

    monkeypatch.setattr(
        hardware, "detect", lambda: hardware.Accelerator(kind, "faked", 1, None, None, None)
    )
    assert handoff.choose(handoff_option, tensor_parallel_size) == chosen
