"""The hand-off option, and the reply's shape kept for both speculators releases.

The replies here are built by hand in the shapes the two workers return (speculators 0.3.0:
a list of per-layer tensors; 0.4.x: a dict of request id to that list).
"""

from __future__ import annotations

import pytest
import torch

from specshim.runner.extraction.backends import generator as handoff
from specshim.runner.in_worker import ring


def test_a_list_of_layers_stays_a_list_of_layers() -> None:
    layers = [torch.ones(3, 4), torch.zeros(3, 4)]
    assert ring.each_tensor(layers, lambda t: t.shape) == [(3, 4), (3, 4)]


def test_a_dict_by_request_keeps_its_keys_and_layers() -> None:
    """speculators 0.4.x reads ``reply[req_id]``: changing the dict itself would hand it
    the keys as tensors."""
    states = {"req_0_0": [torch.ones(2, 4)], "req_0_1": [torch.zeros(5, 4)]}
    changed = ring.each_tensor(states, lambda t: t.shape[0])
    assert changed == {"req_0_0": [2], "req_0_1": [5]}


def test_nothing_captured_stays_none() -> None:
    assert ring.each_tensor(None, lambda t: t) is None


def test_an_unknown_shape_is_named() -> None:
    with pytest.raises(TypeError, match="found tuple"):
        ring.each_tensor((torch.ones(1),), lambda t: t)


@pytest.mark.parametrize("gone", ["nccl", "ipc", "shm"])
def test_a_handoff_name_outside_the_choices_is_one_line(gone: str) -> None:
    expected = f"--handoff must be one of auto, rpc, worker, got '{gone}'"
    with pytest.raises(ValueError, match=expected):
        handoff.choose(gone)


@pytest.mark.parametrize(
    ("kind", "handoff_option", "tensor_parallel_size", "chosen"),
    [
        ("cuda", "auto", 1, "worker"),
        ("cuda", "auto", 8, "rpc"),  # the worker writing is for one device
        ("cpu", "worker", 1, "worker"),
        ("cuda", "rpc", 1, "rpc"),
        ("cpu", "auto", 1, "rpc"),
        ("cpu", "rpc", 1, "rpc"),
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
